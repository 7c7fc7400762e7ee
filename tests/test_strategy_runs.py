"""Strategies in real training, in this process and through the CLI: LLRD's learning rates,
gradual unfreezing's schedule (and its resumption), the frozen encoder under a BiLSTM, a kept LoRA
adapter, a short run per option and the lr study."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from helpers.data import ROOT
from helpers.models import NEW, build, expected_counts
from helpers.runs import compose_cfg, fit_here, run_cli, slice_overrides
from helpers.store import logged_runs
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file
from transformers import DataCollatorForTokenClassification, TrainerCallback

from ablate import report, strategies
from ablate.data.encode import IGNORE, encode_words
from ablate.lrstudy import cli as study_cli
from ablate.lrstudy import interior, position
from ablate.models import anatomy
from ablate.models.build import load_tokenizer
from ablate.tasks.pos import UPOS, read_conllu
from ablate.tracking.history import latest_per_step


class Recorder(TrainerCallback):
    """Per epoch: each block's requires_grad, whether it changed, and the optimiser's groups."""

    def bind(self, model):
        self.model, self.epochs, self.groups = model, [], None
        return self

    def _blocks(self):
        return anatomy.blocks(self.model)

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        self.groups = [dict(g) for g in optimizer.param_groups]

    def on_epoch_begin(self, args, state, control, **kwargs):  # after GradualUnfreezing's
        self.before = [[p.detach().clone() for p in b.parameters()] for b in self._blocks()]
        self.trains = [all(p.requires_grad for p in b.parameters()) for b in self._blocks()]
        self.frozen = [not any(p.requires_grad for p in b.parameters()) for b in self._blocks()]

    def on_epoch_end(self, args, state, control, **kwargs):
        changed = [
            any(not torch.equal(a, p) for a, p in zip(old, b.parameters(), strict=True))
            for old, b in zip(self.before, self._blocks(), strict=True)
        ]
        self.epochs.append({"trains": self.trains, "frozen": self.frozen, "changed": changed})


def fit(slice_root, store, *overrides):
    """A run (what the CLI runs) on the Naija slice with the tiny model, in this process."""
    base = [o for o in slice_overrides(slice_root, store, ROOT) if not o.startswith("hydra.")]
    cfg = compose_cfg(*base, *overrides)
    run_id, results = fit_here(cfg)
    return cfg, run_id, results


def record(monkeypatch, recorder: Recorder) -> Recorder:
    """Add ``recorder`` to the callbacks of the next strategy applied, after the strategy's own."""
    original = strategies.apply

    def apply(model, cfg):
        applied = original(model, cfg)
        applied.callbacks.append(lambda run: recorder.bind(applied.model))
        return applied

    monkeypatch.setattr(strategies, "apply", apply)
    return recorder


def test_llrd_learning_rates_read_back_from_the_optimizer(slice_root, store, monkeypatch):
    rec = record(monkeypatch, Recorder())
    cfg, _, _ = fit(
        slice_root, store, "freeze=llrd", "freeze.decay=0.5", "trainer.lr=1e-3", "trainer.epochs=1"
    )
    lr, decay, wd = cfg.trainer.lr, cfg.freeze.decay, cfg.trainer.weight_decay
    n = len(anatomy.blocks(rec.model))
    expected = {"head": lr, "embeddings": lr * decay**n}
    expected.update({f"block{i}": lr * decay ** (n - 1 - i) for i in range(n)})
    seen = {}
    names = {id(p): name for name, p in rec.model.named_parameters()}
    for g in rec.groups:
        assert g["lr"] == pytest.approx(expected[g["group"]])
        for p in g["params"]:
            no_decay = "bias" in names[id(p)] or "LayerNorm" in names[id(p)]
            assert g["weight_decay"] == (0.0 if no_decay else wd), names[id(p)]
            seen[id(p)] = g["group"]
    assert len(seen) == len(names)  # every parameter, each in one group
    blocks = anatomy.blocks(rec.model)
    assert all(seen[id(p)] == "block0" for p in blocks[0].parameters())
    assert rec.groups[0]["group"] == "head"  # the Trainer logs the first group's lr


def test_gradual_unfreezes_on_schedule(slice_root, store, monkeypatch):
    rec = record(monkeypatch, Recorder())
    _, run_id, _ = fit(
        slice_root, store, "freeze=gradual", "freeze.schedule=[0,2,7]", "trainer.epochs=3",
        "trainer.lr=1e-3",
    )  # fmt: skip
    n = len(anatomy.blocks(rec.model))
    for epoch, k in enumerate([0, 2, n]):  # 7 = every block and the embeddings
        tops = [i >= n - k for i in range(n)]
        seen = rec.epochs[epoch]
        assert seen["trains"] == tops and seen["frozen"] == [not t for t in tops], epoch
        assert seen["changed"] == tops, epoch  # unfrozen blocks do get optimiser steps
    history = MlflowClient(store).get_metric_history(run_id, "trainable_params")
    by_step = {m.step: int(m.value) for m in history}
    model, blocks = rec.model, anatomy.blocks(rec.model)
    head = sum(p.numel() for p in model.classifier.parameters())
    two = sum(p.numel() for b in blocks[n - 2 :] for p in b.parameters())
    everything = sum(p.numel() for p in model.parameters())
    assert by_step == {0: head, 1: head, 2: head + two, 3: everything}
    assert all(p.requires_grad for p in anatomy.embeddings(model).parameters())


