"""The NER (CoNLL-2003) and SST-2 tasks, early stopping and zero-shot extra test sets: readers on
the real files, seqeval wiring by hand, the SST-2 hold-out, and real short runs per task."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (
    DATA,
    EWT,
    ROOT,
    compose_cfg,
    conllu_blocks,
    fit_here,
    logged_runs,
    run_cli,
    run_info,
    slice_overrides,
    write_treebank,
)
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf
from transformers import TrainerCallback

from ablate import report, strategies, tasks
from ablate.data import files
from ablate.data.encode import IGNORE
from ablate.data.sentences import Sentence, check_labels, hold_out
from ablate.errors import AblateError
from ablate.models import anatomy
from ablate.tasks import ner, sst2
from ablate.tasks.pos import UPOS, read_conllu
from ablate.tracking.params import primary_metric

CONLL = DATA / "conll2003"
SST2 = DATA / "sst2"
UNPIN = [f"data.splits.{s}.sha256=null" for s in ("train", "dev", "test")]


def fit(store: str, *overrides: str):
    """A run (what the CLI runs) in this process; returns (cfg, run, results)."""
    cfg = compose_cfg(f"tracking.uri={store}", *overrides)
    run_id, results = fit_here(cfg)
    return cfg, MlflowClient(store).get_run(run_id), results


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


@pytest.fixture(scope="module")
def task_root(tmp_path_factory) -> Path:
    """A data root laid out like the shared one, with slices of the real files: CoNLL-2003's first
    blocks (-DOCSTART- blocks included) and SST-2's first rows."""
    root = tmp_path_factory.mktemp("tasks")
    (root / "conll2003").mkdir()
    for name, n in (("train", 130), ("valid", 45), ("test", 45)):
        blocks = (CONLL / f"{name}.txt").read_text("utf-8").split("\n\n")[:n]
        (root / "conll2003" / f"{name}.txt").write_text("\n\n".join(blocks) + "\n\n", "utf-8")
    (root / "sst2").mkdir()
    for name, n in (("train", 300), ("dev", 80)):
        lines = (SST2 / f"{name}.tsv").read_text("utf-8").splitlines(keepends=True)[: n + 1]
        (root / "sst2" / f"{name}.tsv").write_text("".join(lines), "utf-8")
    return root


# --- readers on the real files ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "sentences", "tokens", "entities"),
    [
        ("train", 14041, 203621, {"LOC": 7140, "MISC": 3438, "ORG": 6321, "PER": 6600}),
        ("valid", 3250, 51362, {"LOC": 1837, "MISC": 922, "ORG": 1341, "PER": 1842}),
        ("test", 3453, 46435, {"LOC": 1668, "MISC": 702, "ORG": 1661, "PER": 1617}),
    ],
)
def test_conll_counts_are_the_published_ones(name, sentences, tokens, entities):
    read = ner.read_conll2003(CONLL / f"{name}.txt")
    assert len(read) == sentences  # -DOCSTART- blocks dropped
    assert sum(len(s.words) for s in read) == tokens
    assert not any(ner.DOCSTART in s.words for s in read)
    # In IOB2 every entity starts with B-: the B- counts are the published entity counts.
    begins = [t[2:] for s in read for t in s.labels if t.startswith("B-")]
    assert {k: begins.count(k) for k in entities} == entities
    check_labels(read, ner.NER_TAGS, name)  # the fixed inventory covers every tag


