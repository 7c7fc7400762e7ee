"""Reading CoNLL-U and locating split files on real UD data."""

from __future__ import annotations

import shutil

import pytest
from conftest import EWT, NAIJA, conllu_blocks, write_treebank
from omegaconf import OmegaConf

from ablate.data import files
from ablate.data.sentences import check_labels
from ablate.errors import AblateError
from ablate.tasks.pos import UPOS, read_conllu

# EWT dev sentence with a multiword token (1-2 It's) and two empty nodes (10.1, 21.1).
MWT_AND_EMPTY = "answers-20111108072305AAPJTjj_ans-0005"


def ud_cfg(root, treebank, **extra):
    return OmegaConf.create(
        {"name": treebank, "root": str(root), "dir": f"ud/{treebank}", "splits": {}, **extra}
    )


def test_multiword_ranges_and_empty_nodes_are_skipped(tmp_path):
    block = next(b for b in conllu_blocks(EWT / "en_ewt-ud-dev.conllu") if MWT_AND_EMPTY in b)
    rows = [line.split("\t") for line in block.splitlines() if not line.startswith("#")]
    words = [r for r in rows if r[0].isdigit()]
    assert len(words) < len(rows)  # the sentence really has ranges and empty nodes
    path = tmp_path / "one.conllu"
    path.write_text(block + "\n", encoding="utf-8")
    (sentence,) = read_conllu(path)
    assert sentence.words == tuple(r[1] for r in words)
    assert sentence.labels == tuple(r[3] for r in words)
    assert "It's" not in sentence.words and sentence.words[:2] == ("It", "'s")
    (lower,) = read_conllu(path, lowercase=True)
    assert lower.words[0] == "it" and lower.labels == sentence.labels


def test_word_counts_match_the_treebank_statistics():
    # stats.xml of UD_Naija-NSC r2.16: dev 990 sentences / 14571 tokens
    sentences = read_conllu(NAIJA / "pcm_nsc-ud-dev.conllu")
    assert len(sentences) == 990
    assert sum(len(s.words) for s in sentences) == 14571
    check_labels(sentences, UPOS, "naija dev")


def test_label_outside_the_upos_inventory_names_file_line_and_tag(tmp_path):
    blocks = conllu_blocks(NAIJA / "pcm_nsc-ud-dev.conllu")[:2]
    text = "\n".join(blocks).replace("\tNOUN\t", "\tNOUN2\t", 1)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "\tNOUN2\t" in row)
    path = tmp_path / "bad.conllu"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(
        AblateError, match=rf"bad\.conllu:{line}: word .* has label 'NOUN2', not one of ADJ"
    ):
        check_labels(read_conllu(path), UPOS, str(path))


GOOD = "1\tdem\tdem\tPRON\t_\t_\t2\tnsubj\t_\t_"


@pytest.mark.parametrize(
    ("lines", "bad_line", "message"),
    [
        (
            ["# sent_id = a", GOOD, "2\tgo\tgo\tAUX"],
            3,
            "4 tab-separated columns; CoNLL-U lines have 10",
        ),
        ([GOOD, GOOD.replace("1", "x", 1)], 2, "id 'x' is not a word id"),
        ([GOOD, GOOD.replace("1", "3", 1)], 2, "word id 3 where 2 was expected"),
        ([GOOD.replace("\tdem\tdem", "\tdem  x\tdem  x")], 1, "a column holds two spaces in a row"),
        ([GOOD, GOOD.replace("\t2\t", "\tx\t").replace("1", "2", 1)], "1-2", "Failed parsing"),
    ],
    ids=["columns", "non-integer-id", "broken-sentence", "double-space", "bad-head"],
)
def test_malformed_conllu_names_file_and_line(tmp_path, lines, bad_line, message):
    path = tmp_path / "broken.conllu"
    good_sentence = conllu_blocks(NAIJA / "pcm_nsc-ud-dev.conllu")[0]
    text = good_sentence + "\n" + "\n".join(lines) + "\n"
    path.write_text(text, encoding="utf-8")
    offset = len(good_sentence.splitlines()) + 1  # the first sentence and its blank line
    if isinstance(bad_line, str):  # a span: the sentence's lines
        where = "-".join(str(offset + int(n)) for n in bad_line.split("-"))
    else:
        where = offset + bad_line
    with pytest.raises(AblateError, match=rf"broken\.conllu:{where}: {message}"):
        read_conllu(path)


def test_empty_split_file_is_an_error(tmp_path):
    path = tmp_path / "x-ud-dev.conllu"
    path.write_text("\n", encoding="utf-8")
    with pytest.raises(AblateError, match="x-ud-dev.conllu: no sentences"):
        read_conllu(path)


def test_user_treebank_is_found_by_the_ud_naming_pattern(slice_root):
    found = files.locate(ud_cfg(slice_root, "UD_Naija-Slice"))
    assert {s: p.name for s, p in found.paths.items()} == {
        "train": "pcm_slice-ud-train.conllu",
        "dev": "pcm_slice-ud-dev.conllu",
        "test": "pcm_slice-ud-test.conllu",
    }
    assert found.sha256["dev"] == files.sha256_of(found.paths["dev"])


def test_missing_or_ambiguous_split_files_are_clear_errors(tmp_path):
    with pytest.raises(AblateError, match="UD_Nowhere does not exist"):
        files.locate(ud_cfg(tmp_path, "UD_Nowhere"))
    blocks = conllu_blocks(NAIJA / "pcm_nsc-ud-dev.conllu")[:3]
    folder = write_treebank(tmp_path / "ud" / "UD_Two", "a", {"train": blocks, "dev": blocks})
    with pytest.raises(AblateError, match=r"expected exactly one \*-ud-test\.conllu file, found 0"):
        files.locate(ud_cfg(tmp_path, "UD_Two"))
    write_treebank(folder, "a", {"test": blocks})
    write_treebank(folder, "b", {"test": blocks})
    with pytest.raises(AblateError, match="found 2 .a-ud-test.conllu, b-ud-test.conllu"):
        files.locate(ud_cfg(tmp_path, "UD_Two"))


def test_pinned_release_with_altered_file_is_refused(tmp_path):
    from hydra import compose, initialize_config_dir

    from ablate.config import conf_dir

    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("train", overrides=["data=naija", f"data.root={tmp_path}"]).data
    shutil.copytree(NAIJA, tmp_path / "ud" / "UD_Naija-NSC")
    assert files.locate(cfg).sha256["test"] == cfg.splits.test.sha256
    dev = tmp_path / "ud" / "UD_Naija-NSC" / "pcm_nsc-ud-dev.conllu"
    dev.write_text(dev.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    with pytest.raises(
        AblateError, match="pcm_nsc-ud-dev.conllu: sha256 .* differs from the pinned"
    ):
        files.locate(cfg)
