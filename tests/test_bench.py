"""``make bench`` (benchmarks/bench.py, bench_runner.py, bench_table.py): its arithmetic on
made-up jobs, and real tiny runs of both recipes logged to MLflow."""

from __future__ import annotations

import json
import tempfile

import bench
import bench_runner
import bench_table
import pytest
import torch
from helpers.speed import TASK, compose
from mlflow.tracking import MlflowClient
from transformers import AutoModelForTokenClassification

from ablate.errors import AblateError
from ablate.models.build import build as build_model


def fake_job(config, recipe, epoch_s, eval_s, acc, cache_s=0.0):
    return {
        "config": config,
        "recipe": recipe,
        "result": {
            "epoch_time_s": [epoch_s, epoch_s],
            "dev_eval_time_s": [eval_s, eval_s],
            "dev_accuracy": [0.5, acc],
            "train_tokens": [1000, 1000],
            "padding_pct": [10, 10],
            "train_flops_per_epoch": 1e9 * epoch_s,
            "tokenize_time_s": 1.0,
            "cache_frozen_time_s": cache_s,
            "rss_mb": 500,
            "wall_s": 60,
        },
    }


def test_bench_table_ratios_charge_the_prefix_cache_to_the_epochs():
    jobs = [
        fake_job("full", "plain", 10, 3, 0.900),
        fake_job("full", "ablate", 4, 1, 0.901),
        fake_job("full", "bucket", 3, 1, 0.880),
        fake_job("first4", "plain", 10, 3, 0.8),
        fake_job("first4", "ablate", 1, 1, 0.8, cache_s=2.0),  # 1 s/epoch + 2 s once = 2 s/epoch
        fake_job("nodrop", "plain", 10, 3, 0.75),
        fake_job("nodrop", "ablate", 4, 1, 0.7525),
    ]
    summary = bench_table.summarise(jobs, epochs=2, peak=1e10)
    text, comparisons = bench_table.table(
        summary, ["full", "first4", "nodrop"], epochs=2, recipes=("ablate", "bucket")
    )
    assert comparisons["full.ablate.train_s_ratio"] == pytest.approx(0.4)
    assert comparisons["full.bucket.train_s_ratio"] == pytest.approx(0.3)
    assert comparisons["first4.ablate.train_s_ratio"] == pytest.approx(0.2)
    assert comparisons["full.ablate.eval_s_ratio"] == pytest.approx(1 / 3)
    assert comparisons["full.ablate.dev_acc_diff_pt"] == pytest.approx(0.1)
    assert comparisons["full.bucket.dev_acc_diff_pt"] == pytest.approx(-2.0)
    assert comparisons["first4.ablate.tokens_per_s_ratio"] == pytest.approx(5.0)
    lines = text.splitlines()
    assert lines[:2] == [  # measured numbers only, right-aligned: no column of targets
        "| config | measure | plain | ablate | ablate / plain | ablate (bucket) "
        "| ablate (bucket) / plain |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    (full_acc, _, nodrop_acc) = [line for line in lines if "| dev accuracy after epoch 2 " in line]
    assert full_acc.endswith("| 90.00 | 90.10 | +0.10 pt | 88.00 | -2.00 pt |")
    assert nodrop_acc.endswith("| +0.25 pt |  |  |")  # nodrop: no bucket job
    assert text.count("\n") == 2 + 3 * len(bench_table.ROWS)


def test_bench_rates_come_from_mean_tokens_over_mean_time_and_plains_seeds_show_their_spread():
    # two rounds of ablate, one much faster: tokens/s must agree with the mean train time
    jobs = [fake_job("full", "plain", 10, 3, 0.88), fake_job("full", "plain", 10, 3, 0.9)]
    jobs += [fake_job("full", "ablate", 1, 1, 0.9), fake_job("full", "ablate", 9, 1, 0.9)]
    summary = bench_table.summarise(jobs, epochs=2, peak=1e10)
    text, comparisons = bench_table.table(summary, ["full"], epochs=2, recipes=("ablate",))
    assert comparisons["full.ablate.train_s_ratio"] == pytest.approx(0.5)
    assert comparisons["full.ablate.tokens_per_s_ratio"] == pytest.approx(2.0)
    assert summary[("full", "ablate")]["flops_pct"] == pytest.approx(10.0)  # 5 GFLOP / 5 s / 10
    # beside the accuracy difference, plain's own range over its seeds: the noise to judge it by
    (row,) = [line for line in text.splitlines() if "| dev accuracy" in line]
    assert "| dev accuracy after epoch 2 (%); plain 88.00-90.00 over seeds |" in row
    assert row.endswith("| 89.00 | 90.00 | +1.00 pt |")


def test_bench_nodrop_turns_off_every_dropout_of_the_architecture():
    from transformers import DistilBertConfig, DistilBertForTokenClassification

    overrides = bench_runner.dropout_off("tiny")
    cfg = compose(*overrides)
    net = build_model(cfg.model, AutoModelForTokenClassification, TASK.labels)
    drops = [m.p for m in net.modules() if isinstance(m, torch.nn.Dropout)]
    assert drops and not any(drops)
    keys = dict.fromkeys(bench_runner.DROPOUT_KEYS["distilbert"], 0.0)
    distil = DistilBertForTokenClassification(
        DistilBertConfig(n_layers=1, dim=32, hidden_dim=64, n_heads=2, **keys)
    )
    drops = [m.p for m in distil.modules() if isinstance(m, torch.nn.Dropout)]
    assert drops and not any(drops)


def test_bench_compares_pos_tagging_only(tmp_path):
    with pytest.raises(AblateError, match=r"--data sst2: task 'sst2'; the bench compares POS"):
        bench.main(
            ["--data", "sst2", "--out", str(tmp_path), "--uri", f"sqlite:///{tmp_path}/m.db"]
        )


def test_bench_runs_its_jobs_and_logs_the_table_it_computed(tmp_path, store, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # main() sets it for its jobs; restored after
    temp = tmp_path / "tmp"  # the bench's and its jobs' temporary folders
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    out = tmp_path / "bench"
    sizes = ["--train-sentences", "24", "--dev-sentences", "8", "--test-sentences", "4"]
    rc = bench.main(
        ["--model", "tiny", *sizes, "--epochs", "1", "--repeats", "1", "--configs", "nodrop"]
        + ["--recipes", "ablate", "--uri", store, "--out", str(out)]
        + ["--omp-wait-policy", "PASSIVE"]
    )
    assert rc == 0
    assert list(temp.iterdir()) == []  # its data slice, caches, logs and trainer folders are gone
    text = (out / "bench.md").read_text()
    assert "| full FT without dropout | train time per epoch (s) |" in text
    logged = json.loads((out / "bench.json").read_text())
    jobs = {job["recipe"]: job["result"] for job in logged["jobs"]}
    assert list(jobs) == ["plain", "ablate"]
    ratio = jobs["ablate"]["epoch_time_s"][0] / jobs["plain"]["epoch_time_s"][0]
    assert logged["ratios"]["nodrop.ablate.train_s_ratio"] == pytest.approx(ratio)
    assert f"| {ratio:.2f} |" in text
    # Without dropout masks ablate computes what plain computes: the same training loss (the
    # logged epoch mean, 4 decimals) and dev accuracy. The tiny model barely learns in two steps,
    # so this checks the bench's plumbing; the packing tests above check the gradients exactly.
    assert jobs["ablate"]["padding_pct"][0] < jobs["plain"]["padding_pct"][0]  # it packed
    assert jobs["ablate"]["train_loss"] == pytest.approx(jobs["plain"]["train_loss"], abs=1e-4)
    assert jobs["ablate"]["dev_accuracy"] == jobs["plain"]["dev_accuracy"]
    assert logged["ratios"]["nodrop.ablate.dev_acc_diff_pt"] == 0
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("ablate-bench").experiment_id])
    roles = sorted(r.data.tags.get("bench.recipe") or r.data.tags["bench.role"] for r in runs)
    assert roles == ["ablate", "plain", "summary"]
    (summary,) = [r for r in runs if r.data.tags.get("bench.role") == "summary"]
    assert summary.data.metrics["nodrop.ablate.train_s_ratio"] == pytest.approx(ratio)


