"""`make ui`: MLflow's UI on a real store, pointing at each experiment's runs in a view that shows
the primary metric; it checks its port first, and a run names the port it serves on."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import psutil
from helpers.data import ROOT
from helpers.runs import compose_cfg
from mlflow.tracking import MlflowClient

from ablate.tracking import ui_links
from ablate.tracking.run import start_run
from ablate.tracking.store import EXPERIMENT_KIND, prepare
from ablate.tracking.ui_links import where_to_browse


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_experiments_are_tagged_so_the_ui_opens_on_their_runs(store):
    client = MlflowClient(store)
    made = client.create_experiment("before")  # an experiment made by MLflow itself
    prepare(store, "before")
    assert client.get_experiment(made).tags[EXPERIMENT_KIND] == "custom_model_development"
    client.set_experiment_tag(made, EXPERIMENT_KIND, "genai_development")  # a user's choice
    prepare(store, "before")
    assert client.get_experiment(made).tags[EXPERIMENT_KIND] == "genai_development"
    fresh = client.get_experiment(prepare(store, "fresh"))
    assert fresh.tags[EXPERIMENT_KIND] == "custom_model_development"


def test_a_run_gives_its_experiment_a_view_with_the_primary_metric(store, tmp_path):
    cfg = compose_cfg("model=tiny", f"tracking.uri={store}")  # Naija POS: accuracy
    with start_run(cfg) as run:
        pass
    tags = MlflowClient(store).get_experiment(run.experiment_id).tags
    shown = json.loads(tags["mlflow.sharedViewState.ablate-pos"])  # read by the UI as it is
    best, test = "metrics.`best_dev_accuracy`", "metrics.`test_accuracy`"
    assert shown["selectedColumns"][:2] == [best, test]
    params = {"params.`data.name`", "params.`freeze.name`", "params.`trainer.lr`", "params.`seed`"}
    assert params <= set(shown["selectedColumns"])
    logged = MlflowClient(store).get_run(run.id).data.params
    assert {p.split("`")[1] for p in params} <= set(logged)  # columns of params runs log
    assert shown["orderByKey"] == best and shown["orderByAsc"] is False
    page = f"/#/experiments/{run.experiment_id}/runs?viewStateShareKey=ablate-pos&workflowType="
    assert page in ui_links.address("http://h:1", run.experiment_id, view="ablate-pos")


def test_make_ui_prints_each_experiments_runs_page_and_serves_it(store, monkeypatch):
    experiment = prepare(store, "grid")
    ui_links.set_view(MlflowClient(store), experiment, "pos")
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": store, "PORT": str(port)}
    monkeypatch.delenv("PORT", raising=False)
    assert f"make ui, then http://127.0.0.1:{ui_links.PORT}/" in where_to_browse(
        store, experiment, "r"
    )
    monkeypatch.setenv("PORT", str(port))  # as make passes it on
    assert f"make ui PORT={port}, then" in where_to_browse(store, experiment, "r")
    proc = subprocess.Popen(
        ["make", "-s", "ui"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        first = [proc.stdout.readline() for _ in range(2)]
        page = (f"http://127.0.0.1:{port}/#/experiments/{experiment}/runs"
                "?viewStateShareKey=ablate-pos&workflowType=machine_learning")  # fmt: skip
        assert first[1].strip() == f"experiment 'grid': {page}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert r.status == 200 and b"<html" in r.read().lower()  # the UI itself
        # without MLflow's GenAI job runner and its huey consumers
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert not [p.cmdline() for p in tree if "huey" in " ".join(p.cmdline())]
        served = [p for p in tree if "mlflow" in p.cmdline() and "ui" in p.cmdline()]
        assert served and served[0].environ()["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"

        # a run names the UI that serves its store, on whatever port, whatever $PORT says
        monkeypatch.setenv("PORT", "1")
        assert where_to_browse(store, experiment, "r").startswith(
            f"open http://127.0.0.1:{port}/#/experiments/{experiment}/runs/r?"
        )
        # a second make ui on that port: one line, before it prints anything else
        again = subprocess.run(["make", "-s", "ui"], cwd=ROOT, env=env, capture_output=True,
                               text=True, timeout=60)  # fmt: skip
        assert again.returncode == 2 and again.stdout == ""
        (line,) = [x for x in again.stderr.splitlines() if x.startswith("ablate: error")]
        assert f"make ui already serves {store} at http://127.0.0.1:{port}" in line
    finally:
        os.killpg(proc.pid, 15)  # make and the server it started, nothing else
        proc.wait(timeout=30)
    console = proc.stdout.read()  # what the user reads under the addresses: no library noise
    assert "uvicorn running on" in console.lower() and "DeprecationWarning" not in console
    deadline = time.monotonic() + 60
    while ui_links.serving(store) is not None:  # the UI stops its workers before it exits
        assert time.monotonic() < deadline
        time.sleep(0.2)
    monkeypatch.setenv("PORT", str(port))
    later = where_to_browse(store, experiment, "r")  # that UI has stopped
    assert later.startswith(f"browse it with: make ui PORT={port}, then")


def test_make_ui_on_a_taken_port_says_so_in_one_line(store):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "ablate.server.ui", "--uri", store, "--port", str(port)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert f"127.0.0.1:{port} is taken (Address already in use) (pid {os.getpid()}: " in line
    assert line.endswith(f"choose another port: make ui PORT={port + 1}")
