"""Interrupted runs, resumable sweeps, reproducibility: real processes, real store."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import psutil
import pytest
from helpers.data import NAIJA, ROOT, conllu_blocks, naija_slice, write_treebank
from helpers.runs import compose_cfg, run_cli, slice_overrides
from helpers.store import logged_runs, new_store, run_info
from mlflow.tracking import MlflowClient

from ablate.tasks.pos import read_conllu
from ablate.tracking import procs
from ablate.tracking.identity import identity
from ablate.tracking.run import start_run
from ablate.tracking.stale import mark_stale_runs
from ablate.tracking.store import prepare
from ablate.training import checkpoints
from ablate.training.fit import fit
from ablate.training.prepare import prepare as prepare_run
from ablate.training.trainer import CoreTrainer


def runs_in(store: str, experiment: str = "ablate"):
    return MlflowClient(store), logged_runs(store, experiment)


def test_killed_run_is_marked_killed_and_resumes_into_the_same_run(tmp_path):
    store = new_store(tmp_path)
    # Enough training sentences that epoch 2 lasts long past the poll; few dev/test ones.
    naija_slice(tmp_path / "data", "Kill", 1500)
    common = [
        "data=ud", "data.treebank=UD_Naija-Kill", f"data.root={tmp_path / 'data'}", "model=tiny",
        "trainer.epochs=3", f"tracking.uri={store}",
    ]  # fmt: skip
    out = tmp_path / "first"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate.train", *common, f"hydra.run.dir={out}"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not list((out / "trainer").glob("checkpoint-*/trainer_state.json")):
        assert time.monotonic() < deadline, "no checkpoint after 300 s"
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # mid-epoch 2: epoch 1 is checkpointed
    proc.wait()

    client, (run,) = runs_in(store)
    assert run.info.status == "RUNNING"  # what a SIGKILL leaves behind
    done = [m.step for m in client.get_metric_history(run.info.run_id, "dev_accuracy")]
    assert done and max(done) < 3
    # every callback's record of the checkpointed epoch's evaluation was sent before its checkpoint
    timed = [m.step for m in client.get_metric_history(run.info.run_id, "dev_eval_time_s")]
    assert 1 in done and 1 in timed

    exp_id = prepare(store, "ablate", stale_after_min=30)  # the next start
    run = client.get_run(run.info.run_id)
    assert run.info.status == "KILLED"
    assert "is gone" in run.data.tags["ablate.killed_reason"]
    assert exp_id == run.info.experiment_id

    resumed = run_cli(*common, "trainer.resume=true", f"hydra.run.dir={tmp_path / 'second'}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    client, runs = runs_in(store)
    assert len(runs) == 1  # continued the same MLflow run
    run = runs[0]
    assert run.info.status == "FINISHED" and run.data.tags["ablate.resumed"] == "true"
    history = client.get_metric_history(run.info.run_id, "dev_accuracy")
    assert sorted(m.step for m in history) == [1, 2, 3]
    assert run.data.metrics["best_dev_accuracy"] == max(m.value for m in history)
    assert "test_accuracy" in run.data.metrics
    assert not list((out / "trainer").glob("checkpoint-*"))  # cleaned once finished


def test_skip_finished_reruns_only_the_missing_jobs_of_a_grid(slice_root, tmp_path):
    store = new_store(tmp_path)
    base = [*slice_overrides(slice_root, store, tmp_path), "trainer.epochs=1"]
    first = run_cli("--multirun", *base, "freeze=none,all")
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_cli(
        "--multirun", *base, "freeze=none,all,first2", "skip_finished=true",
        f"hydra.sweep.dir={tmp_path / 'again'}",
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    _, runs = runs_in(store)
    assert sorted(r.data.params["freeze.name"] for r in runs) == ["all", "first2", "none"]
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert (again.stdout + again.stderr).count("skip_finished: identical config") == 2


def test_same_seed_gives_identical_dev_metrics_and_a_full_record(slice_root, tmp_path):
    store = new_store(tmp_path)
    proc = run_cli("--multirun", *slice_overrides(slice_root, store, tmp_path), "seed=7,7")
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, runs = runs_in(store)
    assert len(runs) == 2
    histories = [
        [
            m.value
            for m in sorted(
                client.get_metric_history(r.info.run_id, "dev_accuracy"), key=lambda m: m.step
            )
        ]
        for r in runs
    ]
    assert histories[0] == histories[1]
    assert runs[0].data.metrics["test_accuracy"] == runs[1].data.metrics["test_accuracy"]
    tags = runs[0].data.tags
    assert tags["ablate.identity"] == runs[1].data.tags["ablate.identity"]
    environment = run_info(store, runs[0].info.run_id)["environment"]
    for package in ("torch", "transformers", "peft", "datasets", "mlflow", "hydra-core"):
        assert environment[package] not in ("", "absent")
    assert tags["device"] == environment["device"] == "cpu"
    assert tags["git.dirty"] in ("True", "False")


def test_identity_ignores_where_runs_go_but_not_what_they_compute(slice_root, tmp_path):
    base = identity(compose_cfg())
    same = compose_cfg("tracking.uri=sqlite:////x.db", "trainer.resume=true")
    other = compose_cfg("trainer.lr=1e-4")
    assert identity(same) == base
    assert identity(other) != base

    # An unpinned treebank: the same files under another root are the same run, other files
    # under the same config are not.
    folder = slice_root / "ud" / "UD_Naija-Slice"
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy / "ud" / "UD_Naija-Slice")
    slice_cfg = ["data=ud", "data.treebank=UD_Naija-Slice"]
    first = compose_cfg(*slice_cfg, f"data.root={slice_root}")
    moved = compose_cfg(*slice_cfg, f"data.root={copy}")
    assert identity(moved) == identity(first)
    train = copy / "ud" / "UD_Naija-Slice" / "pcm_slice-ud-train.conllu"
    blocks = conllu_blocks(train)
    train.write_text("\n".join(blocks[:-1]) + "\n", "utf-8")  # one sentence fewer
    assert identity(moved) != identity(first)

    # An extra test file given relative to data.root: its content counts, not its name
    shutil.copy(folder / train.name, train)  # the same treebank again
    other = tmp_path / "other"  # a third root with the same treebank (slice_root stays as it is)
    shutil.copytree(folder, other / "ud" / "UD_Naija-Slice")
    extra = "zero-shot/UD_Other/x-ud-test.conllu"
    for root in (other, copy):
        (root / extra).parent.mkdir(parents=True)
        shutil.copy(folder / "pcm_slice-ud-test.conllu", root / extra)
    a, b = (compose_cfg(*slice_cfg, f"data.root={r}", f"data.extra_test=[{extra}]")
            for r in (other, copy))  # fmt: skip
    assert identity(a) == identity(b)
    (copy / extra).write_text("\n".join(conllu_blocks(copy / extra)[:-1]) + "\n", "utf-8")
    assert identity(a) != identity(b)

    # A model folder counts by its content, not its path (each checkout has its own venv path);
    # a randomly initialised model (tiny) by everything but its weights.
    packaged = compose_cfg("model=tiny")
    model_copy = tmp_path / "model"
    shutil.copytree(
        packaged.model.name_or_path, model_copy, ignore=shutil.ignore_patterns("*.safetensors")
    )
    moved, pretrained, pretrained_moved = (
        compose_cfg(*overrides)
        for overrides in (
            ["model=tiny", f"model.name_or_path={model_copy}"],
            ["model=minilm"],
            ["model=minilm", f"model.name_or_path={model_copy}"],
        )
    )
    assert identity(moved) == identity(packaged)
    assert identity(pretrained_moved) != identity(pretrained)  # no weights
    config = model_copy / "config.json"
    config.write_text(config.read_text().replace('"hidden_act": "gelu"', '"hidden_act": "relu"'))
    assert identity(moved) != identity(packaged)


@pytest.mark.parametrize("beat_age_min", [5, 45])
def test_runs_without_a_heartbeat_from_another_host_are_killed_only_when_stale(
    tmp_path, beat_age_min
):
    store = new_store(tmp_path)
    exp_id = prepare(store, "ablate")
    client = MlflowClient(store)
    beat = f"{time.time() - beat_age_min * 60:.0f}"
    process = {"host": "elsewhere", "pid": 1, "started": "1.00"}
    tags = {"ablate.process": json.dumps(process), "ablate.heartbeat": beat}
    run = client.create_run(exp_id, tags=tags)
    killed = mark_stale_runs(client, exp_id, stale_after_s=30 * 60)
    assert killed == ([run.info.run_id] if beat_age_min > 30 else [])
    assert client.get_run(run.info.run_id).info.status == (
        "KILLED" if beat_age_min > 30 else "RUNNING"
    )


def test_a_quiet_run_of_a_live_process_on_this_host_is_kept_and_a_reused_pid_is_not(tmp_path):
    store = new_store(tmp_path)
    exp_id = prepare(store, "ablate")
    client = MlflowClient(store)
    here, pid = socket.gethostname(), os.getpid()
    old_beat = f"{time.time() - 45 * 60:.0f}"  # quiet for 45 min: a long evaluation, say

    def recorded(started):
        process = {"host": here, "pid": pid, "started": started}
        return {"ablate.process": json.dumps(process), "ablate.heartbeat": old_beat}

    quiet = client.create_run(exp_id, tags=recorded(procs.started(pid)))
    reused = client.create_run(exp_id, tags=recorded("1.00"))  # another start, the same pid
    # a run of an earlier version recorded its process in three tags
    older = client.create_run(exp_id, tags={
        "host": here, "ablate.pid": str(pid), "ablate.pid_started": "1",
        "ablate.heartbeat": old_beat,
    })  # fmt: skip
    killed = mark_stale_runs(client, exp_id, stale_after_s=30 * 60)
    assert sorted(killed) == sorted([reused.info.run_id, older.info.run_id])
    assert client.get_run(quiet.info.run_id).info.status == "RUNNING"
    reason = client.get_run(reused.info.run_id).data.tags["ablate.killed_reason"]
    assert reason == f"process {pid} on {here} is gone"

    child = subprocess.Popen(["sleep", "60"])
    child_started = procs.started(child.pid)
    assert procs.same(child.pid, child_started) and not procs.same(child.pid, "1")
    child.kill()  # not waited for: an exited child that nobody reaped yet counts as gone
    deadline = time.monotonic() + 10
    while procs.alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not procs.alive(child.pid) and not procs.same(child.pid, child_started)


def zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_child_that_exits_while_alive_checks_it_is_reaped(monkeypatch):
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while not zombie(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)  # exited, not yet reaped
    real_waitpid, calls = os.waitpid, []

    def waitpid(pid, options):  # the first reap looks before the exit (the race seen in CI)
        calls.append(pid)
        return (0, 0) if len(calls) == 1 else real_waitpid(pid, options)

    monkeypatch.setattr(os, "waitpid", waitpid)
    assert not procs.alive(child.pid)
    monkeypatch.undo()
    with pytest.raises(ProcessLookupError):  # reaped: no zombie holds the pid
        os.kill(child.pid, 0)
    child.returncode = 0  # reaped here, not by Popen


def test_a_zombie_leader_whose_threads_still_run_counts_as_running_until_reaped():
    # The main thread ends first (shown as a zombie, not yet reapable); another ends it all later.
    code = (
        "import ctypes, os, threading, time\n"
        "threading.Thread(target=lambda: (time.sleep(1), os._exit(0))).start()\n"
        "ctypes.CDLL(None).pthread_exit(None)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 10
    while not zombie(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert zombie(child.pid)
    assert procs.alive(child.pid)  # its other thread still runs
    while procs.alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(ProcessLookupError):  # reaped once it could be: no zombie holds the pid
        os.kill(child.pid, 0)
    child.returncode = 0  # reaped here, not by Popen


def test_each_bad_input_is_one_named_error_and_leaves_no_run(slice_root, tmp_path):
    from helpers.data import conllu_blocks

    blocks = {
        s: conllu_blocks(NAIJA / f"pcm_nsc-ud-{s}.conllu")[:20] for s in ("train", "dev", "test")
    }
    ud = tmp_path / "data" / "ud"
    bad_columns = blocks["dev"][:2] + ["1\tdem\tdem\tPRON\n"]
    rows = blocks["test"][0].splitlines()
    first = next(i for i, row in enumerate(rows) if row.split("\t")[0].isdigit())
    columns = rows[first].split("\t")
    rows[first] = "\t".join([*columns[:3], "NOUN2", *columns[4:]])
    bad_tag = ["\n".join(rows) + "\n"]
    comment_only = ["# sent_id = nothing-here\n"]  # a sentence with zero words
    cases = {
        "UD_BadColumns": ({**blocks, "dev": bad_columns}, "x-ud-dev.conllu:"),
        "UD_BadTag": ({**blocks, "test": bad_tag}, "has label 'NOUN2', not one of ADJ"),
        "UD_NoTest": (
            {"train": blocks["train"], "dev": blocks["dev"]},
            "*-ud-test.conllu file, found 0",
        ),
        "UD_EmptyDev": ({**blocks, "dev": []}, "x-ud-dev.conllu: no sentences"),
        "UD_ZeroWords": ({**blocks, "dev": blocks["dev"] + comment_only}, None),
    }
    for name, (splits, _) in cases.items():
        write_treebank(ud / name, "x", splits)
    store = new_store(tmp_path)
    overrides = [
        "data=ud", f"data.root={tmp_path / 'data'}", "model=tiny", "trainer.epochs=1",
        f"tracking.uri={store}", f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]  # fmt: skip
    proc = run_cli("--multirun", *overrides, f"data.treebank={','.join(cases)}")
    assert proc.returncode != 0  # the sweep reports its failed jobs at the end
    models = run_cli(
        "--multirun", *overrides, "data.treebank=UD_ZeroWords",
        "model.name_or_path=/nope,bert-base-cased",
        f"hydra.sweep.dir={tmp_path / 'sweep2'}",
    )  # fmt: skip
    assert models.returncode != 0

    # Every error is caught before its run opens: only the good treebank's run is in the store,
    # and each bad job's log holds its one error line.
    _, runs = runs_in(store)
    assert [(r.data.params["data.name"], r.info.status) for r in runs] == [
        ("UD_ZeroWords", "FINISHED")
    ]
    (run,) = runs
    assert run.data.metrics["dev_empty_sentences"] == 1
    dev = read_conllu(next((ud / "UD_ZeroWords").glob("*-ud-dev.conllu")))
    assert run.data.metrics["dev_words"] == sum(len(x.words) for x in dev) > 0
    logged = proc.stdout + proc.stderr
    for name, (_, message) in cases.items():
        if message is not None:
            errors = [line for line in logged.splitlines() if "ERROR" in line and name in line]
            assert len(errors) == 1 and message in errors[0], name
    logged = models.stdout + models.stderr
    assert "'/nope': no such folder" in logged
    assert "is a hub id, and the Hugging Face hub is not reachable" in logged


def test_a_checkpoint_whose_state_a_kill_cut_short_is_passed_over(tmp_path):
    # a stop signal that lands while the Trainer writes trainer_state.json leaves it empty or cut
    for step, state in ((63, '{"epoch": 1.0, "global_step": 63}'), (126, ""), (189, '{"epo')):
        checkpoint = tmp_path / f"checkpoint-{step}"
        checkpoint.mkdir()
        (checkpoint / "model.safetensors").write_bytes(b"weights")
        (checkpoint / "trainer_state.json").write_text(state)
    assert checkpoints.last_complete(str(tmp_path)) == str(tmp_path / "checkpoint-63")
    assert checkpoints.epochs_done(str(tmp_path)) == 1


@pytest.mark.parametrize("fail_in_epoch", [1, 2])
def test_a_failed_run_keeps_its_checkpoint_folder_only_when_it_can_resume(
    slice_root, tmp_path, monkeypatch, fail_in_epoch
):
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where mkdtemp puts run folders
    original = CoreTrainer.training_step

    def crash(self, *args, **kwargs):  # a crash mid-run, as an out-of-memory error would be
        if self.state.epoch >= fail_in_epoch - 1:
            raise RuntimeError("injected crash")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(CoreTrainer, "training_step", crash)
    store = new_store(tmp_path)
    overrides = [o for o in slice_overrides(slice_root, store, tmp_path) if "hydra." not in o]
    cfg = compose_cfg(*overrides)
    prepared = prepare_run(cfg)
    with pytest.raises(RuntimeError, match="injected crash"), start_run(cfg) as run:
        fit(cfg, prepared, run)
    left = list(temp.iterdir())
    _, runs = runs_in(store)
    assert [r.info.status for r in runs] == ["FAILED"]
    if fail_in_epoch == 1:  # nothing to resume from: no folder left behind
        assert left == []
    else:  # epoch 1's checkpoint stays for trainer.resume
        (checkpoint,) = left[0].iterdir()  # epoch 1's, complete: trainer.resume can use it
        assert checkpoints.last_complete(str(left[0])) == str(checkpoint)
        assert runs[0].data.tags["ablate.checkpoint_dir"] == str(left[0])
