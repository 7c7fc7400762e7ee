"""A finished setting run again (``skip_finished=false``): a second run, as asked, with one line
naming the earlier run it repeats."""

from __future__ import annotations

import logging

from helpers.runs import compose_cfg, fit_here, slice_overrides
from helpers.store import new_store


def test_a_finished_setting_run_again_names_the_run_it_repeats(slice_root, tmp_path, caplog):
    store = new_store(tmp_path)
    given = [
        *slice_overrides(slice_root, store, tmp_path), "trainer.epochs=1",
        "trainer.keep_model=false",
    ]  # fmt: skip

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "already FINISHED" in r.getMessage()]

    with caplog.at_level(logging.INFO, logger="ablate"):
        first, _ = fit_here(compose_cfg(*given))
        assert not said()
        fit_here(compose_cfg(*given, "data.max_train_sentences=60"))  # another setting
        assert not said()
        second, _ = fit_here(compose_cfg(*given))
    (line,) = said()
    assert second != first and f"({first})" in line and "skip_finished=true reuses it" in line
