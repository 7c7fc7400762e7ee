"""A study's archive: a real tiny study (an lr study's trials, then a grid with a tuned strategy)
exported, imported into a new store and reported gives the same summary.csv; the same store
gives the same bytes; a second import adds nothing; bad archives and stores fail whole. Version 2
keeps metrics and predictions gzip-compressed; a version-1 archive (every file plain) still
imports, into the same store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.data import ROOT
from helpers.runs import fit_run, run_cli, slice_overrides
from helpers.store import new_store
from mlflow.tracking import MlflowClient

from ablate import archive, docs
from ablate.archive.__main__ import main as archive_main
from ablate.archive.export import write_manifest
from ablate.config import TUNED_TAG
from ablate.fileio import read_gzip
from ablate.report.cli import main as report_main

STUDY = "lr-slice-all"
PREDICTIONS = ("predictions/dev.json", "predictions/test.json")  # what a run's archive keeps
LR_EXPERIMENT = "t-lr"


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}  # fmt: skip


def _all_runs(store: str) -> list:
    """Every active run of every experiment of ``store``: what an import may add to."""
    client = MlflowClient(store)
    ids = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(ids) if ids else []


@pytest.fixture(scope="module")
def study(slice_root, tmp_path_factory) -> SimpleNamespace:
    """Two trials of an lr study of `all`, then a sweep of `none` and `all` at the study's best
    lr (the tiny model on the Naija slice), and its archive."""
    tmp = tmp_path_factory.mktemp("archive")
    store = new_store(tmp)
    base = [*slice_overrides(slice_root, store, tmp), "trainer.keep_model=false"]
    data = [o for o in base if not o.startswith(("hydra.", "tracking.uri"))]
    for lr in ("1e-3", "5e-3"):  # an lr study's trials: runs tagged study=<name>
        fit_run(
            store, *data, "freeze=all", f"trainer.lr={lr}",
            f"tracking.experiment={LR_EXPERIMENT}", f"+tracking.tags.study={STUDY}",
        )  # fmt: skip
    proc = run_cli(
        "--multirun", "freeze=none,all", "seed=1", "lr_study.freeze=[all]",
        f"lr_study.experiment={LR_EXPERIMENT}", *base, cwd=tmp,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp / "study-archive"
    assert archive_main(["export", "--uri", store, str(out)]) == 0
    return SimpleNamespace(tmp=tmp, store=store, archive=out, data=data)


def test_an_imported_study_reports_the_same_summary(study, tmp_path, capsys):
    read = archive.read(study.archive)
    assert read.counts() == {"run": 2, "sweep": 1, "trial": 2}
    scope = read.index["scope"]
    assert scope["sweep"] and read.index["report"][3:] == archive.report_args(scope)
    # every point of every metric, with its step and timestamp, and the report's predictions
    tuned = next(r for r in read.runs if TUNED_TAG in r.tags)
    client = MlflowClient(study.store)
    history = client.get_metric_history(tuned.run_id, "dev_accuracy")
    assert [(k, s, t) for k, s, t, _ in tuned.metrics if k == "dev_accuracy"] == [
        ("dev_accuracy", m.step, m.timestamp) for m in history
    ]
    assert {"predictions/dev.json", "predictions/test.json"} <= set(tuned.artifacts)
    assert tuned.inputs

    again = tmp_path / "again"
    assert archive_main(["export", "--uri", study.store, str(again)]) == 0
    assert _files(again) == _files(study.archive)  # the same store: the same bytes

    new = new_store(tmp_path / "new")
    assert archive_main(["import", str(study.archive), "--uri", new]) == 0
    assert "imported 5 of 5 runs" in capsys.readouterr().out
    before = sorted(r.info.run_id for r in _all_runs(new))
    assert archive_main(["import", str(study.archive), "--uri", new]) == 0
    assert "imported 0 of 5 runs" in capsys.readouterr().out
    assert sorted(r.info.run_id for r in _all_runs(new)) == before  # twice adds nothing

    summaries = []
    for uri, name in ((study.store, "original"), (new, "imported")):
        args = [*archive.report_args(scope), "--uri", uri, "--out", str(tmp_path / name)]
        assert report_main(args) == 0
        summaries.append((tmp_path / name / "summary.csv").read_bytes())
    assert summaries[0] == summaries[1]
    assert b"bootstrap" in summaries[0]  # one seed: the interval resampled the predictions
    # on test too, and McNemar's test read the imported test predictions
    assert b"paired bootstrap over test words (1 seed)" in summaries[0]
    assert b"exact, per seed on test words" in summaries[0] and b"1 of 1 seed" in summaries[0]

    # the imported runs are the store's own: identity, times, parents, the trial a lr came from
    mine = {r.data.tags[archive.ORIGIN_TAG]: r for r in _all_runs(new)}
    for run in read.runs:
        got = mine[run.run_id]
        assert got.info.start_time == run.info["start_time"]
        assert got.info.end_time == run.info["end_time"] and got.info.status == run.info["status"]
        assert got.data.tags.get(archive.IDENTITY_TAG) == run.tags.get(archive.IDENTITY_TAG)
        assert got.data.params == run.params
    parent = next(r for r in read.runs if r.tags.get("ablate.role") == "sweep")
    trials = [mine[r.run_id] for r in read.runs if r.tags.get("study") == STUDY]
    best = max(trials, key=lambda r: r.data.metrics["best_dev_accuracy"])
    imported = mine[tuned.run_id]
    assert imported.data.tags["mlflow.parentRunId"] == mine[parent.run_id].info.run_id
    assert imported.data.tags[TUNED_TAG] == best.info.run_id
    assert best.data.params["trainer.lr"] == imported.data.params["trainer.lr"]

    # skip_finished finds the imported run as the twin of its config
    from ablate.tracking.run import finished_twin

    none = next(r for r in read.runs if r.params.get("freeze.name") == "none")
    cfg = study_cfg(study, new, "freeze=none", "seed=1")
    assert finished_twin(cfg).info.run_id == mine[none.run_id].info.run_id


def test_an_archive_narrowed_to_one_strategy_holds_its_runs_and_its_study(study, tmp_path, capsys):
    out = tmp_path / "all-only"
    argv = ["export", str(out), "--uri", study.store, "--all", "--freeze", "all"]
    assert archive_main(argv) == 0
    read = archive.read(out)
    # the tuned run, its lr study's two trials and its sweep: not the `none` run beside it
    assert read.counts() == {"run": 1, "sweep": 1, "trial": 2}
    assert {r.params["freeze.name"] for r in read.runs if "freeze.name" in r.params} == {"all"}
    assert read.index["scope"]["freeze"] == ["all"]
    assert read.index["report"][3:] == archive.report_args(read.index["scope"])
    assert "--freeze" in read.index["report"]
    capsys.readouterr()
    assert report_main([*archive.report_args(read.index["scope"]), "--uri", study.store,
                        "--out", str(tmp_path / "rep"), "--baseline", "all"]) == 0  # fmt: skip
    assert "1 runs used" in capsys.readouterr().out


def study_cfg(study, store: str, *overrides: str):
    """The config of one of the grid's jobs, tracked in ``store``."""
    from ablate.config import compose

    return compose(*study.data, f"tracking.uri={store}", *overrides)


