"""The speed plugins: the tokenised cache, embedding rows; real sweeps with the plugins on; and,
with every switch off, the stock Trainer plus the core behaviour. Fast dropout:
tests/test_fast_dropout.py; the switches' declarations and the plugin interface:
tests/test_switches.py."""

from __future__ import annotations

import copy
import importlib.metadata
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.runs import FakeRecorder, run_cli, slice_overrides
from helpers.speed import LABEL2ID, TASK, build, compose, make_trainer
from helpers.store import logged_runs, run_info
from mlflow.tracking import MlflowClient
from transformers import AutoModelForTokenClassification, DataCollatorForTokenClassification

from ablate import switches
from ablate.data.dataset import encode_splits
from ablate.models import anatomy
from ablate.models.build import load_tokenizer
from ablate.plugins import Context
from ablate.speed import dropout, embedding_rows, precision
from ablate.training.trainer import CoreTrainer


@pytest.fixture(scope="module")
def sentences(slice_root):
    folder = slice_root / "ud" / "UD_Naija-Slice"
    return {
        s: TASK.read(next(folder.glob(f"*-ud-{s}.conllu")), lowercase=True)
        for s in ("train", "dev")
    }


# --- the tokenisation cache ---------------------------------------------------------------------


def test_tokenisation_cache_hits_on_the_second_job_and_is_invalidated(
    tmp_path, sentences, monkeypatch
):
    def job(max_length=128, tok=None, on=True):
        tok = tok or load_tokenizer(compose().model)  # a fresh one, as in a new job
        cache = tmp_path if on else None
        out = encode_splits(sentences, TASK.encode, tok, LABEL2ID, max_length, cache)
        return out.cache, out.features, out.stats

    first, feats, stats = job()
    second, cached, cached_stats = job()
    assert (first, second) == ("miss", "hit")
    assert cached == feats and cached_stats == stats
    assert stats["train"]["empty_sentences"] == 0 and set(stats["dev"]) == {
        "empty_sentences",
        "windowed_sentences",
        "truncated_words",
    }
    assert feats == {
        s: TASK.encode(x, load_tokenizer(compose().model), LABEL2ID, 128)
        for s, x in sentences.items()
    }
    windowed = job(max_length=24)
    assert windowed[0] == "miss" and windowed[2]["train"]["windowed_sentences"] > 0
    assert job(max_length=24)[2] == windowed[2]  # the counts come back with a hit
    other = load_tokenizer(compose().model)
    other.add_tokens(["naijaword"])  # another vocabulary
    assert job(tok=other)[0] == "miss"
    left = load_tokenizer(compose().model)
    left.truncation_side = "left"  # cuts over-long words from the other end
    assert job(tok=left)[0] == "miss"
    assert job()[0] == "hit"
    installed = importlib.metadata.version
    with monkeypatch.context() as m:  # another transformers release may tokenise differently
        m.setattr(
            importlib.metadata, "version", lambda p: "99.0" if p == "transformers" else installed(p)
        )
        assert job()[0] == "miss"
    assert job()[0] == "hit"
    off = job(on=False)
    assert off[0] == "off" and off[1] == feats
    assert all(p.suffix == ".arrow" for p in tmp_path.iterdir())  # no temporary files left
    for damage in (lambda b: b[:200], lambda b: b""):  # truncated, emptied: rebuilt, not a crash
        for path in tmp_path.glob("*.arrow"):
            path.write_bytes(damage(path.read_bytes()))
        state, rebuilt, _ = job()
        assert state == "miss" and rebuilt == feats
        assert job()[0] == "hit"


# --- embedding rows -----------------------------------------------------------------------------


def test_training_only_the_used_embedding_rows_updates_like_the_full_table(
    tmp_path, features, tokenizer
):
    applied, _ = build()
    dense = applied.model
    sparse = copy.deepcopy(dense)
    train, dev = features["train"][:48], features["dev"]
    rows = embedding_rows.apply(sparse, train)
    used = set(embedding_rows.used_ids(train).tolist())
    unseen = [i for f in dev for i in f["input_ids"] if i not in used]
    assert unseen and rows.trained.shape[0] == len(used) < rows.num_embeddings / 5
    initial = dense.get_input_embeddings().weight.detach().clone()
    # lr and weight decay large enough that a missing decay of the unseen rows would show
    steep = ("trainer.epochs=1", "trainer.lr=0.01", "trainer.weight_decay=0.1")
    for name, model in (("dense", dense), ("rows", sparse)):
        trainer = make_trainer(tmp_path / name, model, train, dev, tokenizer, *steep)
        if model is sparse:
            trainer.add_callback(embedding_rows.DecayUntrainedRows(rows))
        trainer.train()
    table = dense.get_input_embeddings().weight.detach()
    assert not torch.allclose(table[unseen], initial[unseen])  # decayed, not trained
    torch.testing.assert_close(rows.merged(), table, atol=1e-6, rtol=1e-5)
    others = [(n, p) for n, p in sparse.named_parameters() if "word_embeddings" not in n]
    for name, param in others:
        torch.testing.assert_close(param, dense.get_parameter(name), atol=1e-6, rtol=1e-4)
    # a checkpoint holds the trained table: loaded by hand into a plain model, or resumed
    trainer.save_model(str(tmp_path / "saved"))
    by_hand = AutoModelForTokenClassification.from_pretrained(tmp_path / "saved")
    assert type(by_hand.get_input_embeddings()) is torch.nn.Embedding
    torch.testing.assert_close(
        by_hand.get_input_embeddings().weight.detach(), table, atol=1e-6, rtol=1e-5
    )
    resumed = build()[0].model  # as a resumed run builds it: initial weights, then the rows
    resumed_rows = embedding_rows.apply(resumed, train)
    resumed.load_state_dict(sparse.state_dict())
    torch.testing.assert_close(resumed_rows.merged(), table, atol=1e-6, rtol=1e-5)
    batch = DataCollatorForTokenClassification(tokenizer)(dev[:16])
    batch.pop("labels")
    with torch.no_grad():
        logits = [m.eval()(**batch).logits for m in (sparse, dense, by_hand, resumed)]
    for other in logits[1:]:
        torch.testing.assert_close(logits[0], other, atol=1e-5, rtol=1e-4)


