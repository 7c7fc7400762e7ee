"""The report tests' shared run grid: a real tiny multirun in a temporary MLflow store."""

from __future__ import annotations

from types import SimpleNamespace

from mlflow.tracking import MlflowClient

from helpers.runs import run_cli, slice_overrides
from helpers.store import logged_runs


def make_grid(slice_root, tmp_path_factory) -> SimpleNamespace:
    """A real tiny multirun for the report's tests: 2 strategies x 2 seeds x 2 epochs (tiny
    model, Naija slice), plus one FAILED run."""
    tmp = tmp_path_factory.mktemp("report")
    store = f"sqlite:///{tmp / 'mlflow.db'}"
    overrides = slice_overrides(slice_root, store, tmp)
    # cwd=tmp: MLflow puts a sqlite store's artifacts under ./mlruns of the creating process.
    proc = run_cli("--multirun", "freeze=none,all", "seed=1,2", *overrides, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("ablate")
    # A run that failed in training (errors in the configuration or data leave no run at all):
    # recorded as ablate records one, with the params of the grid's runs.
    sibling = logged_runs(store)[0]
    params = dict(sibling.data.params)
    params.update({"freeze.name": "first2", "freeze.first": "2", "seed": "1"})
    failed = client.create_run(
        exp.experiment_id, run_name="UD_Naija-Slice-first2-tiny-s1",
        tags={"mlflow.parentRunId": sibling.data.tags["mlflow.parentRunId"]},  # one of the sweep's
    ).info  # fmt: skip
    for key, value in params.items():
        client.log_param(failed.run_id, key, value)
    client.set_tag(failed.run_id, "error", "RuntimeError: out of memory (injected)")
    client.set_terminated(failed.run_id, "FAILED")
    runs = logged_runs(store)
    assert sorted(r.info.status for r in runs) == ["FAILED"] + ["FINISHED"] * 4
    return SimpleNamespace(store=store, tmp=tmp, client=client, runs=runs)
