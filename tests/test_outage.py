"""A tracking server that goes away mid-run: a real ``mlflow server`` on 127.0.0.1, stopped
and started again around a real training run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers.data import ROOT
from helpers.runs import slice_overrides
from helpers.scale import free_port
from helpers.store import logged_runs, run_info
from mlflow.tracking import MlflowClient

from ablate.server import control
from ablate.tracking.journal import FOLDER, answers

EPOCHS = 6
PER_EPOCH = ("dev_accuracy", "train_loss", "epoch_time_s")


@pytest.fixture(scope="module")
def mlflow_server():
    """``mlflow server`` on loopback over a sqlite file (one for the file's tests: each starts it
    again if a test before left it stopped), and a way to start it again."""
    folder = Path(tempfile.mkdtemp(prefix="ablate-outage-"))
    port = free_port()
    # the server's own folder: started as root, the server runs as a user of its own
    db = f"sqlite:///{folder / control.HOME / 'mlflow.db'}"
    uri = control.start(folder, port, 0, db_url=db)

    def restart() -> None:
        control.start(folder, port, 0, db_url=db)

    yield uri, folder, restart
    control.stop(folder)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def live(mlflow_server, request):
    """The server, answering, and an experiment of this test's own."""
    uri, folder, restart = mlflow_server
    if not answers(uri):
        restart()
    return uri, folder, restart, request.node.name[:60]


def start_training(slice_root, uri: str, out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.Popen(
        [sys.executable, "-m", "ablate.train", *slice_overrides(slice_root, uri, out),
         f"trainer.epochs={EPOCHS}", *extra],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_for(condition, timeout: float = 300, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def first_epoch_logged(uri: str, experiment: str) -> bool:
    runs = logged_runs(uri, experiment)
    return bool(runs) and "dev_accuracy" in runs[0].data.metrics


def journal_has_pending(journal: Path, for_s: float = 2.0) -> bool:
    """The run recorded something the absent server has not received, and still has not
    ``for_s`` later (a record between its write and its send, while the server still answers,
    is pending for milliseconds)."""

    def pending() -> bool:
        lines = journal / "journal.jsonl"
        if not lines.is_file():
            return False
        with lines.open() as f:
            count = sum(1 for line in f if line.strip())
        return count > int((journal / "sent").read_text() or 0)

    if not pending():
        return False
    time.sleep(for_s)
    return pending()


def assert_complete(uri: str, experiment: str) -> None:
    (run,) = logged_runs(uri, experiment)
    client = MlflowClient(uri)
    assert run.info.status == "FINISHED"
    assert run.info.end_time is not None
    for key in PER_EPOCH:
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
        assert steps == list(range(1, EPOCHS + 1)), key
    assert "test_accuracy" in run.data.metrics
    assert "error" not in run.data.tags
    assert run.data.params["trainer.epochs"] == str(EPOCHS)
    paths = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "run.json", ".hydra"} <= paths
    info = run_info(uri, run.info.run_id)
    assert {"environment", "data", "speed"} <= set(info)
    assert len(run.inputs.dataset_inputs) == 3


@pytest.mark.heavy
def test_a_server_away_mid_run_gets_the_whole_record_when_it_is_back(live, slice_root, tmp_path):
    uri, folder, restart, name = live
    proc = start_training(slice_root, uri, tmp_path, f"tracking.experiment={name}")
    wait_for(lambda: first_epoch_logged(uri, name), what="epoch 1 in the store")
    control.stop(folder)  # the server goes away with the run in the middle of its epochs
    journal = tmp_path / "run" / FOLDER
    wait_for(lambda: journal_has_pending(journal), what="a record kept while away")
    time.sleep(3)
    restart()
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert "does not answer: training goes on" in out + err
    assert_complete(uri, name)
    assert not journal.exists()  # everything is in the store: nothing left to replay


@pytest.mark.heavy
def test_a_longer_outage_fails_in_one_line_and_the_record_replays(live, slice_root, tmp_path):
    uri, folder, restart, name = live
    proc = start_training(
        slice_root, uri, tmp_path, f"tracking.experiment={name}", "tracking.outage_min=0.05"
    )
    wait_for(lambda: first_epoch_logged(uri, name), what="epoch 1 in the store")
    control.stop(folder)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 2, err[-3000:]
    (line,) = [x for x in (out + err).splitlines() if "ERROR" in x]
    job = tmp_path / "run"
    assert "no answer for 0.05 min (tracking.outage_min)" in line
    assert f"python -m ablate.tracking.replay {job}" in line
    assert "Traceback" not in err

    restart()
    (run,) = logged_runs(uri, name)
    assert run.info.status == "RUNNING"  # the server never heard the end
    replay = subprocess.run(
        [sys.executable, "-m", "ablate.tracking.replay", str(job)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr[-3000:]
    assert f"run {run.info.run_id}:" in replay.stdout
    assert_complete(uri, name)
    assert not (job / FOLDER).exists()
    # a second replay finds nothing to send
    again = subprocess.run(
        [sys.executable, "-m", "ablate.tracking.replay", str(job)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert again.returncode == 2 and "no mlflow_journal/journal.jsonl here" in again.stderr