def test_embedding_rows_leave_the_padding_row_untrained_like_nn_embedding():
    torch.manual_seed(0)
    dense = torch.nn.Embedding(50, 8, padding_idx=0)
    with torch.no_grad():
        dense.weight[0] = torch.randn(8)  # so that a wrong update of the padding row would show
    rows = embedding_rows.RowsEmbedding(copy.deepcopy(dense), torch.tensor([0, 3, 5, 7, 3]))
    assert rows.rows.tolist() == [3, 5, 7]
    optimisers = [
        torch.optim.AdamW(params, lr=0.1, weight_decay=0.5)
        for params in (dense.parameters(), [rows.trained])
    ]
    embedding_rows.DecayUntrainedRows(rows).on_train_begin(None, None, None, optimisers[1])
    ids, target = torch.tensor([[3, 0, 5], [7, 7, 0]]), torch.randn(2, 3, 8)
    for _ in range(5):
        for module, opt in zip((dense, rows), optimisers, strict=True):
            opt.zero_grad()
            ((module(ids) - target) ** 2).sum().backward()
            opt.step()
    torch.testing.assert_close(rows.merged(), dense.weight.detach())
    every = torch.arange(50)
    torch.testing.assert_close(rows(every), dense(every).detach())


@pytest.mark.parametrize(
    ("overrides", "tag"),
    [
        (["freeze=none"], "rows train"),
        (["freeze=last2"], "rows train"),
        (["freeze=none", "trainer.embedding_rows=false"], "off"),
        (
            ["freeze=first4", "freeze.embeddings=true"],
            "not applied: the word embeddings are frozen",
        ),
        (["freeze=llrd"], "not applied: the strategy sets its own optimiser groups"),
        (["freeze=gradual"], "not applied: the strategy sets its own optimiser groups"),
        (["freeze=lora"], "not applied: the word embeddings are frozen"),
    ],
)
def test_embedding_rows_apply_only_where_the_update_stays_the_same(overrides, tag, features):
    applied, cfg = build(*overrides)
    before = anatomy.unwrap(applied.model).get_input_embeddings()
    ctx = Context(
        cfg, TASK, applied, applied.model, dict(features), None, FakeRecorder(), "cpu", None
    )
    status = embedding_rows.EmbeddingRows().prepare(ctx)
    after = anatomy.unwrap(applied.model).get_input_embeddings()
    assert tag in status["embedding_rows"]
    assert (after is not before) == bool(ctx.callbacks) == (tag == "rows train")


# --- the core Trainer ---------------------------------------------------------------------------


def test_every_switch_off_is_the_stock_trainer_with_the_core_behaviour(tmp_path, features):
    tokenizer = load_tokenizer(compose().model)
    off = [
        f"{s.key}={'off' if s.choices else 'false'}"
        for s in switches.SWITCHES
        if s.group == "trainer"
    ]
    model = build()[0].model
    trainer = make_trainer(tmp_path, model, features["train"], features["dev"], tokenizer, *off)
    assert type(trainer) is CoreTrainer  # no speed mixin
    assert trainer.model is model and trainer.args.optim == "adamw_torch"
    assert all(
        type(m) is torch.nn.Dropout for m in model.modules() if "Dropout" in type(m).__name__
    )


def test_final_dev_predictions_reuse_the_last_epoch_evaluation(tmp_path, features, tokenizer):
    applied, _ = build()
    train, dev = features["train"][:32], features["dev"]
    trainer = make_trainer(tmp_path, applied.model, train, dev, tokenizer, "trainer.epochs=1")
    trainer.train()
    step, kept = trainer.last_evaluation
    assert step == trainer.state.global_step > 0  # the epoch's dev evaluation, after training
    predictions, label_ids = trainer.predictions(dev)
    assert predictions is kept.predictions  # no second pass over dev
    fresh = trainer.predict(dev)  # what a second pass computes: the same
    assert np.array_equal(predictions, fresh.predictions)
    assert np.array_equal(label_ids, fresh.label_ids)
    test = features["dev"][:5]  # another dataset is predicted anew
    assert trainer.predictions(test)[0] is not kept.predictions
    assert len(trainer.predictions(test)[1]) == 5