def _fails(argv: list[str], capsys) -> str:
    assert archive_main(argv) == 2
    err = capsys.readouterr().err.splitlines()  # MLflow's own lines when it creates a store
    assert err[-1].startswith("error: ") and sum(e.startswith("error") for e in err) == 1
    return err[-1]


def test_bad_archives_and_stores_fail_whole(study, tmp_path, capsys):
    new = tmp_path / "new" / "mlflow.db"
    uri = f"sqlite:///{new}"

    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("not an archive\n")
    err = _fails(["import", str(other), "--uri", uri], capsys)
    assert f"{other} is not an ablate archive (it has no archive.json)" in err
    assert not new.exists()  # nothing written, not even the store

    cut = tmp_path / "cut"
    shutil.copytree(study.archive, cut)
    metrics = next(cut.glob("runs/*/metrics.tsv.gz"))
    metrics.write_bytes(metrics.read_bytes()[:-40])  # truncated
    err = _fails(["import", str(cut), "--uri", uri], capsys)
    assert str(metrics) in err and "sha256 differs" in err and "export it again" in err
    assert not new.exists()

    # a store that already holds another FINISHED run of the same identity
    read = archive.read(study.archive)
    none = next(r for r in read.runs if r.params.get("freeze.name") == "none")
    client = MlflowClient(uri)
    exp = client.create_experiment("ablate")
    twin = client.create_run(exp, tags={archive.IDENTITY_TAG: none.tags[archive.IDENTITY_TAG]})
    client.set_terminated(twin.info.run_id, "FINISHED")
    err = _fails(["import", str(study.archive), "--uri", uri], capsys)
    assert none.run_id in err and twin.info.run_id in err
    assert f"mlflow runs delete --run-id {twin.info.run_id}" in err
    assert [r.info.run_id for r in _all_runs(uri)] == [twin.info.run_id]  # nothing imported

    # a write the store refuses half-way (a param name MLflow refuses, in a re-signed archive):
    # the runs created before it are deleted again
    long = tmp_path / "long"
    shutil.copytree(study.archive, long)
    last = read.runs[-1]
    params = long / "runs" / last.run_id / "params.json"
    params.write_text(archive.dumps({**last.params, "a|b": "1"}))
    write_manifest(long)
    fresh = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"
    err = _fails(["import", str(long), "--uri", fresh], capsys)
    assert last.run_id in err and "deleted again" in err
    assert _all_runs(fresh) == []
    # the runs rolled back are no import: the good archive is imported whole after them
    assert archive_main(["import", str(study.archive), "--uri", fresh]) == 0
    assert "imported 5 of 5 runs" in capsys.readouterr().out


