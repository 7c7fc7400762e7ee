"""A real tiny sweep stopped with Ctrl-C mid-grid, then continued with the command it printed: the
continued sweep compares every job of its grid (the one it reused, the one it resumed, the one it
ran), and no report claims a complete grid while a job of it has no run."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pandas as pd
import pytest
from helpers.data import naija_slice
from helpers.runs import interrupted, run_cli
from helpers.store import logged_runs, new_store, sweep_parents
from mlflow.tracking import MlflowClient

from ablate.report import cli
from ablate.tracking.parent import GRID, MOVED

pytestmark = pytest.mark.heavy


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Enough training sentences that the stopped job's second epoch outlasts the Ctrl-C."""
    return naija_slice(tmp_path_factory.mktemp("continue"), "Mid", 500)


def test_a_continued_sweep_reports_every_job_of_its_grid(root, tmp_path, capsys):
    store = new_store(tmp_path)
    first, again = tmp_path / "first", tmp_path / "again"
    grid = [
        "freeze=none,all,first2", "seed=8", "data=ud", "data.treebank=UD_Naija-Mid",
        f"data.root={root}", "model=tiny", "trainer.epochs=2", "trainer.keep_model=false",
        f"tracking.uri={store}",
    ]  # fmt: skip
    # Ctrl-C in job 1 (all), once its first epoch's checkpoint is written: job 2 never starts
    code, console = interrupted(
        ["--multirun", *grid, f"hydra.sweep.dir={first}"], "#1 : ", first / "1" / "trainer"
    )
    assert code != 0 and "Sweep KILLED: 1 FINISHED, 1 KILLED, 1 of its 3 jobs without a run; " in (
        console
    ), console[-3000:]
    (killed,) = [r for r in logged_runs(store) if r.info.status == "KILLED"]
    assert killed.data.params["freeze.name"] == "all"
    (old,) = sweep_parents(store)
    assert json.loads(old.data.tags[GRID]) == {
        "n": 3, "jobs": ["freeze=none", "freeze=all", "freeze=first2"]
    }  # fmt: skip
    # the stopped sweep's own report names the job that never ran, and claims no complete grid
    held = MlflowClient(store).download_artifacts(old.info.run_id, "report/summary.md", tmp_path)
    summary = Path(held).read_text()
    assert "every run found was used" not in summary and "1 missing" in summary
    assert "| job 2 (freeze=first2) |" in summary and "the job did not start" in summary

    # continued with the command it printed, as written (a folder of its own for the test)
    (line,) = [x for x in console.splitlines() if x.startswith("Continue it")]
    command = shlex.split(line.split(": ", 1)[1])
    assert command[:4] == ["python", "-m", "ablate.train", "--multirun"]
    proc = run_cli(*command[3:], f"hydra.sweep.dir={again}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "Sweep FINISHED: 2 FINISHED (1 resumed from an earlier sweep), 1 FINISHED earlier "
        "(reused)." in proc.stdout
    )
    for strategy in ("none", "all", "first2"):  # the sweep's table, on the console
        assert f"| {strategy} |" in proc.stdout

    # the resumed run is the continued sweep's child, as MLflow's UI shows it
    new = next(p for p in sweep_parents(store) if p.info.run_id != old.info.run_id)
    resumed = MlflowClient(store).get_run(killed.info.run_id)
    assert resumed.info.status == "FINISHED" and resumed.data.tags["ablate.resumed"] == "true"
    assert resumed.data.tags["mlflow.parentRunId"] == new.info.run_id
    assert json.loads(resumed.data.tags[MOVED]) == [{"sweep": old.info.run_id, "job": "1"}]
    assert resumed.data.tags["hydra.sweep_dir"] == str(again)
    for strategy in ("none", "all", "first2"):  # its run page's description and metrics
        assert f"| {strategy} |" in new.data.tags["mlflow.note.content"]
        assert f"dev_accuracy/{strategy}" in new.data.metrics

    # make report (the latest sweep): every job of the grid, none missing
    out = tmp_path / "report"
    assert cli.main(["--uri", store, "--out", str(out)]) == 0
    assert "3 runs used" in capsys.readouterr().out
    assert sorted(pd.read_csv(out / "summary.csv").strategy) == ["all", "first2", "none"]
    assert "None: every run found was used." in (out / "summary.md").read_text()

    # the stopped sweep's folder: the job it ran, and where its stopped job went on
    assert cli.main(["--uri", store, "--sweep", str(first), "--out", str(out)]) == 0
    assert "1 runs used" in capsys.readouterr().out
    summary = (out / "summary.md").read_text()
    assert "| job 1 (freeze=all) | UD_Naija-Mid | tiny | all | 8 | MISSING | its run " in summary
    assert f"was resumed by the later sweep in {again}, whose report has it |" in summary
    assert "| job 2 (freeze=first2) |" in summary and "every run found was used" not in summary
