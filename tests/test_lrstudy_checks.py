"""An lr study counts only trials trained out, and checks its pick against them: a pruned trial
next to the best (no finished trial between) trains again unpruned. The case that asked for it is
the published pruning ablation's `head_only` study on Naija (docs/results/naija-fair/pruning/):
median pruning after epoch 2 cut the high lrs that, trained out, scored best."""

from __future__ import annotations

import optuna
import pytest
from helpers.data import ROOT

from ablate import archive
from ablate.config import LrStudyConfig
from ablate.lrstudy import CHECK, TRIAL_TAG
from ablate.lrstudy import study as lrstudy

PRUNING = ROOT / "docs" / "results" / "naija-fair" / "pruning"
LR = optuna.distributions.FloatDistribution(1e-5, 1.0, log=True)


def _head_only(kind: str) -> list[tuple[float, dict[int, float], float, bool]]:
    """(lr, dev accuracy per epoch, best dev accuracy, pruned) of each `head_only` trial of the
    pruning ablation's study with pruner ``kind``, by trial number."""
    trials = []
    for run in archive.read(PRUNING / kind).runs:
        if run.params.get("freeze.name") != "head_only" or TRIAL_TAG not in run.tags:
            continue
        dev = {step: v for key, step, _, v in run.metrics if key == "dev_accuracy"}
        (best,) = [v for key, _, _, v in run.metrics if key == "best_dev_accuracy"]
        number = int(run.tags[TRIAL_TAG].rpartition(":")[2])
        pruned = run.tags.get("ablate.pruned") == "true"
        trials.append((number, float(run.params["trainer.lr"]), dev, best, pruned))
    return [t[1:] for t in sorted(trials)]


def _add(study: optuna.Study, lr: float, dev: dict[int, float], best: float, pruned: bool, **attrs):
    state = optuna.trial.TrialState.PRUNED if pruned else optuna.trial.TrialState.COMPLETE
    study.add_trial(optuna.trial.create_trial(
        state=state, value=None if pruned else best, params={"lr": lr}, distributions={"lr": LR},
        intermediate_values=dev, user_attrs=attrs,
    ))  # fmt: skip


@pytest.fixture(scope="module")
def ablation():
    return _head_only("median"), {lr: (dev, best) for lr, dev, best, _ in _head_only("none")}


def test_the_pruned_studys_pick_is_checked_against_the_pruned_trial_beside_it(ablation):
    median, unpruned = ablation
    study = optuna.create_study(direction="maximize")
    for trial in median:
        _add(study, *trial)
    published = study.best_trial.params["lr"]  # the fair page's head_only lr
    assert published == pytest.approx(0.00813, rel=1e-3)
    # only 5 of its 9 trials trained out: below lr_study.trials, the study goes on
    cfg = LrStudyConfig(trials=6, range=[1e-5, 1e-2], pruner="median")
    assert lrstudy.target(study, cfg) == 6
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials) == 5

    # the first trial above the pick was cut after epoch 2, the lower side is bracketed by trials
    # trained out: the study trains that one again, unpruned
    (first,) = lrstudy.neighbours_to_check(study)
    assert first.params["lr"] > published and first.state == optuna.trial.TrialState.PRUNED
    assert all(t.params["lr"] <= published or t.number >= first.number for t in study.trials)
    # trained out (the unpruned ablation drew the same lr: the same sampler draws until then),
    # it beats the published pick, which the pruner had hidden
    dev, best = unpruned[first.params["lr"]]
    _add(study, first.params["lr"], dev, best, False, **{CHECK: first.number})
    assert lrstudy.target(study, cfg) == 7  # one more finished trial wanted: the check
    assert study.best_trial.params["lr"] == first.params["lr"] > published
    # and the pruned trial beside the new best is next: where the unpruned study found its best
    (second,) = lrstudy.neighbours_to_check(study)
    unpruned_best = max(unpruned, key=lambda lr: unpruned[lr][1])
    assert unpruned_best == pytest.approx(0.0885, rel=1e-3)
    assert second.params["lr"] == pytest.approx(unpruned_best, rel=0.02)
    assert second.state == optuna.trial.TrialState.PRUNED


def test_the_unpruned_study_needs_no_check_and_a_diverged_neighbour_none_either(ablation):
    _, unpruned = ablation
    study = optuna.create_study(direction="maximize")
    for lr, (dev, best) in unpruned.items():
        _add(study, lr, dev, best, False)
    assert lrstudy.neighbours_to_check(study) == []
    # a trial that diverged beside the best is an answer about that lr, not a cut-short one
    top = study.best_trial.params["lr"]
    _add(study, top * 1.01, {1: 0.1}, 0.1, True, diverged=1)
    assert lrstudy.neighbours_to_check(study) == []
    _add(study, top * 0.99, {1: 0.5}, 0.5, True)  # pruned just below: checked
    assert [t.params["lr"] for t in lrstudy.neighbours_to_check(study)] == [top * 0.99]