def test_bench_first4_study_trains_the_studys_embeddings_in_plain_only(tmp_path, store):
    sizes = ["--train-sentences", "24", "--dev-sentences", "8", "--test-sentences", "4"]
    rc = bench.main(
        ["--model", "tiny", *sizes, "--epochs", "1", "--repeats", "1"]
        + ["--configs", "first4_study", "--recipes", "ablate", "--uri", store]
        + ["--out", str(tmp_path / "bench")]
    )
    assert rc == 0
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("ablate-bench").experiment_id])
    jobs = {r.data.tags["bench.recipe"]: r for r in runs if "bench.recipe" in r.data.tags}
    params = {k: r.data.params for k, r in jobs.items()}
    assert params["plain"]["freeze.first"] == params["ablate"]["freeze.first"] == "4"
    assert params["plain"]["freeze.embeddings"] == "False"  # as the earlier study ran first4
    assert params["ablate"]["freeze.embeddings"] == "True"
    assert params["ablate"]["trainer.cache_frozen"] == "True"
    logged = json.loads((tmp_path / "bench" / "bench.json").read_text())
    flops = {job["recipe"]: job["result"]["train_flops_per_epoch"] for job in logged["jobs"]}
    # plain's backward runs down to the embeddings; ablate runs blocks 4.. only, on packed rows
    assert flops["plain"] > 3 * flops["ablate"] > 0
    text = (tmp_path / "bench" / "bench.md").read_text()
    assert "| freeze=first4 (plain: embeddings train, as the study ran it" in text
