"""Where the repository and the shared data are, and real data slices written for a test."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# tests/conftest.py sets ABLATE_DATA_DIR to this default when unset, for the CLI it starts too
DATA = Path(os.environ.get("ABLATE_DATA_DIR", ROOT.parent / "shared" / "data"))
NAIJA = DATA / "ud" / "UD_Naija-NSC"
EWT = DATA / "ud" / "UD_English-EWT"
# The NER and SST-2 files under the shared data root, and overrides that read a slice of them
CONLL = DATA / "conll2003"
SST2 = DATA / "sst2"
UNPIN = [f"data.splits.{s}.sha256=null" for s in ("train", "dev", "test")]


def conllu_blocks(path: Path) -> list[str]:
    """The sentence blocks of a CoNLL-U file, as raw text (comments included)."""
    text = path.read_text(encoding="utf-8")
    return [b.strip("\n") + "\n" for b in text.split("\n\n") if b.strip()]


def write_treebank(folder: Path, prefix: str, splits: dict[str, list[str]]) -> Path:
    """Write ``<prefix>-ud-<split>.conllu`` files from sentence blocks."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, blocks in splits.items():
        (folder / f"{prefix}-ud-{split}.conllu").write_text("\n".join(blocks) + "\n", "utf-8")
    return folder


def naija_slice(root: Path, name: str, train: int, held_out: int = 40) -> Path:
    """``root`` as a data root with ``ud/UD_Naija-<name>``: the first ``train`` real Naija
    training sentences and ``held_out`` each of dev and test."""
    blocks = {s: conllu_blocks(NAIJA / f"pcm_nsc-ud-{s}.conllu") for s in ("train", "dev", "test")}
    sizes = {"train": train, "dev": held_out, "test": held_out}
    write_treebank(
        root / "ud" / f"UD_Naija-{name}", f"pcm_{name.lower()}",
        {split: blocks[split][:n] for split, n in sizes.items()},
    )  # fmt: skip
    return root


def digest(path: Path) -> str:
    """The SHA-256 of a file, as the data configs pin it."""
    return hashlib.sha256(path.read_bytes()).hexdigest()