def test_a_results_page_is_regenerated_from_the_archive_beside_it(study, tmp_path):
    page = tmp_path / "results" / "tiny"
    shutil.copytree(study.archive, page / docs.ARCHIVE)
    docs.regenerate(page)
    runs = (page / "runs.csv").read_text()
    read = archive.read(page / docs.ARCHIVE)
    grid = [r.run_id for r in read.runs if read.index["runs"][read.runs.index(r)]["role"] == "run"]
    assert all(run_id in runs for run_id in grid)  # the archive's ids, not the temporary store's
    said = (page / "summary.md").read_text().splitlines()[2]
    assert said.startswith("Experiment `") and f"` in the archive `{docs.ARCHIVE}/` (" in said
    assert "from the archive" in docs.results.results_source(str(page))
    # made again, the same report to the byte, its charts too (seaborn's jitter is random)
    made = {p.name: p.read_bytes() for p in page.iterdir() if p.is_file()}
    assert {"summary.csv", "runs.csv", "train_time.png"} <= set(made)
    docs.regenerate(page)
    assert {p.name: p.read_bytes() for p in page.iterdir() if p.is_file()} == made
    # a published study without an archive beside its page (its store gone) says so
    for study_name in ("naija", "naija-fair", "ewt"):
        said = docs.results.results_source(study_name)
        held = (ROOT / "docs" / "results" / study_name / docs.ARCHIVE).is_dir()
        assert ("from the archive" in said) == held and ("no longer held" in said) != held


def test_a_study_page_tabulates_its_lr_studies_per_pruner_from_their_archives(study, tmp_path):
    page = tmp_path / "results" / "tiny"
    out = page / docs.lrstudies.PRUNING / "median"
    argv = ["export", "--uri", study.store, "--experiment", LR_EXPERIMENT, "--all", str(out)]
    assert archive_main(argv) == 0
    rows = [line.split(" | ") for line in docs.lrstudies.lr_pruning(str(page)).splitlines()[2:]]
    trials = [r for r in _all_runs(study.store) if r.data.tags.get("study") == STUDY]
    top = max(trials, key=lambda r: r.data.metrics["best_dev_accuracy"])
    client = MlflowClient(study.store)
    epochs = sum(len(client.get_metric_history(r.info.run_id, "epoch_time_s")) for r in trials)
    assert len(rows) == 1
    assert rows[0][0] == f"| {STUDY}" and rows[0][1:5] == ["median", "2", "0", str(epochs)]
    assert rows[0][7] == f"{float(top.data.params['trainer.lr']):.3g}"
    assert rows[0][8].rstrip(" |") == f"{100 * top.data.metrics['best_dev_accuracy']:.2f}"
    with pytest.raises(docs.studies.NoResults, match="No lr studies archived"):
        docs.lrstudies.lr_pruning(str(tmp_path / "none"))


def _resigned(study, tmp_path: Path, name: str, edit) -> tuple[Path, archive.Archive]:
    """A copy of the study's archive changed by ``edit(folder, read)`` and signed again (as an
    export of the changed store would write it)."""
    out = tmp_path / name
    shutil.copytree(study.archive, out)
    edit(out, archive.read(out))
    (out / archive.MANIFEST).unlink()
    write_manifest(out)
    return out, archive.read(out)


