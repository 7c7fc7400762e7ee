"""An lr study imported into a new store (``python -m ablate.archive``) continues there: its new
Optuna storage is seeded from the imported trial runs (lr, range, value, pruned state), so the
same ``python -m ablate.lrstudy`` command trains only the trials that are missing."""

from __future__ import annotations

import json
import logging
import time

import optuna
import pytest
from helpers.runs import slice_overrides
from helpers.store import logged_runs
from mlflow import MlflowClient

from ablate.archive.__main__ import main as archive_main
from ablate.lrstudy import PRUNED_TAG, RANGE_TAG, TRIAL_TAG
from ablate.lrstudy import cli as study_cli
from ablate.lrstudy import storage as lrstorage
from ablate.lrstudy.runs import best
from ablate.lrstudy.seed import widenings
from ablate.lrstudy.study import summary

EXPERIMENT = "t-lr-seed"
COMPLETE, PRUNED, FAIL = (optuna.trial.TrialState[s] for s in ("COMPLETE", "PRUNED", "FAIL"))


def _args(slice_root, store: str, folder) -> list[str]:
    return [
        *slice_overrides(slice_root, store, folder), "freeze=bitfit", "lr_study.trials=3",
        "lr_study.prune_from_epoch=1", "lr_study.range=[1e-7,1e-2]", "lr_study.widen=0",
        f"lr_study.experiment={EXPERIMENT}",
    ]  # fmt: skip


def _cfg(args: list[str]):
    return study_cli.compose_trial("bitfit", study_cli.for_studies(args)[1])


def _imported(archive, folder) -> str:
    """A new sqlite store in ``folder`` (so a new Optuna storage beside it) holding ``archive``."""
    store = f"sqlite:///{folder / 'mlflow.db'}"
    assert archive_main(["import", str(archive), "--uri", store]) == 0
    assert not (folder / "lr_study.db").exists()
    return store


def _by_lr(store: str) -> dict[float, object]:
    return {float(r.data.params["trainer.lr"]): r for r in logged_runs(store, EXPERIMENT)}


@pytest.mark.heavy
def test_an_imported_study_trains_again_only_the_trials_it_lacks(
    slice_root, tmp_path, capsys, caplog
):
    # a real study: three trials, the last pruned after its first epoch
    original = f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}"
    args = _args(slice_root, original, tmp_path / "a")
    study = lrstorage.open_study(_cfg(args))
    for lr in (3e-3, 1e-3, 1e-7):
        study.enqueue_trial({"lr": lr})
    assert study_cli.main(args) == 0
    said = capsys.readouterr().err
    line = next(x for x in said.splitlines() if x.startswith("study "))
    assert ": 3 trials, 1 pruned, 1 of 6 epochs saved" in line
    archive = tmp_path / "archive"
    assert archive_main(["export", "--uri", original, "--experiment", EXPERIMENT, "--all",
                         str(archive)]) == 0  # fmt: skip

    # imported elsewhere, the same command trains nothing and reports the same study
    store = _imported(archive, tmp_path / "b")
    args_b = _args(slice_root, store, tmp_path / "b")
    runs = _by_lr(store)
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="ablate"):
        assert study_cli.main(args_b) == 0
    took = time.monotonic() - started
    out = capsys.readouterr()
    after = {r.info.run_id for r in logged_runs(store, EXPERIMENT)}
    assert after == {r.info.run_id for r in runs.values()} and runs.keys() == {3e-3, 1e-3, 1e-7}
    assert line in out.err.splitlines(), (out.err[-3000:], took)
    seeded_line = "seeded 3 trials (1 pruned) from the tracking store's runs; range [1e-07, 0.01]"
    assert any(seeded_line in r.getMessage() for r in caplog.records)
    cfg = _cfg(args_b)
    assert best(study_cli.study_of(cfg)).lr == best(study_cli.study_of(_cfg(args))).lr
    there, here = (lrstorage.open_study(c) for c in (_cfg(args), cfg))
    assert summary(here, cfg.trainer) == summary(there, cfg.trainer)  # best lr, counts, range
    seeded = here.trials
    name = lrstorage.study_name(cfg)
    assert [(t.number, t.state, t.params["lr"]) for t in seeded] == [
        (0, COMPLETE, 3e-3), (1, COMPLETE, 1e-3), (2, PRUNED, 1e-7),
    ]  # fmt: skip
    for t in seeded:  # each its run's trial: value, per-epoch dev metric, epochs, range
        run = runs[t.params["lr"]]
        assert run.data.tags[TRIAL_TAG] == f"{name}:{t.number}"
        assert t.user_attrs["seeded_from_run"] == run.info.run_id
        history = MlflowClient(store).get_metric_history(run.info.run_id, "dev_accuracy")
        assert t.intermediate_values == {m.step: m.value for m in history}
        assert t.distributions["lr"].low == 1e-7 and t.distributions["lr"].high == 1e-2
    assert seeded[0].value == runs[3e-3].data.metrics["best_dev_accuracy"]
    assert seeded[2].user_attrs["epochs"] == 1 and list(seeded[2].intermediate_values) == [1]
    assert seeded[0].user_attrs["epochs"] == 2

    # a trial whose run failed (a study cut short): one trial trains, numbered after the rest
    store = _imported(archive, tmp_path / "c")
    failed = _by_lr(store)[1e-3]
    MlflowClient(store).set_terminated(failed.info.run_id, status="FAILED")
    args_c = _args(slice_root, store, tmp_path / "c")
    assert study_cli.main(args_c) == 0
    # not pruned: the median pruner waits for 2 complete trials, and one is
    assert ": 3 trials, 1 pruned" in capsys.readouterr().err
    trials = lrstorage.open_study(_cfg(args_c)).trials
    assert [(t.number, t.state) for t in trials[:3]] == [(0, COMPLETE), (1, FAIL), (2, PRUNED)]
    assert len(trials) == 4 and trials[3].state == COMPLETE
    assert len(logged_runs(store, EXPERIMENT)) == 4  # the three imported, one new
    tagged = [r for r in logged_runs(store, EXPERIMENT) if r.data.tags[TRIAL_TAG].endswith(":3")]
    assert len(tagged) == 1 and float(tagged[0].data.params["trainer.lr"]) == trials[3].params["lr"]
    assert MlflowClient(store).get_run(failed.info.run_id).info.status == "FAILED"


