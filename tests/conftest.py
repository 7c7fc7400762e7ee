"""Shared fixtures: offline hub, real data slices, a temporary MLflow store, the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
os.environ.setdefault("ABLATE_DATA_DIR", str(SHARED_DATA))
DATA = Path(os.environ["ABLATE_DATA_DIR"])
NAIJA = DATA / "ud" / "UD_Naija-NSC"
EWT = DATA / "ud" / "UD_English-EWT"


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


@pytest.fixture(scope="session")
def slice_root(tmp_path_factory) -> Path:
    """A data root with ``ud/UD_Naija-Slice``: the first 120/40/40 real Naija sentences."""
    root = tmp_path_factory.mktemp("data")
    blocks = {s: conllu_blocks(NAIJA / f"pcm_nsc-ud-{s}.conllu") for s in ("train", "dev", "test")}
    write_treebank(
        root / "ud" / "UD_Naija-Slice",
        "pcm_slice",
        {"train": blocks["train"][:120], "dev": blocks["dev"][:40], "test": blocks["test"][:40]},
    )
    return root


@pytest.fixture
def store(tmp_path) -> str:
    """A fresh sqlite MLflow store in a temporary folder."""
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def slice_overrides(slice_root: Path, store: str, out: Path) -> list[str]:
    """Overrides for a fast real run on the Naija slice with the tiny model."""
    return [
        "data=ud",
        "data.treebank=UD_Naija-Slice",
        f"data.root={slice_root}",
        "model=tiny",
        "trainer.epochs=2",
        f"tracking.uri={store}",
        f"hydra.run.dir={out}/run",
        f"hydra.sweep.dir={out}/sweep",
    ]


def logged_runs(store: str, experiment: str = "ablate") -> list:
    """Every run of ``experiment`` in the MLflow store ``store``, read with MlflowClient."""
    client = MlflowClient(store)
    found = client.get_experiment_by_name(experiment)
    return client.search_runs([found.experiment_id]) if found else []


def run_cli(*args: str, cwd: Path = ROOT, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m ablate.train ARGS`` in a real subprocess."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run(
        [sys.executable, "-m", "ablate.train", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