def _every_run(store: str) -> list:
    """Every run of ``store``, deleted ones too."""
    from mlflow.entities import ViewType

    client = MlflowClient(store)
    ids = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(ids, run_view_type=ViewType.ALL)


def test_an_import_killed_half_way_is_finished_by_the_next(study, tmp_path, capsys):
    from ablate.archive import import_
    from ablate.tracking.store import prepare

    read = archive.read(study.archive)
    uri = new_store(tmp_path)
    client = MlflowClient(uri)
    # what a SIGKILL leaves: every run created, two written whole (the tuned one names a trial
    # still pending), a third up to its end
    exps = {n: prepare(uri, n) for n in {r.info["experiment"] for r in read.runs}}
    ids = {r.run_id: import_._create(client, exps[r.info["experiment"]], r) for r in read.runs}
    tuned = next(r for r in read.runs if TUNED_TAG in r.tags)
    parent = next(r for r in read.runs if r.tags.get("ablate.role") == "sweep")
    for run in (parent, tuned):
        import_._write(client, run, ids[run.run_id], ids)
    third = next(r for r in read.runs if r.params.get("freeze.name") == "none")
    client.set_tag(ids[third.run_id], archive.IDENTITY_TAG, third.tags[archive.IDENTITY_TAG])
    client.set_terminated(ids[third.run_id], "FINISHED")  # not a twin that blocks the import

    assert archive_main(["import", str(study.archive), "--uri", uri]) == 0
    out = capsys.readouterr().out
    assert "3 runs a stopped import left unfinished" in out
    assert "imported 3 of 5 runs" in out and "2 were there already" in out
    live = {r.data.tags[archive.ORIGIN_TAG]: r for r in _all_runs(uri)}
    assert len(_all_runs(uri)) == 5 and set(live) == {r.run_id for r in read.runs}
    for run in read.runs:
        assert live[run.run_id].data.params == run.params
        assert live[run.run_id].info.status == run.info["status"]
        assert archive.PENDING_TAG not in live[run.run_id].data.tags
    gone = [r for r in _every_run(uri) if r.info.lifecycle_stage == "deleted"]
    pending = [r for r in read.runs if r not in (parent, tuned)]
    assert sorted(r.info.run_id for r in gone) == sorted(ids[r.run_id] for r in pending)
    # the whole run kept now names its trial's new run, and the new runs their kept parent
    trial = live[tuned.tags[TUNED_TAG]].info.run_id
    assert live[tuned.run_id].data.tags[TUNED_TAG] == trial
    assert live[third.run_id].data.tags[archive.PARENT_TAG] == live[parent.run_id].info.run_id


def test_an_archived_deleted_run_is_imported_once(study, tmp_path, capsys):
    def delete_sweep(folder, read):
        parent = next(r for r in read.runs if r.tags.get("ablate.role") == "sweep")
        info = {**parent.info, "lifecycle_stage": "deleted"}
        (parent.folder / "info.json").write_text(archive.dumps(info))

    arch, read = _resigned(study, tmp_path, "deleted-sweep", delete_sweep)
    uri = new_store(tmp_path)
    for n in (5, 0, 0):
        assert archive_main(["import", str(arch), "--uri", uri]) == 0
        assert f"imported {n} of 5 runs" in capsys.readouterr().out
    stages = sorted(r.info.lifecycle_stage for r in _every_run(uri))
    assert stages == ["active"] * 4 + ["deleted"]


def test_an_archive_grown_by_a_rerun_imports_where_it_was_imported_before(study, tmp_path, capsys):
    rerun_id = "f" * 32

    def add_rerun(folder, read):  # a seed trained again (skip_finished=false): same identity
        none = next(r for r in read.runs if r.params.get("freeze.name") == "none")
        shutil.copytree(none.folder, folder / archive.RUNS / rerun_id)
        start = max(r.info["start_time"] for r in read.runs) + 3_600_000
        info = {**none.info, "run_id": rerun_id, "start_time": start, "end_time": start + 1000}
        (folder / archive.RUNS / rerun_id / "info.json").write_text(archive.dumps(info))
        entry = next(e for e in read.index["runs"] if e["run_id"] == none.run_id)
        index = {**read.index, "runs": [*read.index["runs"], {**entry, "run_id": rerun_id}]}
        (folder / archive.INDEX).write_text(archive.dumps(index))

    grown, _ = _resigned(study, tmp_path, "grown", add_rerun)
    uri = new_store(tmp_path)
    assert archive_main(["import", str(study.archive), "--uri", uri]) == 0
    capsys.readouterr()
    assert archive_main(["import", str(grown), "--uri", uri]) == 0
    captured = capsys.readouterr()
    assert "imported 1 of 6 runs" in captured.out and "warning" not in captured.err
    assert rerun_id in {r.data.tags[archive.ORIGIN_TAG] for r in _all_runs(uri)}


