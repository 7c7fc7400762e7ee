"""Real runs for a test: the CLI in a subprocess (stopped with Ctrl-C if asked), or a run fit in
this process as the CLI fits it; the composed config and the overrides of a fast run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from mlflow.tracking import MlflowClient

from ablate import config
from ablate.training.checkpoints import last_complete
from helpers.data import ROOT


def compose_cfg(*overrides: str):
    """The composed ``train`` config with ``overrides``, as ``python -m ablate.train`` sees it."""
    return config.compose(*overrides)


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


def run_cli(
    *args: str, cwd: Path = ROOT, timeout: int = 600, prefix: Sequence[str] = (),
    module: str = "ablate.train", env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:  # fmt: skip
    """``python -m ablate.train ARGS`` (or ``module``) in a real subprocess (``prefix``: a
    command it runs under, e.g. ``taskset -c 0``; ``env``: variables added)."""
    # one system-metrics sample a second: the tests' runs last seconds, not the default 10
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "1",
           **(env or {})}  # fmt: skip
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run(
        [*prefix, sys.executable, "-m", module, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def interrupted(args: list[str], after: str, checkpoint: Path | None = None) -> tuple[int, str]:
    """Run ``python -m ablate.train ARGS`` and press Ctrl-C (SIGINT) once a console line
    contains ``after`` (and, with ``checkpoint``, once an epoch checkpoint is complete in that
    folder); returns its exit code and console output."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate.train", *args], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        # a terminal's Ctrl-C: SIGINT with its default handling (a background shell ignores it)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if after in line:
            while checkpoint is not None and not last_complete(str(checkpoint)):
                time.sleep(0.05)  # the epoch's checkpoint is written after its evaluation
            proc.send_signal(signal.SIGINT)
            after = "\0"  # once
    return proc.wait(timeout=300), "".join(lines)


class FakeRecorder:
    """Collects what a run records (``ablate.tracking.recorder.Recorder``), in memory."""

    resumed = None

    def __init__(self):
        self.tag_log: dict[str, str] = {}
        self.metric_log: dict[str, float] = {}

    def tags(self, tags):
        self.tag_log.update({k: str(v) for k, v in tags.items()})

    def metrics(self, values, step=None):
        self.metric_log.update(values)

    def heartbeat(self):
        pass

    def info(self, section, values):
        self.info_log = {**getattr(self, "info_log", {}), section: dict(values)}

    def dataset(self, name, source, sha256, context):
        pass


def fit_here(cfg, prepared=None):
    """One run of ``cfg`` in this process, as the CLI runs it: prepared (unless ``prepared`` is
    given), then tracked and fit. Returns (run id, results)."""
    from ablate.strategies import STRATEGIES
    from ablate.tracking.run import start_run
    from ablate.training import checkpoints
    from ablate.training.fit import fit
    from ablate.training.prepare import prepare

    prepared = prepared if prepared is not None else prepare(cfg)
    keys = STRATEGIES[cfg.freeze.strategy].keys
    with start_run(cfg, prepared.files.sha256, keys, checkpoints.resumable) as run:
        results = fit(cfg, prepared, run)
    return run.id, results


def fit_run(store: str, *overrides: str):
    """A run (what the CLI runs) in this process; returns (cfg, run, results)."""
    cfg = compose_cfg(f"tracking.uri={store}", *overrides)
    run_id, results = fit_here(cfg)
    return cfg, MlflowClient(store).get_run(run_id), results


def train(slice_root, store, tmp_path, *overrides):
    """A real run on the Naija slice in this process: its run id and prepared inputs."""
    from ablate.training.prepare import prepare

    cfg = compose_cfg(*slice_overrides(slice_root, store, tmp_path), *overrides)
    prepared = prepare(cfg)
    run_id, _ = fit_here(cfg, prepared)
    return run_id, prepared


def kept_minilm_run(slice_root, store, tmp_path, monkeypatch, *overrides):
    """A short real run of the packaged MiniLM with ``overrides``, whose kept model's
    ``runs:/<id>/model`` then resolves (the store is the process's tracking URI): its run id and
    prepared inputs."""
    found = train(
        slice_root, store, tmp_path, "model=minilm", "trainer.epochs=1",
        "data.max_train_sentences=48", *overrides,
    )  # fmt: skip
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    return found


def refused_before_loading(
    *args: str, modules: Sequence[str] = ("torch", "transformers", "mlflow")
) -> subprocess.CompletedProcess:
    """``python -m ablate.train ARGS`` run in a fresh Python that then prints its exit code and
    which of ``modules`` it loaded (a refusal, or ``--help``, should load none)."""
    probe = (
        "import runpy, sys\n"
        f"sys.argv = ['ablate.train', *{list(args)!r}]\n"
        "try:\n    runpy.run_module('ablate.train', run_name='__main__')\n"
        "except SystemExit as exc:\n    print(exc.code)\n"
        f"print(sorted({set(modules)!r} & set(sys.modules)))\n"
    )
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
