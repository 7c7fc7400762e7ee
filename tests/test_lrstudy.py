"""lr studies on Optuna (ablate.lrstudy): persistent and resumable after a SIGKILL, shared by
workers without doubling a trial, pruned from the per-epoch dev metric, widening their range."""

from __future__ import annotations

import importlib.metadata as md
import json
import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
from helpers.data import ROOT
from helpers.runs import slice_overrides
from helpers.store import logged_runs, new_store
from mlflow import MlflowClient
from omegaconf import open_dict

from ablate import report
from ablate.archive.__main__ import main as archive_main
from ablate.errors import AblateError
from ablate.lrstudy import PRUNED_EPOCH_TAG, PRUNED_TAG, RANGE_TAG, TRIAL_TAG, interior, position
from ablate.lrstudy import cli as study_cli
from ablate.lrstudy import storage as lrstorage
from ablate.lrstudy import study as lrstudy
from ablate.lrstudy.runs import best, tuned_lr

# the tests set a study's state up by asking trials by hand, outside Study.optimize, which Optuna
# warns of when the storage beats hearts; ablate's own studies ask through optimize
pytestmark = pytest.mark.filterwarnings(
    "ignore:Heartbeat of storage is supposed to be used with Study.optimize:UserWarning"
)


def test_the_environment_has_optuna_4_or_later_and_no_hydra_sweeper():
    assert int(md.version("optuna").split(".")[0]) >= 4
    with pytest.raises(md.PackageNotFoundError):
        md.version("hydra-optuna-sweeper")


def test_a_study_process_loads_no_torch_only_its_trials_do():
    # each worker of a study is such a process, and its trials are children that train
    probe = "import sys, ablate.lrstudy.cli; print({'torch', 'transformers'} & set(sys.modules))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert proc.stdout.strip() == "set()", proc.stderr[-2000:]


