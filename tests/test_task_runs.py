"""Real short runs of the NER and SST-2 tasks, every strategy on a sentence classifier, early
stopping and zero-shot extra test sets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.data import EWT, ROOT, UNPIN, conllu_blocks, write_treebank
from helpers.runs import compose_cfg, fit_run, run_cli, slice_overrides
from helpers.store import logged_runs, run_info
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from transformers import TrainerCallback

from ablate import report, strategies
from ablate.errors import AblateError
from ablate.models import anatomy
from ablate.tasks import ner
from ablate.tasks.pos import UPOS, read_conllu


def naija(slice_root: Path, store: str) -> list[str]:
    """Overrides for the tiny model on conftest's Naija slice (in this process: no hydra.*)."""
    keep = ("hydra.", "tracking.uri=")
    return [o for o in slice_overrides(slice_root, store, ROOT) if not o.startswith(keep)]


def history(store: str, run, key: str) -> list[tuple[int, float]]:
    points = MlflowClient(store).get_metric_history(run.info.run_id, key)
    return sorted((m.step, m.value) for m in points)


def artifact(store: str, run, path: str, tmp_path: Path) -> str:
    local = MlflowClient(store).download_artifacts(run.info.run_id, path, str(tmp_path))
    return Path(local).read_text()


def test_ner_run_with_minilm(task_root, store, tmp_path):
    cfg, run, results = fit_run(
        store, "data=conll2003", f"data.root={task_root}", *UNPIN, "freeze=all",
        "freeze.embeddings=true", "trainer.epochs=2", "trainer.lr=1e-3",
    )  # fmt: skip
    m = run.data.metrics
    assert run.info.status == "FINISHED" and run.data.params["data.task"] == "ner"
    gold = {s: ner.read_conll2003(task_root / "conll2003" / f) for s, f in
            (("dev", "valid.txt"), ("test", "test.txt"))}  # fmt: skip
    for split in ("dev", "test"):
        assert results[f"{split}_words"] == sum(len(s.words) for s in gold[split])
        for key in ("f1", "precision", "recall", "accuracy"):
            assert 0.0 <= results[f"{split}_{key}"] <= 1.0
    assert m["test_f1"] == results["test_f1"] and m["test_words"] == results["test_words"]
    f1s, accs = history(store, run, "dev_f1"), history(store, run, "dev_accuracy")
    assert [s for s, _ in f1s] == [1, 2] and [s for s, _ in accs] == [1, 2]
    assert m["best_dev_f1"] == max(v for _, v in f1s) and m["stopped_epoch"] == 2
    assert results["dev_f1"] == f1s[-1][1]  # the final model's dev F1 is the last epoch's
    assert m["test_f1"] > 0  # a pretrained encoder finds some entities after 2 epochs
    text = artifact(store, run, "reports/test_classification_report.txt", tmp_path)
    assert "PER" in text and "micro avg" in text
    logged = json.loads(artifact(store, run, "predictions/dev.json", tmp_path))
    assert len(logged["gold"]) == results["dev_words"]
    tags = [ner.NER_TAGS[i] for i in logged["gold"]]
    assert tags == [t for s in gold["dev"] for t in s.labels]  # word order, IOB2 ids


