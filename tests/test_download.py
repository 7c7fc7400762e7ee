"""Downloading pinned files, against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import pytest
from helpers.data import NAIJA, digest
from helpers.runs import run_cli
from helpers.store import logged_runs
from omegaconf import OmegaConf

from ablate.data import files
from ablate.errors import AblateError


def test_good_download_is_kept(server, tmp_path):
    url, served = server
    dest = tmp_path / "cache" / "ud" / "UD_Naija-NSC" / "pcm_nsc-ud-dev.conllu"
    files.fetch(f"{url}/pcm_nsc-ud-dev.conllu", digest(served / "pcm_nsc-ud-dev.conllu"), dest)
    assert dest.read_bytes() == (NAIJA / "pcm_nsc-ud-dev.conllu").read_bytes()


def test_sha256_mismatch_is_a_clear_error_and_nothing_is_kept(server, tmp_path):
    url, _ = server
    dest = tmp_path / "cache" / "pcm_nsc-ud-dev.conllu"
    with pytest.raises(AblateError, match="failed its sha256 check.*not kept"):
        files.fetch(f"{url}/pcm_nsc-ud-dev.conllu", "0" * 64, dest)
    assert list(dest.parent.iterdir()) == []


def test_locate_downloads_missing_pinned_splits_into_the_root(server, tmp_path):
    url, served = server
    splits = {
        s: {"file": f"pcm_nsc-ud-{s}.conllu", "url": f"{url}/pcm_nsc-ud-{s}.conllu",
            "sha256": digest(served / f"pcm_nsc-ud-{s}.conllu")}
        for s in ("train", "dev", "test")
    }  # fmt: skip
    root = tmp_path / "root"
    root.mkdir()
    cfg = OmegaConf.create(
        {
            "name": "naija",
            "version": "2.16",
            "root": str(root),
            "dir": "ud/UD_Naija-NSC",
            "splits": splits,
        }
    )
    found = files.locate(cfg)
    assert all(
        p.parent == root / "ud" / "UD_Naija-NSC" and p.is_file() for p in found.paths.values()
    )
    assert found.sha256 == {s: spec["sha256"] for s, spec in splits.items()}


def test_cli_without_data_or_network_prints_one_line_saying_how_to_provide_it(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = run_cli(
        "data=naija",
        f"data.root={tmp_path / 'empty'}",
        "data.splits.train.url=http://127.0.0.1:9/pcm_nsc-ud-train.conllu",  # nothing listens
        f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
        f"hydra.run.dir={tmp_path / 'out'}",
        "model=tiny",
    )
    assert proc.returncode == 2
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "ERROR" in line]
    assert len(errors) == 1, errors
    # which files, where it looked, the two ways to provide them; short
    folder = tmp_path / "empty" / "ud" / "UD_Naija-NSC"
    for needle in ("pcm_nsc-ud-train.conllu", "pcm_nsc-ud-test.conllu", str(folder),
                   "downloading them failed", "data.root", "internet"):  # fmt: skip
        assert needle in errors[0], needle
    assert len(errors[0]) < 600 + 2 * len(str(folder))
    assert "Traceback" not in proc.stderr
    assert (proc.stdout + proc.stderr).count("downloading http") == 1  # tried once, not per lookup
    assert not (folder / "pcm_nsc-ud-train.conllu").exists()
    assert not logged_runs(f"sqlite:///{tmp_path / 'mlflow.db'}")  # nothing tracked
