"""An lr study imported into a new store (``python -m ablate.archive``) continues there: its new
Optuna storage is seeded from the imported trial runs (lr, range, value, pruned state), so the
same ``python -m ablate.lrstudy`` command trains only the trials that are missing (a real study
exported and imported: tests/test_lrstudy.py, after its pruned trial)."""

from __future__ import annotations

import json

import optuna
import pytest
from helpers.runs import slice_overrides
from helpers.store import logged_runs, new_store
from mlflow import MlflowClient

from ablate.archive.__main__ import main as archive_main
from ablate.lrstudy import CHECK, CHECK_TAG, PRUNED_TAG, RANGE_TAG, TRIAL_TAG
from ablate.lrstudy import cli as study_cli
from ablate.lrstudy import storage as lrstorage
from ablate.lrstudy import study as lrstudy
from ablate.lrstudy.seed import widenings

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
    store = new_store(folder)
    assert archive_main(["import", str(archive), "--uri", store]) == 0
    assert not (folder / "lr_study.db").exists()
    return store


def _by_lr(store: str) -> dict[float, object]:
    return {float(r.data.params["trainer.lr"]): r for r in logged_runs(store, EXPERIMENT)}


def _logged_trial(client: MlflowClient, exp: str, tag: str, lr: float, span, dev: list[float]):
    """A run as a trial of the study logs it: its lr, study, trial and range tags, dev metric
    per epoch, best dev metric; FINISHED."""
    study = tag.rpartition(":")[0].rpartition("-")[0]
    tags = {TRIAL_TAG: tag, RANGE_TAG: json.dumps(span), "study": study}
    run = client.create_run(exp, tags=tags)
    client.log_param(run.info.run_id, "trainer.lr", repr(lr))
    for epoch, value in enumerate(dev, 1):
        client.log_metric(run.info.run_id, "dev_accuracy", value, step=epoch)
    client.log_metric(run.info.run_id, "best_dev_accuracy", max(dev))
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def test_a_widened_study_is_seeded_with_its_widest_range_and_its_widenings(slice_root, tmp_path):
    store = new_store(tmp_path)
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

    # a seeding killed after its first two trials, before the range: the next one finishes it
    cut = optuna.create_study(storage=(url := f"sqlite:///{tmp_path / 'cut.db'}"), study_name=name)
    cut.add_trials(study.trials[:2])
    cfg.lr_study.storage = url
    again = lrstorage.open_study(cfg)
    assert again.user_attrs == {"range": [1e-6, 1e-2], "widened": 2}
    assert [(t.number, t.state, t.params.get("lr")) for t in again.trials] == states
    assert widenings([1e-5, 1e-3], [1e-5, 1e-3]) == 0
    assert widenings([1e-5, 1e-3], [1e-7, 1e-2]) == 3
    assert widenings([1e-5, 1e-3], [1e-5, 5e-3]) is None  # no widening of the study's range


@pytest.mark.heavy
def test_a_pruned_neighbour_of_the_best_trains_again_unpruned_and_is_seeded_so(
    slice_root, tmp_path, capsys
):
    store = new_store(tmp_path)
    args = [*_args(slice_root, store, tmp_path), "lr_study.trials=2"]
    args.remove("lr_study.trials=3")
    cfg = _cfg(args)
    name = lrstorage.study_name(cfg)
    client = MlflowClient(store)
    exp = client.create_experiment(EXPERIMENT)
    # two trials trained out (the best at 3e-3), and one pruned just above the best
    _logged_trial(client, exp, f"{name}:0", 3e-3, [1e-7, 1e-2], [0.9, 0.95])
    _logged_trial(client, exp, f"{name}:1", 1e-4, [1e-7, 1e-2], [0.9, 0.9])
    pruned = _logged_trial(client, exp, f"{name}:2", 5e-3, [1e-7, 1e-2], [0.1])
    client.set_tag(pruned, PRUNED_TAG, "true")
    client.set_terminated(pruned, status="KILLED")

    # the study has its 2 finished trials, but one pruned beside its best: 5e-3 trains again,
    # and out, though the median of the others' first epoch (0.9) would prune it at once
    assert study_cli.main(args) == 0
    said = capsys.readouterr().err
    line = next(x for x in said.splitlines() if x.startswith("study "))
    assert line.endswith("1 pruned beside the best trained again; lr range [1e-07, 0.01]")
    check = _by_lr(store)
    again = [r for r in logged_runs(store, EXPERIMENT) if CHECK_TAG in r.data.tags]
    assert len(again) == 1 and again[0].data.tags[CHECK_TAG] == "2"
    run = again[0]
    assert float(run.data.params["trainer.lr"]) == 5e-3 and run.info.status == "FINISHED"
    assert PRUNED_TAG not in run.data.tags and run.data.metrics["best_dev_accuracy"] < 0.9
    study = lrstorage.open_study(cfg)
    assert [(t.state, t.user_attrs.get(CHECK)) for t in study.trials] == [
        (COMPLETE, None), (COMPLETE, None), (PRUNED, None), (COMPLETE, 2),
    ]  # fmt: skip
    assert lrstudy.target(study, cfg.lr_study) == 3 and not lrstudy.neighbours_to_check(study)

    # a new Optuna storage (an archive's import) is seeded with the check as one: nothing trains
    (tmp_path / "lr_study.db").unlink()
    assert study_cli.main(args) == 0
    assert line in capsys.readouterr().err.splitlines()
    assert _by_lr(store).keys() == check.keys()
    assert lrstorage.open_study(cfg).trials[3].user_attrs[CHECK] == 2
