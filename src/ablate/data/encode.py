"""Word-to-sub-word label alignment: a labelled sentence becomes model inputs (tasks that label
every word: ``pos``, ``ner``)."""

from __future__ import annotations

from collections.abc import Sequence

from ablate.data.sentences import Sentence
from ablate.errors import AblateError

IGNORE = -100  # label id that the loss and the metrics skip (sub-word continuations, specials)


def encode_words(
    sentences: Sequence[Sentence],
    tokenizer,
    label2id: dict[str, int],
    max_length: int,
    stats: dict[str, int] | None = None,
) -> list[dict[str, list[int]]]:
    """Tokenise sentences into model inputs whose first sub-word of each word carries its label.

    A sentence longer than ``max_length`` sub-words is split into consecutive windows of whole
    words, so every gold word is scored exactly once (the tokenizer's own overflow handling
    splits inside words and overlaps windows, which would drop or double-count words).
    A word that the tokenizer maps to nothing is replaced by the unknown token, so it is still
    scored; a single word longer than a window keeps its first sub-words. ``stats``, if given,
    receives the counts of ``empty_sentences``, ``windowed_sentences`` and ``truncated_words``.
    """
    counts = {"empty_sentences": 0, "windowed_sentences": 0, "truncated_words": 0}
    if stats is not None:
        stats.update(counts)
        counts = stats
    budget = max_length - tokenizer.num_special_tokens_to_add(pair=False)
    if budget < 1:
        raise AblateError(f"data.max_length={max_length} leaves no room for words")
    counts["empty_sentences"] += sum(1 for s in sentences if not s.words)
    sentences = [s for s in sentences if s.words]
    if not sentences:
        return []
    pieces = tokenizer(
        [list(s.words) for s in sentences], is_split_into_words=True, add_special_tokens=False
    )
    windows: list[list[str]] = []
    window_labels: list[list[int]] = []
    for row, sentence in enumerate(sentences):
        n_pieces = [0] * len(sentence.words)
        for word in pieces.word_ids(row):
            n_pieces[word] += 1
        words: list[str] = []
        ids: list[int] = []
        used = 0
        counts["windowed_sentences"] += sum(max(n, 1) for n in n_pieces) > budget
        for word, n, label in zip(sentence.words, n_pieces, sentence.labels, strict=True):
            cost = min(max(n, 1), budget)
            counts["truncated_words"] += n > budget
            if words and used + cost > budget:
                windows.append(words)
                window_labels.append(ids)
                words, ids, used = [], [], 0
            words.append(word if n else tokenizer.unk_token)
            ids.append(label2id[label])
            used += cost
        windows.append(words)
        window_labels.append(ids)

    enc = tokenizer(windows, is_split_into_words=True, truncation=True, max_length=max_length)
    features = []
    for row, word_labels in enumerate(window_labels):
        labels, previous = [], None
        for word in enc.word_ids(row):
            labels.append(word_labels[word] if word is not None and word != previous else IGNORE)
            previous = word
        features.append(
            {
                "input_ids": enc["input_ids"][row],
                "attention_mask": enc["attention_mask"][row],
                "labels": labels,
            }
        )
    return features


def count_scored(features: Sequence[dict]) -> int:
    """Number of items (words; a sentence's one label) that carry a label in encoded features."""
    return sum(
        sum(1 for label in f["labels"] if label != IGNORE)
        if isinstance(f["labels"], (list, tuple))
        else int(f["labels"] != IGNORE)
        for f in features
    )
