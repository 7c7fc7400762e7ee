"""The NER (CoNLL-2003) and SST-2 tasks, early stopping and zero-shot extra test sets: readers on
the real files, seqeval wiring by hand, the SST-2 hold-out, and real short runs per task."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from helpers.data import CONLL, DATA, EWT, SST2, UNPIN
from helpers.runs import compose_cfg, fit_run, run_cli
from helpers.store import logged_runs, new_store

from ablate import tasks
from ablate.data import files
from ablate.data.encode import IGNORE
from ablate.data.sentences import Sentence, check_labels, hold_out
from ablate.errors import AblateError
from ablate.tasks import ner, sst2
from ablate.tracking.params import primary_metric

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
    store = new_store(tmp_path)
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
        fit_run(store, "data=sst2", f"data.root={task_root}", *UNPIN[:2], "model=tiny",
            "model.head=bilstm")  # fmt: skip
    with pytest.raises(AblateError, match="task 'ner' cannot score extra test files .*pos"):
        fit_run(store, "data=conll2003", f"data.root={task_root}", *UNPIN, "model=tiny",
            f"data.extra_test=[{EWT / 'en_ewt-ud-test.conllu'}]")  # fmt: skip