def test_a_held_run_whose_archived_record_went_on_is_kept_with_a_warning(study, tmp_path, capsys):
    uri = new_store(tmp_path)
    assert archive_main(["import", str(study.archive), "--uri", uri]) == 0
    assert archive_main(["import", str(study.archive), "--uri", uri]) == 0
    assert "warning" not in capsys.readouterr().err  # the same record: nothing to say

    def end_later(folder, read):  # re-exported after the sweep's parent was resumed and ended
        parent = next(r for r in read.runs if r.tags.get("ablate.role") == "sweep")
        info = {**parent.info, "status": "KILLED", "end_time": parent.info["end_time"] + 5000}
        (parent.folder / "info.json").write_text(archive.dumps(info))

    later, read = _resigned(study, tmp_path, "later", end_later)
    parent = next(r for r in read.runs if r.tags.get("ablate.role") == "sweep")
    assert archive_main(["import", str(later), "--uri", uri]) == 0
    captured = capsys.readouterr()
    assert "imported 0 of 5 runs" in captured.out
    warned = [line for line in captured.err.splitlines() if line.startswith("warning")]
    assert len(warned) == 1 and parent.run_id in warned[0]
    assert "status FINISHED here, KILLED in the archive" in warned[0]
    assert "fresh store" in warned[0] and "mlflow runs delete --run-id" in warned[0]
    held = next(r for r in _all_runs(uri) if r.data.tags[archive.ORIGIN_TAG] == parent.run_id)
    assert held.info.status == "FINISHED"  # kept


def test_an_export_that_cannot_read_artifacts_fails_and_keeps_the_old_archive(
    study, tmp_path, capsys
):
    import sqlite3

    # the store's database without its artifacts (copied alone, or its artifact folder moved)
    db = tmp_path / "rescued" / "mlflow.db"
    db.parent.mkdir()
    shutil.copyfile(study.tmp / "mlflow.db", db)
    before = (study.tmp / "mlartifacts").as_uri()
    with sqlite3.connect(db) as con:
        con.execute(
            "UPDATE experiments SET artifact_location = replace(artifact_location, ?, ?)",
            (before, (tmp_path / "gone").as_uri()),
        )
        con.execute(
            "UPDATE runs SET artifact_uri = replace(artifact_uri, ?, ?)",
            (before, (tmp_path / "gone").as_uri()),
        )
    out = tmp_path / "arch"
    shutil.copytree(study.archive, out)
    err = _fails(["export", str(out), "--uri", f"sqlite:///{db}"], capsys)
    assert "is not readable" in err and str(tmp_path / "gone") in err
    assert "config.yaml" in err or "predictions/dev.json" in err
    assert _files(out) == _files(study.archive)  # the earlier archive is kept whole


def test_a_failed_import_that_cannot_delete_its_runs_says_so_and_the_next_finishes_it(
    study, tmp_path, capsys
):
    import sqlite3

    read = archive.read(study.archive)
    last = read.runs[-1]

    def refused_param(folder, read):  # a param name MLflow refuses, in the last run written
        params = folder / archive.RUNS / last.run_id / "params.json"
        params.write_text(archive.dumps({**last.params, "a|b": "1"}))

    bad, _ = _resigned(study, tmp_path, "bad", refused_param)
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    MlflowClient(uri).search_experiments()  # the store's schema, then a store refusing deletes
    with sqlite3.connect(db) as con:  # (as a server that went away would)
        con.execute(
            "CREATE TRIGGER refuse BEFORE UPDATE OF lifecycle_stage ON runs "
            "BEGIN SELECT RAISE(ABORT, 'deletes refused'); END"
        )
    err = _fails(["import", str(bad), "--uri", uri], capsys)
    assert "5 of the 5 runs it had created could not be deleted again" in err
    assert "deletes refused" in err and archive.PENDING_TAG in err
    with sqlite3.connect(db) as con:
        con.execute("DROP TRIGGER refuse")
    assert archive_main(["import", str(study.archive), "--uri", uri]) == 0
    out = capsys.readouterr().out
    assert "1 runs a stopped import left unfinished" in out and "imported 1 of 5 runs" in out
    live = {r.data.tags[archive.ORIGIN_TAG]: r for r in _all_runs(uri)}
    assert len(_all_runs(uri)) == 5 and live[last.run_id].data.params == last.params


