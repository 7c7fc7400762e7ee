"""ablate's launcher (``hydra/launcher=workers``): the sweep imports the training stack once and
forks its workers from itself; every job runs in one of them, with the numbers of a job run in
the sweep's own process, and a worker that dies ends the sweep and its other jobs (real tiny
sweeps)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from helpers.data import ROOT, naija_slice
from helpers.runs import run_cli, slice_overrides
from helpers.store import logged, logged_runs, new_store, sweep_parents
from omegaconf import OmegaConf

from ablate import workers


def test_a_sweeps_jobs_run_in_workers_forked_from_the_preloaded_sweep(
    slice_root, store, tmp_path, report_grid
):
    proc = run_cli(
        "--multirun", "hydra/launcher=workers", "hydra.launcher.n_jobs=2", "freeze=none,all",
        "seed=1,2", *slice_overrides(slice_root, store, tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = (proc.stdout + proc.stderr).count("workers: n_jobs=2")
    assert said == 1, said  # the plan, said once as the sweep starts (not at each batch)
    records = workers.preloaded(tmp_path / "sweep")
    # two workers, each the sweep's own child, started with the training stack already imported
    assert len(records) == 2 and len({r["pid"] for r in records}) == 2, records
    for record in records:
        assert record["parent"] == record["sweep"] != record["pid"]
        assert record["modules"] == list(workers.PRELOAD) and record["seconds"] > 0
        assert set(workers.PRELOAD) <= set(record["loaded"])
        assert record["wait_policy"]  # set before torch loaded, as a job sets it
    # every job of the sweep ran in one of them, each job once
    assert sorted(job for r in records for job in r["jobs"]) == [0, 1, 2, 3]
    runs = logged_runs(store)
    assert len(runs) == 4 and {r.info.status for r in runs} == {"FINISHED"}
    # a job's OpenMP wait policy is the sweep's, set before it loaded torch
    info = logged(store, runs[0].info.run_id, tmp_path / "info", "run.json")
    assert info["environment"]["omp_wait_policy"] == records[0]["wait_policy"]

    # the same numbers as the report grid's runs, the same jobs run one after another in its
    # sweep's own process (all but the times and what the machine did meanwhile)
    def scores(found):
        machine = ("_s", "load_per_cpu", "busy_cpus_at_start", "peak_rss_mb")
        return {
            (r.data.params["freeze.name"], r.data.params["seed"]): {
                k: v
                for k, v in r.data.metrics.items()
                if not k.endswith(machine) and not k.startswith("system/")
            }
            for r in found
            if r.info.status == "FINISHED"
        }

    same = scores(runs)
    assert same == scores(report_grid.runs) and len(same) == 4
    assert all(
        {"train_loss", "dev_accuracy", "test_accuracy", "train_flops"} <= set(m)
        for m in same.values()
    )
    (parent,) = sweep_parents(store)
    assert parent.info.status == "FINISHED"
    assert "report/accuracy.png" in {a.path for a in _artifacts(store, parent.info.run_id)}


def test_a_new_sqlite_store_is_made_by_a_process_of_its_own_while_the_sweep_imports(tmp_path):
    from mlflow.tracking import MlflowClient

    from ablate.tracking.store import EXPERIMENT_KIND, schema_lock

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"  # not made yet
    tracking = OmegaConf.create({"uri": store, "experiment": "early"})
    maker = workers.new_store(tracking)
    assert maker is not None and maker.pid != os.getpid()
    maker.join(timeout=300)
    assert maker.exitcode == 0
    with schema_lock(store):
        made = MlflowClient(store).get_experiment_by_name("early")
    assert made is not None and EXPERIMENT_KIND in made.tags
    # made without a disk sync per migration: a whole database all the same
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert workers.new_store(tracking) is None  # there now: nothing to make
    assert (
        workers.new_store(OmegaConf.create({"uri": "http://127.0.0.1:9", "experiment": "x"}))
        is None
    )


def _artifacts(store: str, run_id: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    return [f for d in client.list_artifacts(run_id) for f in client.list_artifacts(run_id, d.path)]


@pytest.fixture(scope="module")
def long_root(tmp_path_factory):
    """Enough training sentences that a job lasts past a poll."""
    return naija_slice(tmp_path_factory.mktemp("workers"), "Long", 1500)


def test_a_killed_worker_ends_the_sweep_and_its_other_job(long_root, tmp_path):
    store = new_store(tmp_path)
    sweep = tmp_path / "sweep"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate.train", "--multirun", "hydra/launcher=workers",
         "hydra.launcher.n_jobs=2", "freeze=none,all,first2", "data=ud",
         "data.treebank=UD_Naija-Long", f"data.root={long_root}", "model=tiny",
         "trainer.epochs=20", f"tracking.uri={store}", f"hydra.sweep.dir={sweep}"],
        cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not all(list(sweep.glob(f"{job}/trainer/checkpoint-*")) for job in (0, 1)):
        assert time.monotonic() < deadline and proc.poll() is None, "no job trained"
        time.sleep(0.1)
    (first,) = [r["pid"] for r in workers.preloaded(sweep) if 0 in r["jobs"]]
    os.kill(first, signal.SIGKILL)  # what the kernel's OOM killer does
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out[-3000:]
    assert "BrokenProcessPool" in out
    runs = {r.data.params["freeze.name"]: r for r in logged_runs(store)}
    assert sorted(runs) == ["all", "none"]  # no third job started
    # the other worker was stopped, and its run closed KILLED; the killed one's stays RUNNING
    assert runs["all"].info.status == "KILLED"
    assert runs["none"].info.status == "RUNNING"
    (parent,) = sweep_parents(store)
    assert parent.info.status in ("FAILED", "KILLED")


def test_other_launchers_and_a_single_worker_are_left_as_they_are(tmp_path):
    def config(launcher: dict):
        return OmegaConf.create(
            {"hydra": {"launcher": launcher, "sweep": {"dir": str(tmp_path)}},
             "trainer": {"omp_wait_policy": "auto"}}
        )  # fmt: skip

    basic = {"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}
    joblib = {"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
              "n_jobs": 2}  # fmt: skip
    assert workers.start(config(basic)) is False
    assert workers.start(config(joblib)) is False  # Hydra's own: its workers import themselves
    one = {"_target_": workers.LAUNCHER, "n_jobs": 1}
    assert workers.start(config(one)) is False  # one job at a time: they run in the sweep
    assert not (tmp_path / workers.FOLDER).exists()
    assert workers.count(OmegaConf.create({"_target_": workers.LAUNCHER, "n_jobs": 3})) == 3
