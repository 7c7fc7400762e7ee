"""An lr study that fails ends naming where to read why: its trial's job log."""

from __future__ import annotations

from helpers.runs import slice_overrides
from helpers.store import new_store

from ablate.lrstudy import cli as study_cli


def test_a_failed_study_names_its_trials_job_log(slice_root, tmp_path, capsys):
    store = new_store(tmp_path)
    gone = tmp_path / "no-model"
    given = [
        *slice_overrides(slice_root, store, tmp_path), "trainer.epochs=1", "freeze=bitfit",
        "lr_study.trials=1", f"model.name_or_path={gone}",
    ]  # fmt: skip
    assert study_cli.main(given) == 1
    last = capsys.readouterr().err.splitlines()[-1]
    log = tmp_path / "sweep" / "bitfit" / "0" / "train.log"
    assert last == f"error: the study of bitfit failed: see its job log {log}"
    assert str(gone) in log.read_text()  # why its trial failed
