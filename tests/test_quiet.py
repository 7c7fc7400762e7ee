"""ablate.quiet: libraries quieted for a block, and as they were after it."""

from __future__ import annotations

import logging

from datasets.utils import logging as ds_logging
from transformers.utils import logging as hf_logging

from ablate.quiet import quieted


def test_loggers_and_bars_are_quiet_in_the_block_and_as_they_were_after(caplog):
    noisy = logging.getLogger("ablate.test.noisy")
    noisy.setLevel(logging.INFO)
    ds_logging.enable_progress_bar()
    hf_logging.disable_progress_bar()  # already off: the block leaves it off
    with caplog.at_level(logging.INFO, logger="ablate.test.noisy"):
        with quieted({"ablate.test.noisy": logging.ERROR}, bars=("datasets", "transformers"),
                     terminal_bars=False):  # fmt: skip
            noisy.warning("hidden")
            noisy.error("shown")
            assert not ds_logging.is_progress_bar_enabled()
        noisy.info("after")
    assert [r.getMessage() for r in caplog.records] == ["shown", "after"]
    assert noisy.level == logging.INFO
    assert ds_logging.is_progress_bar_enabled() and not hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