def test_sst2_run_with_minilm_through_the_cli(task_root, store, tmp_path):
    proc = run_cli(
        "data=sst2", f"data.root={task_root}", *UNPIN[:2], "freeze=all", "freeze.embeddings=true",
        "trainer.epochs=1",
        f"tracking.uri={store}", f"hydra.run.dir={tmp_path / 'out'}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FINISHED: dev accuracy" in proc.stderr + proc.stdout
    (run,) = logged_runs(store)
    m = run.data.metrics
    assert run.info.status == "FINISHED"
    # named as a multirun's job names it (Hydra writes the bool True)
    assert run.info.run_name == "sst2-all-minilm-s42 embeddings=True epochs=1"
    assert m["train_sentences"] == 270 and m["test_sentences"] == 30 and m["dev_sentences"] == 80
    assert len(history(store, run, "test_sentences")) == 1  # counted once
    data = run_info(store, run.info.run_id)["data"]
    assert data["test"] == "held out from train: 30 of train.tsv, data.split_seed=42"
    inputs = {d.tags[0].value: d.dataset for d in run.inputs.dataset_inputs}
    assert inputs["test"].digest == inputs["train"].digest  # the test set is part of train.tsv
    for key in ("test_accuracy", "test_f1", "best_dev_accuracy", "dev_accuracy", "dev_f1"):
        assert 0.0 <= m[key] <= 1.0
    assert [s for s, _ in history(store, run, "dev_f1")] == [1]
    matrix = json.loads(artifact(store, run, "reports/test_confusion_matrix.json", tmp_path))
    assert matrix["labels"] == ["negative", "positive"] and np.sum(matrix["matrix"]) == 30
    assert np.trace(matrix["matrix"]) == round(m["test_accuracy"] * 30)
    assert "positive" in artifact(store, run, "reports/dev_classification_report.txt", tmp_path)
    logged = json.loads(artifact(store, run, "predictions/dev.json", tmp_path))
    assert len(logged["gold"]) == 80  # one id per sentence
    assert np.mean(np.equal(logged["gold"], logged["pred"])) == pytest.approx(m["dev_accuracy"])
    row = report.build(report.load_runs("ablate", store), baseline="all").summary.iloc[0]
    assert row.dev_ci_method == "bootstrap over dev sentences"  # a sentence task's items
    assert row.dev_ci_low_pct <= row.dev_mean_pct <= row.dev_ci_high_pct


def test_the_earlier_studies_presets(task_root, store, tmp_path):
    """experiment=ner runs the NER study's grid (here on the tiny model); experiment=sst2 is the
    SST-2 study's recipe."""
    proc = run_cli(
        "--multirun", "experiment=ner", "model=tiny", f"data.root={task_root}", *UNPIN,
        "trainer.epochs=1", "data.max_train_sentences=40", f"tracking.uri={store}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = logged_runs(store)
    by = {r.data.params["freeze.name"]: r for r in runs}
    assert sorted(by) == ["head_only", "lora_qkv", "none"]
    assert all(
        r.info.status == "FINISHED" and r.data.params["data.name"] == "conll2003" for r in runs
    )
    assert all(r.data.params["trainer.early_stopping_patience"] == "3" for r in runs)
    hidden = compose_cfg("model=tiny").model.config_overrides.hidden_size
    labels_n = len(ner.NER_TAGS)
    assert by["head_only"].data.metrics["trainable_params"] == hidden * labels_n + labels_n
    lora = by["lora_qkv"].data.params
    assert (lora["freeze.alpha"], lora["freeze.r"]) == ("32", "8")
    assert lora["freeze.target_modules"] == "['query', 'key', 'value']"
    n = {k: r.data.metrics["trainable_params"] for k, r in by.items()}
    assert n["head_only"] < n["lora_qkv"] < n["none"]

    sst2 = compose_cfg("experiment=sst2", "freeze=head_only")
    assert (sst2.data.name, sst2.model.name, sst2.freeze.name) == (
        "sst2", "distilbert_base_uncased", "head_only"
    )  # fmt: skip
    t = sst2.trainer
    assert (t.epochs, t.batch_size, t.warmup_ratio, sst2.data.max_length) == (2, 32, 0.06, 128)


# layer freezing: the MiniLM runs above (freeze=all)
@pytest.mark.parametrize("option", ["bitfit", "llrd", "gradual", "lora"])
def test_every_strategy_trains_a_sentence_classifier(task_root, store, option):
    _, run, results = fit_run(
        store, "data=sst2", f"data.root={task_root}", *UNPIN[:2], "model=tiny", f"freeze={option}",
        "trainer.epochs=1", "data.max_train_sentences=32",
    )  # fmt: skip
    assert run.info.status == "FINISHED" and run.data.metrics["trainable_params"] > 0
    assert 0.0 <= results["test_accuracy"] <= 1.0 and results["test_sentences"] == 30


class BreakHeadFrom(TrainerCallback):
    """From epoch ``start`` on, sets the classifier to predict ``X`` after each epoch's training
    (before dev is scored): later dev scores fall whatever the training numerics."""

    def __init__(self, model, start: int):
        self.model, self.start = model, start

    def on_epoch_end(self, args, state, control, **kwargs):
        if round(state.epoch) >= self.start:
            head = anatomy.unwrap(self.model).classifier
            with torch.no_grad():
                head.weight.zero_()
                head.bias.zero_()
                head.bias[UPOS.index("X")] = 1.0


def test_early_stopping_stops_and_restores_the_best_epoch(slice_root, store, tmp_path, monkeypatch):
    original = strategies.apply

    def apply(model, cfg):
        applied = original(model, cfg)
        applied.callbacks.append(lambda run: BreakHeadFrom(applied.model, start=3))
        return applied

    monkeypatch.setattr(strategies, "apply", apply)
    _, run, results = fit_run(
        store, *naija(slice_root, store), "trainer.epochs=8", "trainer.early_stopping_patience=2",
        "trainer.lr=1e-3", "trainer.checkpoints=false",  # patience turns them on: it needs them
    )  # fmt: skip
    m = run.data.metrics
    dev = [v for _, v in history(store, run, "dev_accuracy")]
    best_epoch = int(np.argmax(dev)) + 1
    assert best_epoch in (1, 2) and max(dev[2:]) < max(dev)  # broken from epoch 3 on
    assert m["stopped_epoch"] == len(dev) == best_epoch + 2 < 8  # 2 epochs without a better one
    assert m["best_epoch"] == best_epoch and m["best_dev_accuracy"] == max(dev)
    # the model scored on dev and test after training is the best epoch's, not the last one's
    assert results["dev_accuracy"] == pytest.approx(max(dev))
    logged = json.loads(artifact(store, run, "predictions/dev.json", tmp_path))
    assert np.mean(np.equal(logged["gold"], logged["pred"])) == pytest.approx(max(dev))
    assert not list(Path(run.data.tags["ablate.checkpoint_dir"]).glob("checkpoint-*"))


def test_early_stopping_patience_must_be_positive(slice_root, store):
    base = naija(slice_root, store)
    with pytest.raises(AblateError, match="early_stopping_patience=0"):
        fit_run(store, *base, "trainer.early_stopping_patience=0")


def test_naija_tagger_scored_zero_shot_on_an_extra_treebank(slice_root, store, tmp_path):
    blocks = conllu_blocks(EWT / "en_ewt-ud-test.conllu")[:30]
    ewt = write_treebank(tmp_path / "UD_English-EWT", "en_ewt", {"test": blocks})
    path = ewt / "en_ewt-ud-test.conllu"
    base = naija(slice_root, store)
    _, run, results = fit_run(store, *base, "trainer.epochs=1", f"data.extra_test=[{path}]")
    m = run.data.metrics
    words = sum(len(s.words) for s in read_conllu(path))
    assert m["test_words/UD_English-EWT"] == words
    assert 0.0 <= m["test_accuracy/UD_English-EWT"] <= 1.0
    assert results["test_accuracy/UD_English-EWT"] == m["test_accuracy/UD_English-EWT"]
    assert m["test_accuracy"] == results["test_accuracy"]  # the run's own test set as before
    # a tag outside the inventory names its file and line
    bad = tmp_path / "UD_Bad" / "bad-ud-test.conllu"
    bad.parent.mkdir()
    bad.write_text(path.read_text().replace("\tPROPN\t", "\tNAME\t", 1))
    with pytest.raises(AblateError, match=r"bad-ud-test.conllu:\d+: word .* label 'NAME'"):
        fit_run(store, *base, "trainer.epochs=1", f"data.extra_test=[{bad}]")
    with pytest.raises(AblateError, match="data.extra_test: nowhere.conllu: no such file"):
        fit_run(store, *base, "trainer.epochs=1", "data.extra_test=[nowhere.conllu]")


def test_extra_test_config_is_a_list_of_paths():
    cfg = compose_cfg("data.extra_test=[a/b.conllu,c.conllu]")
    assert OmegaConf.to_container(cfg.data.extra_test) == ["a/b.conllu", "c.conllu"]
    assert compose_cfg().data.extra_test == []
