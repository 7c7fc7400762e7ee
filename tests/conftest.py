"""Shared fixtures: offline hub, real data slices, a temporary MLflow store, the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ablate import config

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # `make bench`'s code, outside the package
SHARED_DATA = ROOT.parent / "shared" / "data"
os.environ.setdefault("ABLATE_DATA_DIR", str(SHARED_DATA))
DATA = Path(os.environ["ABLATE_DATA_DIR"])
NAIJA = DATA / "ud" / "UD_Naija-NSC"
EWT = DATA / "ud" / "UD_English-EWT"


def pytest_configure(config):
    """Under pytest-xdist, pin each worker to its own share of the CPUs: runs in a worker (and
    the CLI processes it starts, which inherit the mask) then take only those cores, so two
    workers never contend for one."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    mine = cpus[int(worker[2:]) :: count] or cpus
    os.sched_setaffinity(0, mine)


def pytest_collection_modifyitems(items):
    """Files with a ``heavy`` test first: pytest-xdist hands out whole files in this order
    (``--no-loadscope-reorder``), so the minutes-long ones start at once on both workers
    instead of one of them finishing the suite alone. Every test that starts a process (the
    CLI, a server) or is ``heavy`` is marked ``process``: `make test-fast` leaves those out."""
    for item in items:
        if item.get_closest_marker("heavy") or _starts_a_process(item):
            item.add_marker("process")
    heavy = {item.path for item in items if item.get_closest_marker("heavy")}
    items.sort(key=lambda item: item.path not in heavy)  # stable: the rest keep their order


# What a test calls, directly or through its fixtures and its module's helpers, when it starts
# a process (the CLI, a server) or runs the entry points that launch jobs (ablate.search's
# studies, the bench); found in the code so that no list of such tests is kept by hand.
_PROCESS_CALLS = {"run_cli", "subprocess", "Popen", "Parallel", "search", "bench", "bench_gpu"}


def _starts_a_process(item) -> bool:
    import inspect

    functions = [getattr(item, "function", None)]
    functions += [d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs]
    seen: set = set()
    while functions:
        fn = functions.pop()
        fn = inspect.unwrap(fn) if callable(fn) else None
        if fn is None or fn in seen or not hasattr(fn, "__code__"):
            continue
        seen.add(fn)
        names = set(fn.__code__.co_names)
        if names & _PROCESS_CALLS:
            return True
        scope = getattr(fn, "__globals__", {})
        functions += [scope[n] for n in names if inspect.isfunction(scope.get(n))]
    return False


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


def naija_slice(root: Path, name: str, train: int, held_out: int = 40) -> Path:
    """``root`` as a data root with ``ud/UD_Naija-<name>``: the first ``train`` real Naija
    training sentences and ``held_out`` each of dev and test."""
    blocks = {s: conllu_blocks(NAIJA / f"pcm_nsc-ud-{s}.conllu") for s in ("train", "dev", "test")}
    sizes = {"train": train, "dev": held_out, "test": held_out}
    write_treebank(
        root / "ud" / f"UD_Naija-{name}", f"pcm_{name.lower()}",
        {split: blocks[split][:n] for split, n in sizes.items()},
    )  # fmt: skip
    return root


@pytest.fixture(scope="session")
def slice_root(tmp_path_factory) -> Path:
    """A data root with ``ud/UD_Naija-Slice``: the first 120/40/40 real Naija sentences."""
    return naija_slice(tmp_path_factory.mktemp("data"), "Slice", 120)


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


def logged_runs(store: str, experiment: str = "ablate", sweeps: bool = False) -> list:
    """Every training run of ``experiment`` in the MLflow store ``store`` (with ``sweeps``, the
    sweeps' parent runs too), read with MlflowClient."""
    client = MlflowClient(store)
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id]) if found else []
    return [r for r in runs if sweeps or r.data.tags.get("ablate.role") != "sweep"]


def sweep_parents(store: str, experiment: str = "ablate") -> list:
    """The sweeps' parent runs of ``experiment``."""
    return [r for r in logged_runs(store, experiment, sweeps=True)
            if r.data.tags.get("ablate.role") == "sweep"]  # fmt: skip


def run_info(store: str, run_id: str) -> dict:
    """A run's ``run.json``: its environment, data files and what each speed plugin applied."""
    import json
    import tempfile

    path = MlflowClient(store).download_artifacts(run_id, "run.json", tempfile.mkdtemp())
    return json.loads(Path(path).read_text())


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


def compose_cfg(*overrides: str):
    """The composed ``train`` config with ``overrides``, as ``python -m ablate.train`` sees it."""
    return config.compose(*overrides)


class FakeRecorder:
    """Collects what a run records (``ablate.training.recorder.Recorder``), in memory."""

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


# The NER and SST-2 files under the shared data root, and overrides that read a slice of them
CONLL = DATA / "conll2003"
SST2 = DATA / "sst2"
UNPIN = [f"data.splits.{s}.sha256=null" for s in ("train", "dev", "test")]


@pytest.fixture(scope="module")
def task_root(tmp_path_factory) -> Path:
    """A data root laid out like the shared one, with slices of the real files: CoNLL-2003's first
    blocks (-DOCSTART- blocks included) and SST-2's first rows."""
    root = tmp_path_factory.mktemp("tasks")
    (root / "conll2003").mkdir()
    for name, n in (("train", 130), ("valid", 45), ("test", 45)):
        blocks = (CONLL / f"{name}.txt").read_text("utf-8").split("\n\n")[:n]
        (root / "conll2003" / f"{name}.txt").write_text("\n\n".join(blocks) + "\n\n", "utf-8")
    (root / "sst2").mkdir()
    for name, n in (("train", 300), ("dev", 80)):
        lines = (SST2 / f"{name}.tsv").read_text("utf-8").splitlines(keepends=True)[: n + 1]
        (root / "sst2" / f"{name}.tsv").write_text("".join(lines), "utf-8")
    return root


def fit_run(store: str, *overrides: str):
    """A run (what the CLI runs) in this process; returns (cfg, run, results)."""
    cfg = compose_cfg(f"tracking.uri={store}", *overrides)
    run_id, results = fit_here(cfg)
    return cfg, MlflowClient(store).get_run(run_id), results


@pytest.fixture(scope="session")
def tokenizer():
    """The packaged MiniLM's tokenizer (the tiny model's too)."""
    from ablate.models.build import load_tokenizer

    return load_tokenizer(compose_cfg("model=tiny").model)


@pytest.fixture(scope="session")
def features(slice_root, tokenizer):
    """The Naija slice's train and dev windows, encoded for the POS task."""
    from ablate import tasks

    pos = tasks.get("pos")
    folder = slice_root / "ud" / "UD_Naija-Slice"
    label2id = {name: i for i, name in enumerate(pos.labels)}
    return {
        s: pos.encode(
            pos.read(next(folder.glob(f"*-ud-{s}.conllu")), lowercase=True),
            tokenizer,
            label2id,
            128,
        )
        for s in ("train", "dev")
    }
