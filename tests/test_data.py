"""Reading CoNLL-U and locating split files on real UD data."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from helpers.data import DATA, EWT, NAIJA, ROOT, conllu_blocks, digest, write_treebank
from helpers.runs import compose_cfg
from omegaconf import OmegaConf

from ablate import config
from ablate.data import files
from ablate.data.read import read_checked
from ablate.data.sentences import check_labels
from ablate.errors import AblateError
from ablate.tasks.pos import UPOS, read_conllu
from ablate.training.prepare import cache_dir

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


parsed: list[Path] = []


def counted_read(path, lowercase=False):
    """read_conllu, noting each file it really parses."""
    parsed.append(path)
    return read_conllu(path, lowercase=lowercase)


def test_read_cache_serves_the_same_bytes_again_and_never_an_error(tmp_path):
    blocks = conllu_blocks(NAIJA / "pcm_nsc-ud-dev.conllu")[:30]
    first, copy = tmp_path / "a.conllu", tmp_path / "copy" / "b.conllu"
    first.write_text("\n".join(blocks), encoding="utf-8")
    copy.parent.mkdir()
    shutil.copy(first, copy)
    cache, parsed[:] = tmp_path / "cache", []

    def read(path, lowercase=False):
        return read_checked(path, counted_read, UPOS, lowercase, cache, files.sha256_of(path))

    direct = read_conllu(first)
    assert read(first) == direct and parsed == [first]
    assert read(copy) == direct and parsed == [first]  # a copy's bytes: from the cache
    assert read(first, lowercase=True)[0].words == tuple(w.lower() for w in direct[0].words)
    assert len(parsed) == 2  # lowercased is another entry
    first.write_text("\n".join(blocks[:10]), encoding="utf-8")
    assert read(first) == direct[:10] and len(parsed) == 3  # new bytes are parsed
    bad = tmp_path / "bad.conllu"
    bad.write_text("\n".join(blocks[:2]).replace("\tNOUN\t", "\tNOUN2\t", 1), encoding="utf-8")
    for _ in range(2):  # an error is raised each time, never served from the cache
        with pytest.raises(AblateError, match="bad.conllu:.*'NOUN2'"):
            read(bad)
    assert parsed[-2:] == [bad, bad]
    assert read_checked(copy, counted_read, UPOS, False) == direct and parsed[-1] == copy  # off

    def local(path, lowercase=False):  # a reader that cannot be pickled is cached by its name
        return counted_read(path, lowercase)

    before = len(parsed)
    for _ in range(2):
        assert read_checked(copy, local, UPOS, False, cache, files.sha256_of(copy)) == direct
    assert parsed[before:] == [copy]  # new to this reader, then from the cache


def test_a_cache_folder_that_cannot_be_made_is_one_error_naming_the_key(tmp_path):
    (tmp_path / "a-file").write_text("")
    cfg = compose_cfg(f"data.tokenized_cache_dir={tmp_path / 'a-file' / 'cache'}")
    with pytest.raises(AblateError, match=r"data.tokenized_cache_dir=.*a-file/cache: cannot keep"):
        cache_dir(cfg.data)
    assert cache_dir(compose_cfg("data.tokenized_cache=false").data) is None
    made = tmp_path / "new" / "cache"
    assert cache_dir(compose_cfg(f"data.tokenized_cache_dir={made}").data) == made and made.is_dir()


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
    with pytest.raises(AblateError, match=r"data.dir=ud/UD_Nowhere: no folder .*UD_Nowhere, and "):
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
    cfg = compose_cfg("data=naija", f"data.root={tmp_path}").data
    shutil.copytree(NAIJA, tmp_path / "ud" / "UD_Naija-NSC")
    assert files.locate(cfg).sha256["test"] == cfg.splits.test.sha256
    dev = tmp_path / "ud" / "UD_Naija-NSC" / "pcm_nsc-ud-dev.conllu"
    dev.write_text(dev.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    with pytest.raises(
        AblateError, match="pcm_nsc-ud-dev.conllu: sha256 .* differs from the pinned"
    ):
        files.locate(cfg)


def test_the_settings_file_errors_name_is_the_one_make_setup_writes():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^LOCAL := (\S+)$", makefile, re.M).group(1) == files.LOCAL_SETTINGS
    train = OmegaConf.load(ROOT / "conf" / "train.yaml")
    assert {"optional local": "default"} in train.defaults  # conf/local/default.yaml
    assert files.LOCAL_SETTINGS == "conf/local/default.yaml"


def test_wrong_treebank_lists_the_treebanks_there_and_suggests_the_close_one():
    there = sorted(p.name for p in (DATA / "ud").iterdir() if p.is_dir())
    assert "UD_Naija-NSC" in there and "UD_English-EWT" in there
    for wrong, suggested in (("UD_Nonexistent", None), ("UD_Naija", "UD_Naija-NSC")):
        cfg = compose_cfg("data=ud", f"data.treebank={wrong}", f"data.root={DATA}").data
        with pytest.raises(AblateError) as err:
            files.locate(cfg)
        message = str(err.value)
        assert message.startswith(f"data.treebank={wrong}: no folder {DATA / 'ud' / wrong}")
        assert f"Treebanks in {DATA / 'ud'}: {', '.join(there)}" in message
        if suggested:
            assert message.endswith(f"did you mean data.treebank={suggested}?")
        else:
            assert "did you mean" not in message
        assert "data.root" not in message  # the root is right; the treebank is not
        assert not (DATA / "ud" / wrong).exists()


@pytest.mark.parametrize("data", ["ud", "naija"])
def test_missing_root_is_one_error_saying_how_to_set_it_and_creates_nothing(tmp_path, data):
    root = tmp_path / "no" / "such" / "root"
    cfg = compose_cfg(f"data={data}", "data.treebank=UD_Naija-NSC", f"data.root={root}").data
    with pytest.raises(AblateError) as err:
        files.locate(cfg)
    message = str(err.value)
    assert message.startswith(
        f"data.root={root} does not exist (data={cfg.name}): set data.root to a folder holding "
        "ud/UD_Naija-NSC/ (in conf/local/default.yaml, which `make setup` writes; with "
        "ABLATE_DATA_DIR; or on the command line)"
    )
    # a pinned release says how to download it there; nothing is fetched into a missing root
    assert ("create it to download naija" in message) == (data == "naija")
    assert not (tmp_path / "no").exists()
    (tmp_path / "file").write_text("x")
    cfg.root = str(tmp_path / "file")
    with pytest.raises(AblateError, match=r"file is not a folder .*conf/local/default\.yaml"):
        files.locate(cfg)


def test_failed_download_says_where_to_set_the_root(tmp_path):
    cfg = compose_cfg("data=naija", f"data.root={tmp_path}").data
    cfg.splits.train.url = "http://127.0.0.1:9/pcm_nsc-ud-train.conllu"  # nothing listens
    with pytest.raises(
        AblateError, match=r"downloading them failed .*UD_Naija-NSC/ \(in conf/local/default.yaml"
    ):
        files.locate(cfg)
    assert not (tmp_path / "ud" / "UD_Naija-NSC" / "pcm_nsc-ud-train.conllu").exists()


def test_download_into_the_user_cache_creates_the_cache(server, tmp_path, monkeypatch):
    url, served = server
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cache = config.user_cache()
    assert cache.is_relative_to(tmp_path) and not cache.exists()
    cfg = compose_cfg("data=naija", f"data.root={cache}").data
    for split in files.SPLITS:
        name = cfg.splits[split].file
        cfg.splits[split].url = f"{url}/{name}"
        assert cfg.splits[split].sha256 == digest(served / name)  # the pinned release
    found = files.locate(cfg)
    assert all(p.parent == cache / "ud" / "UD_Naija-NSC" for p in found.paths.values())
    assert found.paths["dev"].read_bytes() == (NAIJA / "pcm_nsc-ud-dev.conllu").read_bytes()
