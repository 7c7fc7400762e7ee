"""A joblib sweep's workers import the training stack once, before their first job, while the
sweep prepares its store; every job then runs in one of them (a real tiny sweep)."""

from __future__ import annotations

from helpers.runs import run_cli, slice_overrides
from helpers.store import logged_runs, sweep_parents
from omegaconf import OmegaConf

from ablate import workers


def test_a_joblib_sweeps_jobs_run_in_the_workers_that_preloaded_torch(slice_root, store, tmp_path):
    proc = run_cli(
        "--multirun", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "freeze=none,all,first2",
        *slice_overrides(slice_root, store, tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "without preloading" not in proc.stderr
    records = workers.preloaded(tmp_path / "sweep")
    # one record per worker, each written after its imports: two processes, torch in each once
    assert len(records) == 2 and len({r["pid"] for r in records}) == 2, records
    for record in records:
        assert record["modules"] == list(workers.PRELOAD) and record["seconds"] > 0
        assert record["wait_policy"]  # set before torch loaded, as a job sets it
    # every job of the sweep ran in one of those preloaded processes, each job once
    ran = sorted(job for r in records for job in r["jobs"])
    assert ran == [0, 1, 2]
    runs = logged_runs(store)
    assert len(runs) == 3 and {r.info.status for r in runs} == {"FINISHED"}
    (parent,) = sweep_parents(store)
    assert parent.info.status == "FINISHED"
    assert "report/accuracy.png" in {a.path for a in _artifacts(store, parent.info.run_id)}


def _artifacts(store: str, run_id: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    return [f for d in client.list_artifacts(run_id) for f in client.list_artifacts(run_id, d.path)]


def test_other_launchers_and_a_single_joblib_worker_are_left_as_they_are(tmp_path):
    def config(launcher: dict):
        return OmegaConf.create(
            {"hydra": {"launcher": launcher, "sweep": {"dir": str(tmp_path)}},
             "trainer": {"omp_wait_policy": "auto"}}
        )  # fmt: skip

    basic = {"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}
    assert workers.warm(config(basic)) is False
    joblib_one = {
        "_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
        "n_jobs": 1, "backend": None, "prefer": "processes", "require": None, "verbose": 0,
        "timeout": None, "pre_dispatch": "2*n_jobs", "batch_size": "auto", "temp_folder": None,
        "max_nbytes": None, "mmap_mode": "r",
    }  # fmt: skip
    assert workers.warm(config(joblib_one)) is False  # one job at a time: no worker to start
    assert not (tmp_path / workers.FOLDER).exists()
