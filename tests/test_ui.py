"""`make ui`: MLflow's UI on a real store, pointing at each experiment's runs."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request

import psutil
from conftest import ROOT
from mlflow.tracking import MlflowClient

from ablate.tracking.store import EXPERIMENT_KIND, prepare


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


def test_make_ui_prints_each_experiments_runs_page_and_serves_it(store):
    experiment = prepare(store, "grid")
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": store, "PORT": str(port)}
    proc = subprocess.Popen(
        ["make", "-s", "ui"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        first = [proc.stdout.readline() for _ in range(2)]
        page = f"http://127.0.0.1:{port}/#/experiments/{experiment}?workflowType=machine_learning"
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
        ui = [p for p in tree if "mlflow" in p.cmdline() and "ui" in p.cmdline()]
        assert ui and ui[0].environ()["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    finally:
        os.killpg(proc.pid, 15)  # make and the server it started, nothing else
        proc.wait(timeout=30)