def test_conll_iob1_to_iob2_on_real_sentences():
    read = ner.read_conll2003(CONLL / "train.txt")
    first = read[0]  # EU rejects German call to boycott British lamb .
    assert first.words[:3] == ("EU", "rejects", "German") and first.lines[0] == 3
    assert first.labels == ("B-ORG", "O", "B-MISC", "O", "O", "O", "B-MISC", "O", "O")
    assert read[1].labels == ("B-PER", "I-PER")  # Peter Blackburn: I-PER I-PER in the file
    # An original B- (an entity right after one of the same type) stays B-, and so does each of
    # the two B-MISC that follow O in train (PROVENANCE.md: lines 152428 and 175436).
    by_line = {n: (s, i) for s in read for i, n in enumerate(s.lines)}
    for number, word in ((152428, "Atlanta"), (175436, "Urdu-speaking")):
        sentence, i = by_line[number]
        assert sentence.words[i] == word and sentence.labels[i] == "B-MISC"
        assert i == 0 or sentence.labels[i - 1] == "O"
    raw = (CONLL / "train.txt").read_text("utf-8").splitlines()
    tags = [line.split()[-1] if line.strip() else "" for line in raw]
    adjacent = [
        n for n, tag in enumerate(tags, start=1)
        if tag.startswith("B-") and tags[n - 2][2:] == tag[2:]
    ]  # fmt: skip
    assert len(adjacent) == 70  # 72 B- in train: 2 after O, 70 right after the same type
    for number in adjacent:
        sentence, i = by_line[number]
        tag = sentence.labels[i]
        assert tag.startswith("B-") and sentence.labels[i - 1][2:] == tag[2:]


@pytest.mark.parametrize(
    ("iob1", "iob2"),
    [
        (["I-PER", "I-PER", "O", "I-LOC"], ["B-PER", "I-PER", "O", "B-LOC"]),
        (["I-ORG", "B-ORG", "I-ORG"], ["B-ORG", "B-ORG", "I-ORG"]),  # two adjacent ORGs
        (["I-PER", "I-LOC"], ["B-PER", "B-LOC"]),  # type change starts an entity
        (["O", "B-MISC", "I-MISC"], ["O", "B-MISC", "I-MISC"]),
    ],
)
def test_iob1_to_iob2(iob1, iob2):
    assert ner.iob1_to_iob2(iob1) == iob2


def test_conll_malformed_lines_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("-DOCSTART- -X- O O\n\nEU NNP I-NP I-ORG\nrejects VBZ O\n")
    with pytest.raises(AblateError, match=r"bad.txt:4: 3 columns"):
        ner.read_conll2003(bad)
    bad.write_text("EU NNP I-NP ORG\n")
    with pytest.raises(AblateError, match=r"bad.txt:1: NER tag 'ORG' is not IOB1"):
        ner.read_conll2003(bad)
    bad.write_text("EU NNP I-NP B-ORG\nrejects VBZ I-VP E-ORG\n")  # IOBES, not IOB1
    with pytest.raises(AblateError, match=r"bad.txt:2: NER tag 'E-ORG' is not IOB1"):
        ner.read_conll2003(bad)
    bad.write_text("EU NNP I-NP I-ORG\nfoo NN I-NP I-FOO\n")  # the file's tag, not its IOB2 form
    with pytest.raises(AblateError, match=r"bad.txt:2: NER tag 'I-FOO': entity type 'FOO' is not"):
        ner.read_conll2003(bad)
    bad.write_text("-DOCSTART- -X- O O\n\n")
    with pytest.raises(AblateError, match="no sentences"):
        ner.read_conll2003(bad)