def _start(args: list[str], log: Path) -> subprocess.Popen:
    """``python -m ablate.lrstudy ARGS`` started, its output into ``log`` (a pipe nobody reads
    while the test waits would block it)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ablate.lrstudy", *args], cwd=ROOT, env=env, stdout=out,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip


def _study(args: list[str]) -> optuna.Study:
    options, overrides = study_cli.for_studies(args)
    return lrstorage.open_study(study_cli.compose_trial(options[0], overrides))


@pytest.mark.heavy
def test_a_study_killed_mid_trial_continues_and_two_workers_double_no_trial(
    slice_root, store, tmp_path, capsys
):
    args = [
        *slice_overrides(slice_root, store, tmp_path), "freeze=bitfit", "lr_study.trials=2",
        "lr_study.pruner=none", "lr_study.widen=0", "trainer.epochs=1",
    ]  # fmt: skip
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    # the second worker with threads of its own (not a setting: its trials are the study's)
    first, second = _start(args, logs[0]), _start([*args, "trainer.threads=1"], logs[1])
    # SIGKILL the first worker (not its trial: a SIGKILL reaches no child) while its trial's
    # run is open.
    child = None
    deadline = time.time() + 300
    while child is None and time.time() < deadline and first.poll() is None:
        time.sleep(0.2)
        # the store is read only once the worker has a trial: the trial starts on this core
        kids = {p.pid for p in psutil.Process(first.pid).children()}
        for r in logged_runs(store) if kids else ():
            pid = r.data.tags.get("ablate.process", "")
            if r.info.status == "RUNNING" and any(f'"pid": {k},' in pid for k in kids):
                child = psutil.Process(next(k for k in kids if f'"pid": {k},' in pid))
    assert child is not None, logs[0].read_text()[-3000:]
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    gone, _ = psutil.wait_procs([child], timeout=30)
    assert gone, "the killed study's trial trained on"
    # The same command again (in this process: its modules are loaded), beside the worker still
    # running, with a sweep folder of its own as a later command's would be.
    capsys.readouterr()
    assert second.poll() is None, logs[1].read_text()[-3000:]
    again = [*args, f"hydra.sweep.dir={tmp_path}/sweep-again"]
    assert study_cli.main(again) == 0, "".join(capsys.readouterr())[-3000:]
    assert second.wait(timeout=600) == 0, logs[1].read_text()[-3000:]
    study = _study(args)
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 2
    assert optuna.trial.TrialState.RUNNING not in states
    assert optuna.trial.TrialState.PRUNED not in states
    runs = [r for r in logged_runs(store) if r.info.status == "FINISHED"]
    killed = len(logged_runs(store)) - len(runs)
    assert len(runs) == 2
    # the killed trial's run: KILLED (its process is gone), not counted; none left RUNNING
    assert {r.info.status for r in logged_runs(store)} <= {"FINISHED", "KILLED"}
    done = {t.number for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE}
    assert {r.data.tags[TRIAL_TAG].rsplit(":", 1)[1] for r in runs} == {str(n) for n in done}
    lrs = sorted(float(r.data.params["trainer.lr"]) for r in runs)
    assert lrs == sorted(t.params["lr"] for t in study.trials if t.number in done)
    assert lrs[0] != lrs[1]  # two workers, each its own draws
    # Finished: a rerun (in this process: the workers above were the processes) runs nothing.
    capsys.readouterr()
    assert study_cli.main(args) == 0
    out = "".join(capsys.readouterr())
    assert len(logged_runs(store)) == len(runs) + killed, out
    assert "study lr-UD_Naija-Slice-tiny-bitfit-" in out and ": 2 trials, 0 pruned" in out


def test_a_killed_trials_retry_trains_where_the_try_trained_though_a_later_process_runs_it(
    tmp_path,
):
    # A study process started again has a sweep folder of its own; its retry of a killed trial
    # must still find that trial's epoch checkpoints, which lie in the try's job folder.
    storage = lrstorage.open_storage(f"sqlite:///{tmp_path}/lr_study.db")
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    tried = tmp_path / "sweep-1" / "bitfit" / "0"
    tried.mkdir(parents=True)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-5, 1e-2, log=True)})
    here = socket.gethostname()
    process = {"trial": trial.number, "host": here, "pid": gone.pid, "started": "0"}
    trial.set_user_attr("process", {**process, "job": str(tried)})
    lrstudy._fail_dead(study)
    (retry,) = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert retry.params == trial.params
    later = tmp_path / "sweep-2" / "bitfit" / "0"
    assert lrstudy.job_folder(retry, later) == tried
    # another host's try, or a folder no longer there: the retry trains in a new folder
    elsewhere = {**process, "host": f"{here}-not", "job": str(tried)}
    study._storage.set_trial_user_attr(retry._trial_id, "process", elsewhere)
    assert lrstudy.job_folder(study._storage.get_trial(retry._trial_id), later) == later
    tried.rmdir()
    assert lrstudy.job_folder(retry, later) == later


def _pruning_args(slice_root, store: str, folder: Path) -> list[str]:
    return [
        *slice_overrides(slice_root, store, folder), "freeze=bitfit", "lr_study.trials=3",
        "lr_study.prune_from_epoch=1", "lr_study.range=[1e-7,1e-2]", "lr_study.widen=0",
    ]  # fmt: skip


@pytest.mark.heavy
def test_a_losing_trial_is_pruned_tagged_and_no_candidate(
    slice_root, store, tmp_path, capsys, caplog
):
    args = _pruning_args(slice_root, store, tmp_path)
    study = _study(args)
    for lr in (3e-3, 1e-3, 1e-7):  # the last cannot keep up after an epoch
        study.enqueue_trial({"lr": lr})
    assert study_cli.main(args) == 0
    said = capsys.readouterr()
    archive = tmp_path / "archive"  # the study as it ended, for its import elsewhere (below)
    assert archive_main(["export", "--uri", store, "--experiment", "ablate", "--all",
                         str(archive)]) == 0  # fmt: skip
    capsys.readouterr()
    states = {t.params["lr"]: t.state for t in _study(args).trials}
    assert states[1e-7] == optuna.trial.TrialState.PRUNED
    # the pruned trial does not count: a fourth trial, drawn by the sampler, trains out
    assert list(states.values()).count(optuna.trial.TrialState.COMPLETE) == 3
    (drawn,) = set(states) - {3e-3, 1e-3, 1e-7}
    runs = {float(r.data.params["trainer.lr"]): r for r in logged_runs(store)}
    pruned = runs[1e-7]
    assert pruned.info.status == "KILLED" and pruned.data.tags[PRUNED_TAG] == "true"
    assert pruned.data.tags[PRUNED_EPOCH_TAG] == "1"
    assert "best_dev_accuracy" in pruned.data.metrics  # it ended as a run does, then KILLED
    ends = [line for f in tmp_path.rglob("*.log") for line in f.read_text().splitlines()]
    assert sum("pruned by its lr study after epoch 1: dev accuracy" in e for e in ends) == 1
    assert sum(" FINISHED: dev accuracy" in e for e in ends) == 3  # its log says so, too
    # a run tagged for a trial counts as its result only at the lr the trial drew: a new Optuna
    # storage (an archive imported elsewhere) numbers its trials afresh
    tagged = runs[3e-3].data.tags[TRIAL_TAG]
    name, number = tagged.rsplit(":", 1)
    trial_cfg = study_cli.compose_trial("bitfit", study_cli.for_studies(args)[1])
    assert lrstudy._run_of(trial_cfg.tracking, name, [int(number)], 3e-3) is not None
    assert lrstudy._run_of(trial_cfg.tracking, name, [int(number)], 5e-3) is None
    # each trial's run names the range its lr was drawn from
    assert {json.loads(r.data.tags[RANGE_TAG]) == [1e-7, 1e-2] for r in runs.values()} == {True}
    assert ": 4 trials, 1 pruned, 1 of 8 epochs saved" in said.err
    row = next(line for line in said.out.splitlines() if "| bitfit |" in line)
    assert "| 3 | 1 | 1 | [1e-07, 0.01] |" in row and pruned.info.run_id not in row
    # the sampler's draw won, in the range's top tenth: the table says where, and a warning,
    # last, that it is not interior
    done = [r for r in runs.values() if r is not pruned]
    top = max(done, key=lambda r: r.data.metrics["best_dev_accuracy"])
    lr = float(top.data.params["trainer.lr"])
    assert lr == drawn and position(lr, [1e-7, 1e-2]) > 0.9
    assert f"| {lr:.3g} | {position(lr, [1e-7, 1e-2]):.2f} | **no** |" in row
    assert (
        said.err.rstrip()
        .splitlines()[-1]
        .startswith(
            f"warning: freeze=bitfit: the best lr {lr:.3g} lies at the edge of the searched range "
            "[1e-07, 0.01] (where 0.9"
        )
    )
    cfg = study_cli.compose_trial("bitfit", study_cli.for_studies(args)[1])
    found = best(study_cli.study_of(cfg))
    assert (found.trials, found.pruned, found.epochs_saved) == (3, 1, 1)
    with open_dict(cfg):
        cfg.lr_study.freeze = ["bitfit"]
    assert tuned_lr(cfg, "x").run_id == best(study_cli.study_of(cfg)).run_id
    # a tie goes to the earliest trial, as Optuna's best_trial picks: the grid's lr and the
    # study's summary agree, whatever order the store returns the trials in
    first, *later = sorted(
        (runs[lr] for lr in (3e-3, 1e-3, drawn)), key=lambda r: r.info.start_time
    )
    tied = max(r.data.metrics["best_dev_accuracy"] for r in runs.values())
    for r in (first, *later):
        MlflowClient(store).log_metric(r.info.run_id, "best_dev_accuracy", tied, step=10**6)
    assert tuned_lr(cfg, "x").run_id == first.info.run_id
    assert best(study_cli.study_of(cfg)).run_id == first.info.run_id
    # trials run without a preset land in the main experiment: the report leaves them out (their
    # lr is what they vary), not a panel per trial
    with pytest.raises(AblateError) as why:
        report.make_report("ablate", store)
    study = f"a trial of the lr study {cfg.tracking.tags.study}, not a grid's run"
    assert str(why.value).startswith("no usable runs in ") and study in str(why.value)
    _continues_after_import(slice_root, archive, args, said.err, drawn, tmp_path, capsys, caplog)


def _imported(archive: Path, folder: Path) -> str:
    """A new sqlite store in ``folder`` (so a new Optuna storage beside it) holding ``archive``."""
    store = new_store(folder)
    assert archive_main(["import", str(archive), "--uri", store]) == 0
    assert not (folder / "lr_study.db").exists()
    return store


def _continues_after_import(slice_root, archive, args, said, drawn, tmp_path, capsys, caplog):
    """The study of ``args`` (3e-3, 1e-3, then 1e-7 pruned, then one drawn), exported to
    ``archive``, imported into a new store: its new Optuna storage is seeded from the imported
    trial runs, so the same command trains only the trials it lacks."""
    complete, pruned, fail = (optuna.trial.TrialState[s] for s in ("COMPLETE", "PRUNED", "FAIL"))
    line = next(x for x in said.splitlines() if x.startswith("study "))
    store = _imported(archive, tmp_path / "b")
    args_b = _pruning_args(slice_root, store, tmp_path / "b")
    runs = {float(r.data.params["trainer.lr"]): r for r in logged_runs(store)}
    with caplog.at_level(logging.INFO, logger="ablate"):
        assert study_cli.main(args_b) == 0
    out = capsys.readouterr()
    assert {r.info.run_id for r in logged_runs(store)} == {r.info.run_id for r in runs.values()}
    assert line in out.err.splitlines()  # the same study: no trial trained again
    seeded_line = "seeded 4 trials (1 pruned) from the tracking store's runs; range [1e-07, 0.01]"
    assert any(seeded_line in r.getMessage() for r in caplog.records)
    cfg = study_cli.compose_trial("bitfit", study_cli.for_studies(args_b)[1])
    before = study_cli.compose_trial("bitfit", study_cli.for_studies(args)[1])
    here, there = (lrstudy.summary(lrstorage.open_study(c), c.trainer) for c in (cfg, before))
    assert here == there  # the same name, trials, pruned, epochs saved, range and best lr
    seeded = lrstorage.open_study(cfg).trials
    name = lrstorage.study_name(cfg)
    assert [(t.number, t.state, t.params["lr"]) for t in seeded] == [
        (0, complete, 3e-3), (1, complete, 1e-3), (2, pruned, 1e-7), (3, complete, drawn),
    ]  # fmt: skip
    for t in seeded:  # each its run's trial: value, per-epoch dev metric, epochs, range
        run = runs[t.params["lr"]]
        assert run.data.tags[TRIAL_TAG] == f"{name}:{t.number}"
        assert t.user_attrs["seeded_from_run"] == run.info.run_id
        history = MlflowClient(store).get_metric_history(run.info.run_id, "dev_accuracy")
        assert t.intermediate_values == {m.step: m.value for m in history}
        assert (t.distributions["lr"].low, t.distributions["lr"].high) == (1e-7, 1e-2)
    assert seeded[0].value == runs[3e-3].data.metrics["best_dev_accuracy"]
    assert seeded[2].user_attrs["epochs"] == 1 and seeded[0].user_attrs["epochs"] == 2

    # a trial whose run failed (a study cut short): one trial trains, numbered after the rest
    store = _imported(archive, tmp_path / "c")
    failed = next(r for r in logged_runs(store) if float(r.data.params["trainer.lr"]) == 1e-3)
    MlflowClient(store).set_terminated(failed.info.run_id, status="FAILED")
    args_c = _pruning_args(slice_root, store, tmp_path / "c")
    assert study_cli.main(args_c) == 0
    trials = lrstorage.open_study(
        study_cli.compose_trial("bitfit", study_cli.for_studies(args_c)[1])
    ).trials
    assert [(t.number, t.state) for t in trials[:3]] == [(0, complete), (1, fail), (2, pruned)]
    assert len(trials) == 5 and trials[3].state == trials[4].state == complete
    tagged = [r for r in logged_runs(store) if r.data.tags[TRIAL_TAG].endswith(":4")]
    assert len(logged_runs(store)) == 5 and len(tagged) == 1  # the four imported, one new
    assert float(tagged[0].data.params["trainer.lr"]) == trials[4].params["lr"]
    assert MlflowClient(store).get_run(failed.info.run_id).info.status == "FAILED"


def _finished(study: optuna.Study, lrs: list[float]) -> None:
    low, high = study.user_attrs["range"]
    dist = optuna.distributions.FloatDistribution(low, high, log=True)
    for lr in lrs:  # each better than every one before
        study.add_trial(optuna.trial.create_trial(
            params={"lr": lr}, distributions={"lr": dist}, value=0.5 + len(study.trials) / 100
        ))  # fmt: skip


def test_a_best_lr_at_the_edge_widens_the_range_at_most_twice(slice_root, store, tmp_path):
    args = [*slice_overrides(slice_root, store, tmp_path), "freeze=lora", "lr_study.trials=4"]
    cfg = study_cli.compose_trial("lora", study_cli.for_studies(args)[1])
    study = lrstorage.open_study(cfg)
    assert study.user_attrs == {"range": [1e-5, 1e-3], "widened": 0}
    _finished(study, [1e-4, 3e-5, 2e-4, 9e-4])  # the best, last: in the top tenth
    assert lrstudy._widen(study, cfg.lr_study)
    assert study.user_attrs == {"range": [1e-5, 1e-2], "widened": 1}
    assert lrstudy.target(study, cfg.lr_study) == 6  # half as many trials more
    _finished(study, [1e-4, 9e-3])  # at the top again
    assert lrstudy._widen(study, cfg.lr_study) and study.user_attrs["range"] == [1e-5, 1e-1]
    _finished(study, [1e-4, 9e-2])  # a third time: not widened, and said plainly
    assert not lrstudy._widen(study, cfg.lr_study)
    done = lrstudy.summary(study, cfg.trainer)
    assert (done.trials, done.widened, done.best_lr) == (8, 2, 9e-2)
    assert not interior(done.best_lr, list(done.range))  # the table says so (below)
    # Each study draws its own lrs: another option's study, same seed, other first draws.
    other = lrstorage.open_study(study_cli.compose_trial("bitfit", study_cli.for_studies(args)[1]))
    assert other.study_name != study.study_name
    assert other.ask().suggest_float("lr", 1e-5, 1e-3, log=True) != lrstorage.open_study(
        study_cli.compose_trial("features", study_cli.for_studies(args)[1])
    ).ask().suggest_float("lr", 1e-5, 1e-3, log=True)


def test_bad_lr_study_keys_are_one_error_each(tmp_path, capsys):
    cfg = study_cli.compose_trial("lora", [f"tracking.uri=sqlite:///{tmp_path}/m.db"])
    assert lrstorage.storage_url(cfg) == f"sqlite:///{tmp_path}/lr_study.db"
    for key, value, said in [
        ("trials", 0, "lr_study.trials=0: must be at least 1"),
        ("range", [1e-3, 1e-5], "lr_study.range=[0.001, 1e-05]: must be [low, high]"),
        ("pruner", "hyperband", "lr_study.pruner=hyperband: must be median or none"),
        ("tracking", None, "tracking.uri=http://127.0.0.1:5000: an lr study needs a database"),
    ]:
        bad = cfg.copy()
        with open_dict(bad):
            if key == "tracking":
                bad.tracking.uri = "http://127.0.0.1:5000"
            else:
                bad.lr_study[key] = value
        with pytest.raises(AblateError, match=said.replace("[", r"\[")):
            lrstudy.check(bad)
    assert study_cli.main(["freeze=lora", "hydra.sweeper.n_trials=3"]) == 2
    assert "size use lr_study.trials=N" in capsys.readouterr().err


def test_a_trial_asked_when_the_study_had_its_trials_is_dropped_unrun(slice_root, store, tmp_path):
    args = [*slice_overrides(slice_root, store, tmp_path), "freeze=lora", "lr_study.trials=2"]
    cfg = study_cli.compose_trial("lora", study_cli.for_studies(args)[1])
    study = lrstorage.open_study(cfg)
    _finished(study, [1e-4])
    running = study.ask()  # another worker's trial, still running
    late = study.ask()  # asked at the same time: the study's two are taken
    with pytest.raises(lrstudy.Surplus):
        lrstudy._trial(study, late, cfg, [], tmp_path / "jobs")
    assert not (tmp_path / "jobs").exists() and "process" not in late.user_attrs
    assert running.number < late.number


def test_a_study_is_named_by_its_trials_settings_not_by_a_workers_resources():
    def name(*extra: str) -> str:
        options, overrides = study_cli.for_studies(["experiment=fair", "freeze=lora", *extra])
        return lrstorage.study_name(study_cli.compose_trial(options[0], overrides))

    plain = name()
    assert name("trainer.threads=1", "trainer.eval_batch_size=8") == plain
    assert name("trainer.epochs=3") != plain and name("trainer.weight_decay=0.1") != plain


def test_a_trial_without_threads_takes_its_share_of_the_cpus_as_the_studys_trials_come_and_go(
    tmp_path,
):
    import torch
    from helpers.runs import FakeRecorder

    from ablate.lrstudy.cpus import ShareCpus
    from ablate.tracking.provenance import process
    from ablate.training.resources import usable_cpus

    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", study_name="s")
    mine, neighbour, dead, elsewhere = (study.ask() for _ in range(4))
    here = process()
    for t in (mine, neighbour):
        t.set_user_attr("process", {"trial": t.number, **here})
    # a SIGKILLed worker's trial not yet failed, and a trial on another machine: not counted
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                          capture_output=True, check=True).stdout.strip()  # fmt: skip
    dead.set_user_attr("process", {"trial": dead.number, **here, "pid": int(gone)})
    elsewhere.set_user_attr("process", {"trial": elsewhere.number, **here, "host": "elsewhere"})
    before, record = torch.get_num_threads(), FakeRecorder()
    try:
        share = ShareCpus(study, mine.number, record)
        assert share.share(step=0) == max(1, usable_cpus() // 2) == torch.get_num_threads()
        study.tell(neighbour, 0.5)  # the other worker's trial ends: this one takes every CPU
        assert share.share(step=7) == usable_cpus() == torch.get_num_threads()
        if usable_cpus() > 1:  # a change is a metric of the run
            assert record.metric_log == {"torch_threads": usable_cpus()}
        # a storage that fails mid-training: the trial trains on with the threads it has
        torch.set_num_threads(1)
        with sqlite3.connect(tmp_path / "s.db") as db:
            db.execute("DROP TABLE trial_user_attributes")
        assert share.share(step=9) == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