def _logged_trial(client: MlflowClient, exp: str, tag: str, lr: float, span, dev: list[float]):
    """A run as a trial of the study logs it: its lr, trial and range tags, dev metric per
    epoch, best dev metric; FINISHED."""
    run = client.create_run(exp, tags={TRIAL_TAG: tag, RANGE_TAG: json.dumps(span)})
    client.log_param(run.info.run_id, "trainer.lr", repr(lr))
    for epoch, value in enumerate(dev, 1):
        client.log_metric(run.info.run_id, "dev_accuracy", value, step=epoch)
    client.log_metric(run.info.run_id, "best_dev_accuracy", max(dev))
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def test_a_widened_study_is_seeded_with_its_widest_range_and_its_widenings(slice_root, tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = _cfg([*_args(slice_root, store, tmp_path), "lr_study.range=[1e-5,1e-3]"])
    name = lrstorage.study_name(cfg)
    client = MlflowClient(store)
    exp = client.create_experiment(EXPERIMENT)
    _logged_trial(client, exp, f"{name}:0", 9e-4, [1e-5, 1e-3], [0.5, 0.6])
    _logged_trial(client, exp, f"{name}:1", 8e-3, [1e-5, 1e-2], [0.6, 0.7])
    _logged_trial(client, exp, f"{name}:3", 5e-6, [1e-6, 1e-2], [0.4, 0.45])
    _logged_trial(client, exp, f"other-{name}:2", 1e-4, [1e-5, 1e-3], [0.9, 0.9])  # not its
    pruned = _logged_trial(client, exp, f"{name}:4", 2e-3, [1e-5, 1e-2], [0.1])
    client.set_tag(pruned, PRUNED_TAG, "true")
    client.set_terminated(pruned, status="KILLED")
    client.set_terminated(_logged_trial(client, exp, f"{name}:5", 1e-4, [1e-6, 1e-2], [0.8]),
                          status="FAILED")  # fmt: skip
    study = lrstorage.open_study(cfg)
    assert study.user_attrs == {"range": [1e-6, 1e-2], "widened": 2}
    states = [(t.number, t.state, t.params.get("lr")) for t in study.trials]
    assert states == [
        (0, COMPLETE, 9e-4), (1, COMPLETE, 8e-3), (2, FAIL, None), (3, COMPLETE, 5e-6),
        (4, PRUNED, 2e-3),
    ]  # fmt: skip
    assert study.trials[1].distributions["lr"].high == 1e-2  # the range each was drawn from
    assert study.trials[3].distributions["lr"].low == 1e-6
    assert study.trials[1].value == 0.7 and study.trials[4].intermediate_values == {1: 0.1}
    # opened again (another worker): seeded once
    assert len(lrstorage.open_study(cfg).trials) == 5
    assert widenings([1e-5, 1e-3], [1e-5, 1e-3]) == 0
    assert widenings([1e-5, 1e-3], [1e-7, 1e-2]) == 3
    assert widenings([1e-5, 1e-3], [1e-5, 5e-3]) is None  # no widening of the study's range
