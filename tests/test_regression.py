"""The numbers the code computed before its move into packages (tests/data/regression.json, from
f367003): a fixed tiny configuration per strategy and per batching path gives the same metrics,
and the default configurations keep their identity, so ``skip_finished`` finds earlier runs.

On a CPU with the recording machine's instruction set (one thread) the metrics match to the last
digit; elsewhere the float kernels differ, so the loss matches to 1e-4 and accuracy to a word.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers.data import ROOT
from helpers.runs import compose_cfg, run_cli, slice_overrides
from helpers.store import logged_runs
from mlflow.tracking import MlflowClient

from ablate.tracking.identity import identity
from ablate.tracking.params import defaults

RECORDED = json.loads((ROOT / "tests" / "data" / "regression.json").read_text())
SAME_CPU = torch.backends.cpu.get_cpu_capability() == RECORDED["cpu_capability"]


def history(client, run, key):
    points = client.get_metric_history(run.info.run_id, key)
    return [p.value for p in sorted(points, key=lambda p: p.step)]


def assert_same(client, run, want, words):
    got = {
        "dev_accuracy": history(client, run, "dev_accuracy"),
        "train_loss": history(client, run, "train_loss"),
        "test_accuracy": run.data.metrics["test_accuracy"],
    }
    if SAME_CPU:
        assert got == {k: want[k] for k in got}
    else:
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-4)
        for key in ("dev_accuracy", "test_accuracy"):
            assert got[key] == pytest.approx(want[key], abs=1.01 / words[key])
    assert run.data.tags["ablate.identity"] == want["identity"]


@pytest.mark.heavy
def test_every_strategy_and_batching_path_computes_its_recorded_numbers(
    slice_root, store, tmp_path
):
    base = [*slice_overrides(slice_root, store, tmp_path), *RECORDED["overrides"]]
    strategies = ",".join(sorted(RECORDED["strategies"]))
    grids = [
        # head_only computes its features once since 282b732; off, it is the recorded head_only
        run_cli("--multirun", *base, f"freeze={strategies}", "trainer.cache_frozen=false"),
        run_cli(
            "--multirun",
            *base,
            "trainer.length_grouping=split,bucket,off",
            f"hydra.sweep.dir={tmp_path / 'grouping'}",
        ),  # fmt: skip
        run_cli(*base, *RECORDED["variants"]["cache_frozen"]["overrides"]),
    ]
    for proc in grids:
        assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(store)
    runs = logged_runs(store)
    assert len(runs) == len(RECORDED["strategies"]) + 4
    for run in runs:
        p = {**defaults(), **run.data.params}  # a switch at its default is no param
        words = {"dev_accuracy": run.data.metrics["dev_words"],
                 "test_accuracy": run.data.metrics["test_words"]}  # fmt: skip
        if p["trainer.cache_frozen"] == "True":
            want = RECORDED["variants"]["cache_frozen"]
        elif p["trainer.length_grouping"] != "pack":
            want = RECORDED["variants"][p["trainer.length_grouping"]]
        else:
            want = RECORDED["strategies"][p["freeze.name"]]
            assert run.data.metrics["trainable_params"] == want["trainable_params"]
        assert_same(client, run, want, words)


@pytest.mark.parametrize("overrides", sorted(RECORDED["identity_of_defaults"]))
def test_default_configurations_keep_their_identity(overrides):
    cfg = compose_cfg(*overrides.split(), f"data.root={ROOT.parent / 'shared' / 'data'}")
    assert identity(cfg) == RECORDED["identity_of_defaults"][overrides]
