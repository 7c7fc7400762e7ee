"""A hostile archive imports nothing: a symbolic link anywhere in it (a file, a folder, the
archive folder itself), a run id or a manifest name that leaves it, is refused with one error
naming the path, before the store is touched; what an import uploads is only the files the
manifest vouches for, read again when uploaded. Each attack as it was performed, on a tiny
archive written by hand as an export writes it."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from helpers.store import new_store
from mlflow.tracking import MlflowClient

from ablate import archive
from ablate.archive.__main__ import main as archive_main
from ablate.archive.export import write_manifest
from ablate.archive.import_ import import_archive
from ablate.errors import AblateError
from ablate.fileio import write_gzip

RUN = "0123456789abcdef0123456789abcdef"  # an MLflow run id, as an export writes it
SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- the host's own\n"


def _write_run(runs: Path, run_id: str) -> Path:
    folder = runs / run_id
    (folder / "artifacts").mkdir(parents=True)
    info = {"run_id": run_id, "run_name": "tiny", "experiment": "hostile", "status": "FINISHED",
            "start_time": 1000, "end_time": 2000, "lifecycle_stage": "active"}  # fmt: skip
    for name, value in (("info", info), ("params", {"freeze.name": "none"}),
                        ("tags", {archive.IDENTITY_TAG: "0" * 64}), ("inputs", [])):  # fmt: skip
        (folder / f"{name}.json").write_text(archive.dumps(value), encoding="utf-8")
    metrics = f"{archive.METRICS_HEADER}\ndev_accuracy\t0\t1500\t0.5\n"
    write_gzip(folder / archive.stored_name(archive.METRICS), metrics.encode())
    (folder / "artifacts" / "config.yaml").write_text("freeze: none\n", encoding="utf-8")
    return folder


def _archive(folder: Path, run_id: str = RUN) -> Path:
    """A one-run archive (version 2) in ``folder``, signed as an export signs it."""
    _write_run(folder / archive.RUNS, run_id)
    _index(folder, run_id)
    return folder


def _index(folder: Path, run_id: str) -> None:
    index = {"format": archive.FORMAT, "version": archive.VERSION,
             "scope": {"experiment": "hostile", "sweep": None},
             "report": ["python", "-m", "ablate.report", "--experiment", "hostile", "--all"],
             "runs": [{"run_id": run_id, "run_name": "tiny", "role": "run",
                       "experiment": "hostile"}]}  # fmt: skip
    (folder / archive.INDEX).write_text(archive.dumps(index), encoding="utf-8")
    (folder / archive.MANIFEST).unlink(missing_ok=True)
    write_manifest(folder)


@pytest.fixture
def secrets(tmp_path) -> Path:
    folder = tmp_path / "secrets"
    folder.mkdir()
    (folder / "id_rsa").write_text(SECRET)
    return folder


def _refused(folder: Path, tmp_path: Path, capsys) -> str:
    """The one error line of importing ``folder`` into a new store, which is not even made."""
    db = tmp_path / "store" / "mlflow.db"
    assert archive_main(["import", str(folder), "--uri", f"sqlite:///{db}"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert not db.exists()  # nothing imported: the store not even created
    return err[0]


def _uploaded(uri: str, tmp: Path) -> dict[str, bytes]:
    """Every artifact of every run of ``uri``, by run name and path."""
    client = MlflowClient(uri)
    out = {}
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id]):
            got = Path(client.download_artifacts(run.info.run_id, "", str(tmp / run.info.run_id)))
            for path in (p for p in got.rglob("*") if p.is_file()):
                out[f"{run.info.run_name}/{path.relative_to(got).as_posix()}"] = path.read_bytes()
    return out


def test_the_hand_written_archive_imports(tmp_path, capsys):
    """The archive the attacks start from is a good one: it imports, config.yaml and all."""
    good = _archive(tmp_path / "good")
    uri = new_store(tmp_path / "store")
    assert archive_main(["import", str(good), "--uri", uri]) == 0
    assert "imported 1 of 1 runs" in capsys.readouterr().out
    assert _uploaded(uri, tmp_path / "got") == {"tiny/config.yaml": b"freeze: none\n"}


def test_an_artifacts_folder_linked_to_secrets_uploads_nothing(tmp_path, secrets, capsys):
    # the attack: runs/<id>/artifacts a link to a secrets folder, the manifest written over
    # what rglob finds (it does not descend into the linked folder)
    evil = _archive(tmp_path / "evil")
    art = evil / archive.RUNS / RUN / "artifacts"
    shutil.rmtree(art)
    art.symlink_to(secrets, target_is_directory=True)
    (evil / archive.MANIFEST).unlink()
    write_manifest(evil)
    err = _refused(evil, tmp_path, capsys)
    assert f"{art}: a symbolic link" in err and "nothing was imported" in err
    assert "Export the archive again from its store" in err


@pytest.mark.parametrize("where", ["artifact", "json", "folder", "archive", "fifo"])
def test_a_link_anywhere_in_an_archive_is_refused_before_anything_is_imported(
    where, tmp_path, secrets, capsys
):
    evil = _archive(tmp_path / "evil")
    run = evil / archive.RUNS / RUN
    named = {"artifact": run / "artifacts" / "config.yaml", "json": run / "params.json",
             "folder": run / "artifacts", "archive": tmp_path / "link",
             "fifo": run / "artifacts" / "config.yaml"}[where]  # fmt: skip
    if where == "archive":  # the archive folder itself a link (to a good archive)
        named.symlink_to(evil, target_is_directory=True)
    elif where == "fifo":  # neither a file nor a folder: refused, never waited on
        named.unlink()
        os.mkfifo(named)
    else:
        if where == "folder":
            shutil.rmtree(named)
        else:
            named.unlink()
        named.symlink_to(secrets if where == "folder" else secrets / "id_rsa")
        (evil / archive.MANIFEST).unlink()
        write_manifest(evil)  # signed over the link's target where rglob follows it
    err = _refused(named if where == "archive" else evil, tmp_path, capsys)
    assert f"error: {named}: " in err, err
    said = "neither a plain file nor a folder" if where == "fifo" else "a symbolic link"
    assert said in err and "nothing was imported" in err
    if where == "archive":
        assert "pass the folder itself" in err


@pytest.mark.parametrize("run_id", ["ABSOLUTE", "../../outside", "..", "a/b", "", ".hidden"])
def test_a_run_id_that_leaves_the_archive_is_refused(run_id, tmp_path, capsys):
    # the attack: archive.json names as its run a folder outside the archive, whose files no
    # manifest lists (they were imported unchecked)
    outside = _write_run(tmp_path, "outside")
    (outside / "artifacts" / "id_rsa").write_text(SECRET)
    evil = _archive(tmp_path / "evil")
    run_id = str(outside) if run_id == "ABSOLUTE" else run_id
    _index(evil, run_id)
    err = _refused(evil, tmp_path, capsys)
    assert f"{evil / archive.INDEX}: its run 1 has the run id {run_id!r}" in err
    assert "not an MLflow run id" in err and "nothing was imported" in err


def test_a_manifest_name_that_leaves_the_archive_is_refused(tmp_path, capsys):
    # the attack: a SHA256SUMS line for a file outside the archive, with its right sha256
    secret = tmp_path / "etc" / "hostname"
    secret.parent.mkdir()
    secret.write_text("the-host\n")
    digest = hashlib.sha256(secret.read_bytes()).hexdigest()
    evil = _archive(tmp_path / "evil")
    up = os.path.relpath(secret, evil)  # ../etc/hostname
    for name in (up, "runs/../" + up, str(secret), "runs\\x", "./archive.json", "runs//x"):
        manifest = evil / archive.MANIFEST
        lines = manifest.read_text().splitlines()
        manifest.write_text("\n".join([*lines[:1], f"{digest}  {name}", *lines[1:]]) + "\n")
        err = _refused(evil, tmp_path, capsys)
        assert f"{manifest}: line 2 names {name!r}, not a path inside the archive" in err, err
        manifest.write_text("\n".join(lines) + "\n")
    assert archive.read(evil).runs[0].artifacts == ["config.yaml"]  # the archive was good


def test_a_file_swapped_after_the_check_is_not_uploaded(tmp_path, secrets):
    """What an import uploads is read again and checked against its sha256: a file replaced
    after ``read`` checked the archive (by a link, or new bytes) stops the import whole."""
    good = _archive(tmp_path / "good")
    held = archive.read(good)
    config = good / archive.RUNS / RUN / "artifacts" / "config.yaml"
    for swap in ("link", "bytes"):
        config.unlink()
        if swap == "link":
            config.symlink_to(secrets / "id_rsa")
        else:
            config.write_text(SECRET)
        uri = new_store(tmp_path / f"store-{swap}")
        with pytest.raises(AblateError, match="deleted again") as exc:
            import_archive(held, uri)
        assert str(config) in str(exc.value)
        assert _uploaded(uri, tmp_path / f"got-{swap}") == {}  # the run rolled back
        store = [p for p in (tmp_path / f"store-{swap}").rglob("*") if p.is_file()]
        assert store and not any(SECRET.encode() in p.read_bytes() for p in store)