def _version_1(study, tmp_path: Path) -> Path:
    """The study's archive as version 1 wrote it: every file plain, signed again."""
    out = tmp_path / "v1"
    shutil.copytree(study.archive, out)
    for gz in sorted(out.rglob("*.gz")):
        gz.with_name(gz.name.removesuffix(".gz")).write_bytes(read_gzip(gz))
        gz.unlink()
    index = json.loads((out / archive.INDEX).read_text(encoding="utf-8"))
    (out / archive.INDEX).write_text(archive.dumps({**index, "version": 1}), encoding="utf-8")
    (out / archive.MANIFEST).unlink()
    write_manifest(out)
    return out


def _content(store: str, tmp: Path) -> dict[str, tuple]:
    """Every run of ``store`` by the id it was archived under: its info, params, tags (the runs
    they name by their archived ids too), every point of every metric, every artifact's bytes."""
    client = MlflowClient(store)
    runs = _every_run(store)
    origin = {r.info.run_id: r.data.tags[archive.ORIGIN_TAG] for r in runs}
    out = {}
    for run in runs:
        run_id = run.info.run_id
        points = {
            key: [(m.step, m.timestamp, m.value) for m in client.get_metric_history(run_id, key)]
            for key in sorted(run.data.metrics)
        }
        (tmp / run_id).mkdir(parents=True)
        got = Path(client.download_artifacts(run_id, "", str(tmp / run_id)))
        files = {p.relative_to(got).as_posix(): p.read_bytes() for p in sorted(got.rglob("*"))
                 if p.is_file()}  # fmt: skip
        info = run.info
        out[origin[run_id]] = (
            (info.run_name, info.status, info.start_time, info.end_time, info.lifecycle_stage),
            run.data.params,
            {k: origin.get(v, v) for k, v in run.data.tags.items()},
            points,
            files,
        )
    return out


def test_an_export_compresses_metrics_and_predictions_and_exports_again_to_the_byte(
    study, tmp_path
):
    files = _files(study.archive)
    first = archive.read(study.archive)
    assert json.loads(files[archive.INDEX])["version"] == archive.VERSION == 2
    assert any(r.artifacts for r in first.runs)
    for run in first.runs:
        name = run.folder.relative_to(study.archive).as_posix()
        assert files[f"{name}/metrics.tsv.gz"][:2] == b"\x1f\x8b"  # gzip's magic
        assert f"{name}/metrics.tsv" not in files
        if run.artifacts:  # listed by their MLflow paths, stored compressed
            assert run.artifacts == ["config.yaml", *PREDICTIONS]
            for path in PREDICTIONS:
                assert json.loads(read_gzip(run.stored(path)))
                assert f"{name}/artifacts/{path}.gz" in files
            assert f"{name}/artifacts/config.yaml" in files  # the rest plain, diffable
    listed = (study.archive / archive.MANIFEST).read_text(encoding="utf-8")
    assert "metrics.tsv.gz\n" in listed and "dev.json.gz\n" in listed  # the files as stored
    assert "test.json.gz\n" in listed

    # exported, imported, exported again: each run's files the same bytes under its new id
    new = new_store(tmp_path / "new")
    assert archive_main(["import", str(study.archive), "--uri", new]) == 0
    again = tmp_path / "again"
    scope = archive.report_args(first.index["scope"])
    assert archive_main(["export", str(again), "--uri", new, *scope]) == 0
    held = archive.read(again)
    assert held.counts() == first.counts() and held.index["version"] == 2
    skip = ("info.json", "tags.json")  # its new id, the tags naming runs' new ids
    for run in held.runs:
        mine = {k: v for k, v in _files(run.folder).items() if k not in skip}
        was = _files(study.archive / archive.RUNS / run.tags[archive.ORIGIN_TAG])
        assert mine == {k: v for k, v in was.items() if k not in skip}
        assert "metrics.tsv.gz" in mine