def test_bad_ner_and_sst2_files_are_one_named_error_each_and_leave_no_run(task_root, tmp_path):
    """Each bad file of a real layout: a job's one error line names file:line (or the folder),
    and the store holds no run for it."""
    cases = {  # data root -> (dataset, file, content, what the error says)
        "columns": ("conll2003", "train.txt", "EU NNP I-ORG\n", "train.txt:1: 3 columns"),
        "tag": ("conll2003", "valid.txt", "EU NNP I-NP S-ORG\n", "valid.txt:1: NER tag 'S-ORG'"),
        "type": ("conll2003", "test.txt", "EU NNP I-NP I-GPE\n", "entity type 'GPE'"),
        "empty": ("conll2003", "test.txt", "-DOCSTART- -X- O O\n\n", "test.txt: no sentences"),
        "fields": ("sst2", "dev.tsv", "sentence\tlabel\ngood\t1\t0\n", "dev.tsv:2: 3"),
        "label": ("sst2", "train.tsv", "sentence\tlabel\nfine\t2\n", "label '2' is not 0 or 1"),
        "missing": ("sst2", "dev.tsv", None, "dev.tsv not in"),
    }
    for name, (dataset, file, content, _) in cases.items():
        folder = tmp_path / name / dataset
        shutil.copytree(task_root / dataset, folder)
        if content is None:
            (folder / file).unlink()
        else:
            (folder / file).write_text(content)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logs = ""
    for dataset in ("conll2003", "sst2"):
        roots = ",".join(str(tmp_path / n) for n, c in cases.items() if c[0] == dataset)
        splits = ("train", "dev", "test") if dataset == "conll2003" else ("train", "dev")
        unpin = [f"data.splits.{s}.sha256=null" for s in splits]
        unpin += ["data.splits.dev.url=null"] if dataset == "sst2" else []  # no download try
        proc = run_cli(
            "--multirun", f"data={dataset}", f"data.root={roots}", *unpin, "model=tiny",
            f"tracking.uri={store}", f"hydra.sweep.dir={tmp_path / dataset}",
        )  # fmt: skip
        assert proc.returncode != 0
        logs += proc.stdout
    errors = [line for line in logs.splitlines() if "][ERROR] - " in line]
    assert len(errors) == len(cases)
    for name, (_, _, _, message) in cases.items():
        (line,) = [e for e in errors if f"/{name}/" in e]
        assert message in line, (name, line)
    assert logged_runs(store) == []  # nothing tracked for any of them


def test_sst2_counts_and_labels():
    train, dev = sst2.read_sst2(SST2 / "train.tsv"), sst2.read_sst2(SST2 / "dev.tsv")
    assert len(train) == 67349 and len(dev) == 872
    assert sum(s.labels == ("positive",) for s in train) == 37569
    assert sum(s.labels == ("negative",) for s in dev) == 428
    assert dev[0] == Sentence(
        ("it 's a charming and often affecting journey .",), ("positive",), (2,)
    )  # the trailing space before the tab is not part of the sentence


def test_sst2_malformed_input_names_file_and_line(tmp_path):
    bad = tmp_path / "test.tsv"
    bad.write_text("index\tsentence\n0\tuneasy mishmash\n")
    with pytest.raises(AblateError, match=r"test.tsv:1: header .* test.tsv has no labels"):
        sst2.read_sst2(bad)
    bad.write_text("sentence\tlabel\ngood\t1\nbad\t2\n")
    with pytest.raises(AblateError, match=r"test.tsv:3: label '2' is not 0 or 1"):
        sst2.read_sst2(bad)


def test_sst2_held_out_test_is_deterministic_disjoint_and_a_tenth():
    train = sst2.read_sst2(SST2 / "train.tsv")
    text = lambda s: s.words  # noqa: E731
    rest, held = hold_out(train, 0.1, 42, key=text)
    again_rest, again_held = hold_out(train, 0.1, 42, key=text)
    assert held == again_held and rest == again_rest
    # 10 %, rounded up, plus at most the repeats of the last text drawn
    assert 6735 <= len(held) < 6735 + 10 and len(rest) == 67349 - len(held)
    rows_held, rows_rest = {s.lines for s in held}, {s.lines for s in rest}
    assert not rows_held & rows_rest and len(rows_held | rows_rest) == len(train)
    # train.tsv repeats 371 of its sentences: a held-out text is never also a training text
    assert len({s.words for s in train}) < len(train)
    assert not {s.words for s in held} & {s.words for s in rest}
    assert [s.lines for s in held] == sorted(s.lines for s in held)  # file order kept
    assert hold_out(train, 0.1, 7, key=text)[1] != held
    row_rest, row_held = hold_out(train, 0.1, 42)  # without a key, each row on its own
    assert len(row_held) == 6735 and {s.words for s in row_held} & {s.words for s in row_rest}
    with pytest.raises(AblateError, match="test_from_train=1.5"):
        hold_out(train, 1.5, 42)


# --- metrics by hand ----------------------------------------------------------------------------


