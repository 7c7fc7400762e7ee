"""The suite's hooks (each xdist worker on its own CPUs, heavy files first, the ``process``
marker) and its shared fixtures (real data slices, the report tests' grid, a temporary MLflow
store, a file server on 127.0.0.1). What test modules share besides fixtures: tests/helpers."""

from __future__ import annotations

import functools
import http.server
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

# helpers' asserts report their values as a test's own do: registered before they are imported
pytest.register_assert_rewrite("helpers")

from helpers.data import CONLL, DATA, NAIJA, SST2, naija_slice  # noqa: E402

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("ABLATE_DATA_DIR", str(DATA))  # for the CLI processes the tests start

from helpers.grid import build_grid, grid_of, once_per_session  # noqa: E402
from helpers.grid import report_cli as run_report_cli  # noqa: E402
from helpers.runs import compose_cfg  # noqa: E402
from helpers.store import logged_runs, new_store  # noqa: E402


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
# a process (the CLI, a server) or runs the entry points that launch jobs (the lr study's
# command, the bench); found in the code so that no list of such tests is kept by hand.
_PROCESS_CALLS = {"run_cli", "subprocess", "Popen", "Parallel", "study_cli", "bench", "bench_gpu",
                  "contention"}  # fmt: skip


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


@pytest.fixture(scope="session")
def slice_root(tmp_path_factory) -> Path:
    """A data root with ``ud/UD_Naija-Slice``: the first 120/40/40 real Naija sentences."""
    return naija_slice(tmp_path_factory.mktemp("data"), "Slice", 120)


@pytest.fixture
def store(tmp_path) -> str:
    """A new sqlite MLflow store in a temporary folder, its schema made (``new_store``)."""
    return new_store(tmp_path)


@pytest.fixture(scope="session")
def report_grid(slice_root, tmp_path_factory) -> SimpleNamespace:
    """The report tests' real tiny grid (``helpers.grid.build_grid``), built once per session
    and shared by the report modules: read it only, or take a ``helpers.grid.copy_grid``."""
    build = functools.partial(build_grid, slice_root)
    grid = grid_of(once_per_session(tmp_path_factory, "report-grid", build))
    before = sorted((r.info.run_id, r.info.status) for r in logged_runs(grid.store, sweeps=True))
    yield grid
    after = sorted((r.info.run_id, r.info.status) for r in logged_runs(grid.store, sweeps=True))
    assert after == before, "a test wrote to the shared report grid: give it a copy_grid"


@pytest.fixture(scope="session")
def report_cli(report_grid, tmp_path_factory) -> SimpleNamespace:
    """``python -m ablate.report`` on the grid's store, once per session: its folder (``out``)
    and console output (``stdout``)."""

    def produce(folder: Path) -> None:
        (folder / "stdout.txt").write_text(run_report_cli(report_grid, folder / "report"))

    folder = once_per_session(tmp_path_factory, "report-cli", produce)
    return SimpleNamespace(out=folder / "report", stdout=(folder / "stdout.txt").read_text())


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


@pytest.fixture
def server(tmp_path):
    """Serve a folder holding the real Naija split files on a free loopback port."""
    served = tmp_path / "served"
    served.mkdir()
    for split in ("train", "dev", "test"):
        (served / f"pcm_nsc-ud-{split}.conllu").write_bytes(
            (NAIJA / f"pcm_nsc-ud-{split}.conllu").read_bytes()
        )
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", served
    httpd.shutdown()
    httpd.server_close()
