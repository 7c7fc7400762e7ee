"""A sweep killed outright (SIGKILL: no end of its own, no params on its run): its report lists
the jobs it never ran with the settings they share with the runs it made."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from helpers.data import ROOT
from helpers.runs import slice_overrides
from helpers.store import new_store, sweep_parents

from ablate.report import load_runs


def test_a_sweep_killed_outright_lists_its_missing_jobs_with_their_settings(slice_root, tmp_path):
    store = new_store(tmp_path)
    given = [
        *slice_overrides(slice_root, store, tmp_path), "trainer.epochs=1",
        "trainer.keep_model=false",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate.train", "--multirun", "freeze=none,all,first2", *given],
        cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    for line in proc.stdout:
        if " FINISHED: dev accuracy" in line:  # job 0's run ended: kill the sweep in job 1
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    (sweep,) = sweep_parents(store)
    assert sweep.info.status == "RUNNING" and not sweep.data.params  # it never ended

    found = load_runs("ablate", store, sweep=str(tmp_path / "sweep"))
    missing = [row for row in found.unrun if row["status"] == "MISSING"]
    assert missing and missing[-1]["run_name"] == "job 2 (freeze=first2)"
    for row in missing:  # the grid's data and model, its own strategy and seed
        assert (row["data"], row["model"], row["seed"]) == ("UD_Naija-Slice", "tiny", 42), row
    assert missing[-1]["freeze"] == "first2"