class InterruptAfterDev(TrainerCallback):
    """Ctrl-C right after epoch ``epoch``'s dev score is logged, before its checkpoint is saved."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def on_evaluate(self, args, state, control, **kwargs):
        if round(state.epoch) == self.epoch:
            raise KeyboardInterrupt


def test_a_resumed_gradual_run_keeps_its_schedule_and_one_dev_score_per_epoch(
    slice_root, store, monkeypatch
):
    original = strategies.apply

    def interrupted(model, cfg):
        applied = original(model, cfg)
        applied.callbacks.append(lambda run: InterruptAfterDev(2))
        return applied

    args = ("freeze=gradual", "freeze.schedule=[0,2,7]", "trainer.epochs=3", "trainer.lr=1e-3")
    monkeypatch.setattr(strategies, "apply", interrupted)
    with pytest.raises(KeyboardInterrupt):  # epoch 2 scored on dev, its checkpoint not saved
        fit(slice_root, store, *args)
    monkeypatch.setattr(strategies, "apply", original)
    rec = record(monkeypatch, Recorder())
    _, run_id, results = fit(slice_root, store, *args, "trainer.resume=true")

    client = MlflowClient(store)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["ablate.resumed"] == "true"
    # the resumed process trains epochs 2 and 3 from epoch 1's checkpoint, on the schedule
    n = len(anatomy.blocks(rec.model))
    assert [e["trains"] for e in rec.epochs] == [[i >= n - k for i in range(n)] for k in (2, n)]
    trainable = latest_per_step(client.get_metric_history(run_id, "trainable_params"))
    model, blocks = rec.model, anatomy.blocks(rec.model)
    head = sum(p.numel() for p in model.classifier.parameters())
    two = sum(p.numel() for b in blocks[n - 2 :] for p in b.parameters())
    everything = sum(p.numel() for p in model.parameters())
    assert trainable == {0: head, 1: head, 2: head + two, 3: everything}
    # epoch 2 was scored twice (killed, then again); it counts once, with its retrained score
    points = client.get_metric_history(run_id, "dev_accuracy")
    assert sorted(m.step for m in points) == [1, 2, 2, 3]
    dev = list(latest_per_step(points).values())
    assert results["best_epoch"] == dev.index(max(dev)) + 1 <= 3
    assert results["best_dev_accuracy"] == max(dev)
    history = report.load_runs("ablate", store).history
    assert sorted(history[history.key == "dev_accuracy"].epoch) == [1, 2, 3]


def test_frozen_encoder_with_bilstm_head_runs(slice_root, store):
    cfg, run_id, results = fit(slice_root, store, "freeze=all", "model.head=bilstm")
    run = MlflowClient(store).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["model.head"] == "bilstm"
    assert 0.0 <= results["dev_accuracy"] <= 1.0 and results["dev_words"] > 0
    frozen = json.loads(run.data.tags["freeze.frozen_blocks"])
    assert frozen == list(range(cfg.model.config_overrides.num_hidden_layers))


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_lora_adapter_artifact_reloads_with_the_same_predictions(slice_root, store, tmp_path):
    from peft import PeftModel

    cfg, run_id, _ = fit(
        slice_root, store, "model=minilm", "freeze=lora", "trainer.lr=2e-3", "trainer.epochs=1",
        "data.max_train_sentences=48",
    )  # fmt: skip
    client = MlflowClient(store)
    adapter = client.download_artifacts(run_id, "adapter", str(tmp_path))
    files = sorted(os.listdir(adapter))
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(files)
    assert not {"model.safetensors", "pytorch_model.bin"} & set(files)  # not the whole model
    reloaded = PeftModel.from_pretrained(build(cfg), adapter).eval()
    weights = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    adapter_and_head = expected_counts("lora", cfg, reloaded.config)[0]
    assert sum(t.numel() for t in weights.values()) == adapter_and_head  # nothing else
    assert any(k.endswith("lora_B.weight") and t.abs().sum() > 0 for k, t in weights.items())

    path = client.download_artifacts(run_id, "predictions/dev.json", str(tmp_path))
    logged = json.loads(Path(path).read_text())
    tokenizer = load_tokenizer(cfg.model)
    dev = next((slice_root / "ud" / "UD_Naija-Slice").glob("*-ud-dev.conllu"))
    label2id = {name: i for i, name in enumerate(UPOS)}
    feats = encode_words(read_conllu(dev, lowercase=True), tokenizer, label2id, 128)
    collate = DataCollatorForTokenClassification(tokenizer)
    gold, pred = [], []
    size = cfg.trainer.eval_batch_size
    with torch.no_grad():
        for start in range(0, len(feats), size):
            batch = collate(feats[start : start + size])
            out = reloaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            mask = batch["labels"] != IGNORE
            gold += batch["labels"][mask].tolist()
            pred += out.logits.argmax(-1)[mask].tolist()
    assert gold == logged["gold"]
    assert pred == logged["pred"]


# -- the real CLI ------------------------------------------------------------------------------


def test_a_short_real_run_per_option(slice_root, store, tmp_path):
    options = ",".join(NEW)  # none and all: tests/test_train.py
    proc = run_cli(
        "--multirun", *slice_overrides(slice_root, store, tmp_path), "data.max_train_sentences=48",
        f"freeze={options}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(store)
    runs = logged_runs(store)
    by_option = {r.data.params["freeze.name"]: r for r in runs}
    assert sorted(by_option) == sorted(options.split(","))
    assert all(r.info.status == "FINISHED" for r in runs)
    n = {k: int(r.data.metrics["trainable_params"]) for k, r in by_option.items()}
    total = int(by_option["llrd"].data.metrics["total_params"])
    assert n["bitfit"] < n["lora"] < n["embeddings"] < n["llrd"] == total
    for r in runs:
        assert {"trainable_params", "total_params", "trainable_pct"} <= set(r.data.metrics)
    history = client.get_metric_history(by_option["gradual"].info.run_id, "trainable_params")
    gradual = [int(m.value) for m in sorted(history, key=lambda m: m.step)]
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == [0, 1, 2]  # start, epochs
    assert gradual[0] == gradual[1] < n["bitfit"] and gradual[1] < gradual[2] == n["gradual"]
    lora_files = {a.path for a in client.list_artifacts(by_option["lora"].info.run_id, "adapter")}
    assert "adapter/adapter_model.safetensors" in lora_files


def test_lr_study_a_study_per_option_for_two_options(slice_root, store, tmp_path, capsys):
    overrides = [
        *slice_overrides(slice_root, store, tmp_path), "trainer.epochs=1",
        "data.max_train_sentences=48", "lr_study.trials=1", "lr_study.widen=0",
    ]  # fmt: skip
    # The lr study runs one Optuna study per option, each trial a `python -m ablate.train` run.
    assert study_cli.main([*overrides, "freeze=bitfit,lora"]) == 0
    table = capsys.readouterr().out
    client = MlflowClient(store)
    runs = logged_runs(store)
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)
    studies: dict[str, list] = {}
    for r in runs:
        studies.setdefault(r.data.tags["study"], []).append(r)
    assert sorted(studies) == ["lr-UD_Naija-Slice-tiny-bitfit", "lr-UD_Naija-Slice-tiny-lora"]
    for name, trials in studies.items():
        option = name.rsplit("-", 1)[1]
        (top,) = trials  # which is best among several: tests/test_lrstudy.py
        assert top.data.params["freeze.name"] == option
        assert 1e-5 <= float(top.data.params["trainer.lr"]) <= 1e-3
        row = next(line for line in table.splitlines() if f"| {name} |" in line)
        lr = float(top.data.params["trainer.lr"])
        inside = "yes" if interior(lr, [1e-5, 1e-3]) else "**no**"
        where = f"{position(lr, [1e-5, 1e-3]):.2f} | {inside}"
        assert f"| 1 | 0 | 0 | [1e-05, 0.001] | {lr:.3g} | {where} |" in row
        assert top.info.run_id in row
    # The same table again, from the store alone.
    assert study_cli.main(["--report-only", *overrides]) == 0
    assert capsys.readouterr().out.strip() == table.strip()

    # A later study of bitfit with other settings is its own comparison: the older trials (more
    # sentences) are left out, not pooled with it.
    later = [*overrides, "data.max_train_sentences=24", "lr_study.trials=1"]
    assert study_cli.main([*later, "freeze=bitfit"]) == 0
    row = capsys.readouterr().out.splitlines()[-1]
    (new,) = [
        r for r in logged_runs(store)
        if r.data.params["data.max_train_sentences"] == "24"
    ]  # fmt: skip
    lr = float(new.data.params["trainer.lr"])
    assert "| 1 (+1 with other settings, not compared) | 0 | 0 | [1e-05, 0.001] |" in row
    assert f"| {lr:.3g} | {position(lr, [1e-5, 1e-3]):.2f} |" in row
    assert new.info.run_id in row

    # Every study in the store, each with its own task's objective (an NER trial logs F1).
    ner = client.create_run(client.get_experiment_by_name("ablate").experiment_id).info.run_id
    client.set_tag(ner, "study", "lr-conll2003-tiny-none")
    for key, value in {"freeze": "none", "data.task": "ner", "trainer.lr": 3e-4}.items():
        client.log_param(ner, key, value)
    client.log_metric(ner, "best_dev_f1", 0.5)
    client.set_terminated(ner, "FINISHED")
    assert study_cli.main(["--report-only", *overrides]) == 0
    rows = capsys.readouterr().out.splitlines()
    (ner_row,) = [r for r in rows if "lr-conll2003-tiny-none" in r]
    # a trial that names no searched range: its table says so, not where its lr lies
    assert f"| 1 | 0 | 0 | - | 0.0003 | - | - | best_dev_f1 | 0.5000 | {ner} |" in ner_row