# --- real sweeps --------------------------------------------------------------------------------


@pytest.mark.skipif(not precision.cpu_bf16(), reason="this CPU has no bf16 (AVX-512 BF16 / AMX)")
def test_real_bf16_runs_train_on_rounded_batch_shapes(slice_root, store, tmp_path):
    from ablate.speed.batching import SHAPE_WIDTH

    proc = run_cli(
        "--multirun",
        *slice_overrides(slice_root, store, tmp_path),
        "trainer.bf16=true",
        "trainer.round_shapes=null,false",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {r.data.params["trainer.round_shapes"]: r for r in logged_runs(store)}
    assert {k: r.info.status for k, r in runs.items()} == {"None": "FINISHED", "False": "FINISHED"}
    speed = {k: run_info(store, r.info.run_id)["speed"] for k, r in runs.items()}
    assert speed["None"]["round_shapes"].startswith(
        f"training widths in multiples of {SHAPE_WIDTH}"
    )
    assert speed["False"]["round_shapes"] == "off"
    padding = {k: r.data.metrics["padding_pct"] for k, r in runs.items()}
    assert padding["None"] > padding["False"] > 0  # the rounded rows' extra padding


def test_real_sweep_dev_evaluations_from_the_kept_prefix_give_the_same_numbers(
    slice_root, store, tmp_path
):
    proc = run_cli(
        "--multirun",
        *slice_overrides(slice_root, store, tmp_path),
        "freeze=head_only",  # the whole encoder frozen: later evaluations run only the head
        "skip_finished=false",  # explicit: the switch is not part of a run's identity
        "trainer.cache_frozen_eval=true,false",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(store)
    runs = {r.data.params["trainer.cache_frozen_eval"]: r for r in logged_runs(store)}
    assert {k: r.info.status for k, r in runs.items()} == {"True": "FINISHED", "False": "FINISHED"}
    speed = {k: run_info(store, r.info.run_id)["speed"] for k, r in runs.items()}
    assert speed["True"]["cache_frozen_eval"].startswith("dev windows: embeddings + blocks 0-")
    assert speed["False"]["cache_frozen_eval"] == "off"
    assert runs["True"].data.tags["ablate.identity"] == runs["False"].data.tags["ablate.identity"]

    def history(run):
        points = client.get_metric_history(run.info.run_id, "dev_accuracy")
        return [p.value for p in sorted(points, key=lambda p: p.step)]

    def predictions(run):
        path = client.download_artifacts(run.info.run_id, "predictions/dev.json", str(tmp_path))
        return json.loads(Path(path).read_text())

    assert len(history(runs["True"])) == 2
    assert history(runs["True"]) == history(runs["False"])
    assert predictions(runs["True"]) == predictions(runs["False"])
    for metric in ("test_accuracy", "dev_accuracy"):
        assert runs["True"].data.metrics[metric] == runs["False"].data.metrics[metric]


def test_real_sweep_reuses_tokenisation_and_trains_on_the_cached_prefix(
    slice_root, store, tmp_path
):
    proc = run_cli(
        "--multirun",
        *slice_overrides(slice_root, store, tmp_path),
        "trainer.epochs=1",
        "freeze=first4",
        "freeze.embeddings=true",
        "trainer.cache_frozen=true",
        f"data.tokenized_cache_dir={tmp_path / 'tokenized'}",
        "seed=1,2",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {r.data.params["seed"]: r for r in logged_runs(store)}
    assert {s: r.info.status for s, r in runs.items()} == {"1": "FINISHED", "2": "FINISHED"}
    info = {s: run_info(store, r.info.run_id) for s, r in runs.items()}
    assert info["1"]["data"]["tokenized_cache"] == "miss"
    assert info["2"]["data"]["tokenized_cache"] == "hit"
    assert len(list((tmp_path / "tokenized" / "read").rglob("output.pkl"))) == 3  # the splits read
    for seed, run in runs.items():
        speed = info[seed]["speed"]
        assert speed["cache_frozen"] == "embeddings + blocks 0-3"
        assert dropout.ATTENTION in speed["fast_dropout"]
        assert speed["length_grouping"] == "pack"  # with that attention too
        assert speed["round_shapes"] == "off"  # fp32: rounding would only pad
        m = run.data.metrics
        assert m["cache_frozen_time_s"] > 0 and m["train_tokens_per_s"] > 0
        assert m["dev_eval_time_s"] > 0 and 0 <= m["dev_accuracy"] <= 1
        assert m["dev_words"] == runs["1"].data.metrics["dev_words"] > 0