def test_seqeval_wiring_on_a_hand_checkable_case():
    names = ner.NER_TAGS
    ids = {n: i for i, n in enumerate(names)}
    x = IGNORE
    # two windows, padded; -100 = sub-word continuations and specials
    gold = [
        [x, "B-PER", "I-PER", x, "O", "B-LOC", x],
        [x, "B-ORG", "I-ORG", "O", "B-MISC", x, x],
    ]
    pred = [
        [0, "B-PER", "I-PER", 0, "O", "B-ORG", 0],  # PER right; LOC predicted as ORG
        [0, "B-ORG", "O", "O", "I-MISC", 0, 0],  # ORG cut short; I-MISC after O starts a MISC
    ]
    as_ids = [[ids[t] if isinstance(t, str) else t for t in row] for row in gold]
    pred_ids = [[ids[t] if isinstance(t, str) else t for t in row] for row in pred]
    ev = ner.evaluate_entities(np.array(pred_ids), np.array(as_ids), names)
    # gold entities: PER, LOC, ORG, MISC (4); predicted: PER, ORG(LOC span), ORG(short), MISC (4);
    # correct: PER and MISC (default, conlleval-like mode)
    assert ev.metrics["precision"] == pytest.approx(2 / 4)
    assert ev.metrics["recall"] == pytest.approx(2 / 4)
    assert ev.metrics["f1"] == pytest.approx(0.5)
    assert ev.metrics["accuracy"] == pytest.approx(5 / 8)  # 8 labelled words, 3 wrong tags
    assert ev.metrics["words"] == 8
    assert ev.gold.tolist() == [i for row in as_ids for i in row if i != x]
    report_json = ev.artifacts["classification_report.json"]
    assert report_json["PER"]["f1-score"] == 1.0 and report_json["LOC"]["recall"] == 0.0
    assert "micro avg" in ev.artifacts["classification_report.txt"]
    # the same windows in another order (the Trainer's length-sorted evaluation): same scores
    swapped = ner.evaluate_entities(np.array(pred_ids[::-1]), np.array(as_ids[::-1]), names)
    assert swapped.metrics == ev.metrics


def test_sequence_metrics_and_confusion_matrix():
    gold = np.array([0, 0, 1, 1, 1])
    pred = np.array([0, 1, 1, 1, 0])
    ev = sst2.evaluate_sequences(pred, gold, sst2.SST2_LABELS)
    assert ev.metrics["accuracy"] == pytest.approx(3 / 5)
    assert ev.metrics["f1"] == pytest.approx(2 / 3)  # positive: precision 2/3, recall 2/3
    assert ev.metrics["sentences"] == 5
    assert ev.artifacts["confusion_matrix.json"] == {
        "labels": ["negative", "positive"],
        "matrix": [[1, 1], [1, 2]],
    }
    assert ev.artifacts["confusion_matrix.txt"].splitlines()[2].split() == ["positive", "1", "2"]


# --- configuration ------------------------------------------------------------------------------


def test_datasets_pick_their_task_and_models_compose():
    ner = compose_cfg("data=conll2003")
    assert ner.data.task == "ner" and not ner.data.lowercase and ner.data.test_from_train is None
    assert ner.data.splits.dev.file == "valid.txt" and "suryasumukh" in ner.data.splits.dev.url
    sst = compose_cfg("data=sst2")
    assert sst.data.task == "sst2" and sst.data.test_from_train == 0.1 and sst.data.split_seed == 42
    assert sorted(sst.data.splits) == ["dev", "train"]
    assert compose_cfg("model=bert_base_cased").model.name_or_path == "bert-base-cased"
    assert compose_cfg("model=distilbert_base_uncased").model.name_or_path == (
        "distilbert-base-uncased"
    )
    assert {n: t.primary_metric for n, t in tasks.TASKS.items()} == {
        "pos": "accuracy",
        "ner": "f1",
        "sst2": "accuracy",
    }
    # the report reads a run's primary metric from what it logged, not from this registry
    assert primary_metric({"best_dev_f1": 0.5, "dev_accuracy": 0.9}) == "f1"
    assert primary_metric({"best_dev_accuracy": 0.5, "dev_f1": 0.9}) == "accuracy"


