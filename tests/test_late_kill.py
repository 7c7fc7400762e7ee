"""A run killed after its last epoch's checkpoint, as its end began, then resumed: the resumed
process trains nothing, and the run keeps the whole run's training time and FLOPs."""

from __future__ import annotations

import pytest
from helpers.runs import compose_cfg, fit_here, slice_overrides
from helpers.store import logged_runs, new_store
from mlflow.tracking import MlflowClient

from ablate.training import meter


def test_a_run_killed_after_its_last_epoch_keeps_its_time_and_flops(
    slice_root, tmp_path, monkeypatch
):
    store = new_store(tmp_path)
    given = [*slice_overrides(slice_root, store, tmp_path), "trainer.keep_model=false"]
    _, whole = fit_here(compose_cfg(*given))  # the same run, never interrupted
    (reference,) = logged_runs(store)

    count = meter.flop_model

    def ctrl_c(*args, **kwargs):  # Ctrl-C as the run's FLOPs are counted, its epochs all saved
        raise KeyboardInterrupt

    monkeypatch.setattr(meter, "flop_model", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        fit_here(compose_cfg(*given))
    monkeypatch.setattr(meter, "flop_model", count)
    client = MlflowClient(store)
    (killed,) = [r for r in logged_runs(store) if r.info.status == "KILLED"]
    assert "train_flops" not in killed.data.metrics

    run_id, results = fit_here(compose_cfg(*given, "trainer.resume=true"))
    assert run_id == killed.info.run_id
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["ablate.resumed"] == "true"
    m = run.data.metrics
    # its epochs trained in the killed process: their FLOPs, and a time that holds them
    assert m["train_flops"] == pytest.approx(reference.data.metrics["train_flops"], rel=1e-9)
    epochs = client.get_metric_history(run_id, "epoch_time_s")
    assert sorted(e.step for e in epochs) == [1, 2]
    assert m["train_runtime_s"] >= sum(e.value for e in epochs)
    samples = m["train_samples_per_s"] * m["train_runtime_s"]
    assert samples == pytest.approx(whole["train_samples_per_s"] * whole["train_runtime_s"], 0.01)
    assert results["test_accuracy"] == pytest.approx(whole["test_accuracy"])