def test_a_version_1_archive_imports_into_the_same_store_as_its_version_2_twin(
    study, tmp_path, capsys
):
    old = _version_1(study, tmp_path)
    assert not list(old.rglob("*.gz")) and list(old.rglob("metrics.tsv"))
    v1, v2 = archive.read(old), archive.read(study.archive)
    assert v1.index["version"] == 1 and v2.index["version"] == 2
    fields = ("info", "params", "tags", "inputs", "metrics", "artifacts")
    for a, b in zip(v1.runs, v2.runs, strict=True):
        assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]
    stores = []
    for name, folder in (("one", old), ("two", study.archive)):
        stores.append(new_store(tmp_path / name))
        assert archive_main(["import", str(folder), "--uri", stores[-1]]) == 0
        assert "imported 5 of 5 runs" in capsys.readouterr().out
    one, two = (_content(uri, tmp_path / f"got-{n}") for n, uri in enumerate(stores))
    assert one == two and len(one) == 5
    assert any("predictions/dev.json" in files for *_, files in one.values())


def test_a_broken_or_misspelt_compressed_file_fails_before_anything_is_imported(
    study, tmp_path, capsys
):
    uri = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"
    read = archive.read(study.archive)
    run = next(r for r in read.runs if r.artifacts)
    name = f"{archive.RUNS}/{run.run_id}"

    def broken(label: str, path: str, edit) -> str:
        """The error of importing the study's archive with ``path`` edited, signed again."""
        out = tmp_path / label
        shutil.copytree(study.archive, out)
        edit(out / path)
        (out / archive.MANIFEST).unlink()
        write_manifest(out)  # the sha256 matches: the gzip stream itself is checked
        err = _fails(["import", str(out), "--uri", uri], capsys)
        assert not (tmp_path / "new").exists()  # nothing imported, not even the store made
        return err

    def cut(path: Path) -> None:  # its last bytes (the checksum, the length) lost
        path.write_bytes(path.read_bytes()[:-6])

    def wrong_crc(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[-8] ^= 0xFF
        path.write_bytes(bytes(data))

    dev = f"{name}/artifacts/predictions/dev.json.gz"
    err = broken("cut", dev, cut)
    assert str(tmp_path / "cut" / dev) in err and "not a whole gzip stream" in err
    err = broken("crc", f"{name}/metrics.tsv.gz", wrong_crc)
    assert str(tmp_path / "crc" / name / "metrics.tsv.gz") in err and "gzip stream" in err
    assert "export it again" in err

    def plain(path: Path) -> None:  # a version 2 archive with a version 1 file
        path.with_name("metrics.tsv").write_bytes(read_gzip(path))
        path.unlink()

    err = broken("plain", f"{name}/metrics.tsv.gz", plain)
    assert str(tmp_path / "plain" / name / "metrics.tsv") in err
    assert "version 2 keeps this file gzip-compressed, as metrics.tsv.gz" in err


def test_an_archive_without_test_predictions_reads_and_reports_without_mcnemar(
    study, tmp_path, capsys
):
    """An archive that holds its runs' dev predictions only (as archives exported before test's
    were kept) reads, imports and reports as before: no test bootstrap, no McNemar, said so."""
    old = tmp_path / "dev-only"
    shutil.copytree(study.archive, old)
    for gz in old.rglob("test.json.gz"):
        gz.unlink()
    (old / archive.MANIFEST).unlink()
    write_manifest(old)
    held = archive.read(old)
    assert all("predictions/test.json" not in r.artifacts for r in held.runs)
    assert any("predictions/dev.json" in r.artifacts for r in held.runs)
    new = new_store(tmp_path / "new")
    assert archive_main(["import", str(old), "--uri", new]) == 0
    assert "imported 5 of 5 runs" in capsys.readouterr().out
    out = tmp_path / "report"
    assert report_main([*archive.report_args(held.index["scope"]), "--uri", new, "--out",
                        str(out)]) == 0  # fmt: skip
    import pandas as pd

    row = pd.read_csv(out / "summary.csv").set_index("strategy").loc["all"]
    assert row.delta_method == "paired bootstrap over dev words (1 seed)"
    assert row.delta_test_method == "none (1 paired seed, no test predictions logged)"
    assert row.mcnemar_tested == "0 of 1 seed" and pd.isna(row.mcnemar_p)
    assert "– (0 of 1 seed)" in (out / "summary.md").read_text()