def test_the_real_files_verify_against_their_pins():
    for name in ("conll2003", "sst2"):
        cfg = compose_cfg(f"data={name}", f"data.root={DATA}").data
        found = files.locate(cfg)
        assert found.sha256 == {s: cfg.splits[s].sha256 for s in found.paths}


def test_absent_data_is_an_error_saying_where_to_put_it(tmp_path):
    # (the CLI shows an AblateError as one line: tests/test_download.py)
    empty = tmp_path / "empty"
    empty.mkdir()
    cfg = compose_cfg("data=sst2", f"data.root={empty}")
    cfg.data.splits.train.url = "http://127.0.0.1:9/train.tsv"  # nothing listens
    with pytest.raises(AblateError) as err:
        files.locate(cfg.data)
    message = str(err.value)
    assert message.startswith(f"data=sst2: train.tsv, dev.tsv not in {empty / 'sst2'}")
    assert (
        "downloading them failed (" in message
        and "set data.root to a folder holding sst2/" in message
    )
    assert not (empty / "sst2" / "train.tsv").exists()
    cfg = compose_cfg("data=conll2003", f"data.root={empty}", "data.splits.dev.url=null")
    (empty / "conll2003").mkdir(parents=True)
    (empty / "conll2003" / "train.txt").write_text("EU NNP I-NP I-ORG\n")
    with pytest.raises(
        AblateError, match=r"valid.txt, test.txt not in .*data.splits.dev.url is not set"
    ):
        files.locate(cfg.data)


def test_a_changed_file_fails_its_pin_unless_unpinned(task_root):
    cfg = compose_cfg("data=conll2003", f"data.root={task_root}").data
    with pytest.raises(AblateError, match=r"train.txt: sha256 .* data.splits.train.sha256=null"):
        files.locate(cfg)
    unpinned = compose_cfg("data=conll2003", f"data.root={task_root}", *UNPIN).data
    assert set(files.locate(unpinned).paths) == {"train", "dev", "test"}


def test_bilstm_head_and_extra_tests_are_for_token_tasks(task_root, store):
    with pytest.raises(AblateError, match="bilstm labels every token"):
        fit(store, "data=sst2", f"data.root={task_root}", *UNPIN[:2], "model=tiny",
            "model.head=bilstm")  # fmt: skip
    with pytest.raises(AblateError, match="task 'ner' cannot score extra test files .*pos"):
        fit(store, "data=conll2003", f"data.root={task_root}", *UNPIN, "model=tiny",
            f"data.extra_test=[{EWT / 'en_ewt-ud-test.conllu'}]")  # fmt: skip


# --- real runs ----------------------------------------------------------------------------------


def test_ner_run_with_minilm(task_root, store, tmp_path):
    cfg, run, results = fit(
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
    assert run.info.run_name == "sst2-all-minilm-s42 embeddings=true epochs=1"
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
    _, run, results = fit(
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
    _, run, results = fit(
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
        fit(store, *base, "trainer.early_stopping_patience=0")


def test_naija_tagger_scored_zero_shot_on_an_extra_treebank(slice_root, store, tmp_path):
    blocks = conllu_blocks(EWT / "en_ewt-ud-test.conllu")[:30]
    ewt = write_treebank(tmp_path / "UD_English-EWT", "en_ewt", {"test": blocks})
    path = ewt / "en_ewt-ud-test.conllu"
    base = naija(slice_root, store)
    _, run, results = fit(store, *base, "trainer.epochs=1", f"data.extra_test=[{path}]")
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
        fit(store, *base, "trainer.epochs=1", f"data.extra_test=[{bad}]")
    with pytest.raises(AblateError, match="data.extra_test: nowhere.conllu: no such file"):
        fit(store, *base, "trainer.epochs=1", "data.extra_test=[nowhere.conllu]")


def test_extra_test_config_is_a_list_of_paths():
    cfg = compose_cfg("data.extra_test=[a/b.conllu,c.conllu]")
    assert OmegaConf.to_container(cfg.data.extra_test) == ["a/b.conllu", "c.conllu"]
    assert compose_cfg().data.extra_test == []
