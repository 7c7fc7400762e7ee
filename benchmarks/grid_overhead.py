"""A tiny grid's overhead before and after a change, on this machine: the bench's grid (10 jobs:
``none,all,first2,first4,alt`` x naija, ewt slices of 16 sentences, 1 epoch, MiniLM's shape with
tiny random weights, 2 workers) as ``python -m ablate.train --multirun``, run by an earlier commit's
code and by this checkout's in turn (ABBA order), each with a new store.

    python benchmarks/grid_overhead.py --before a36b099 --before-overrides hydra/launcher=joblib
    python benchmarks/grid_overhead.py --render benchmarks/measured/cpu-overhead-DATE.json

A sweep's **overhead** is its wall time minus its jobs' training and evaluation (their runs'
``train_runtime_s`` summed, over the workers): starting, tracking and reporting the jobs. The
earlier commit runs from a clone of this repository with a virtual environment of its own that
reads this one's packages. A benchmark, not a test: timings depend on the machine and its load,
which it records; run it on an idle machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import gpu_table
from bench_gpu import commit, init_models
from gpu_assets import write_shapes
from shared import write_slice

from ablate.tables import markdown_table

ROOT = Path(__file__).resolve().parents[1]
FREEZE, DATA, SENTENCES, WORKERS = "none,all,first2,first4,alt", ("naija", "ewt"), 16, 2
EXPERIMENT = "grid-overhead"
COLUMNS = ["pair", "code", "launched its jobs (s)", "first job started (s)",
           "last job finished (s)", "ended (s)", "jobs' training, summed (s)", "overhead (s)",
           "CPU (s)", "load average"]  # fmt: skip


def prepare(work: Path) -> list[str]:
    """Slices, MiniLM's shape with random weights drawn once: the grid's overrides (both codes
    read the same files)."""
    slices = work / "slices"
    sizes = dict.fromkeys(("train", "dev", "test"), SENTENCES)
    names = [write_slice(d, slices, sizes) for d in DATA]
    shapes = work / "shapes"
    write_shapes(shapes, {"naija": ["data=ud", f"data.treebank={names[0]}", f"data.root={slices}"]})
    models = init_models(SimpleNamespace(dry_run=True, seed=42), ["minilm"], shapes, work / "init")
    return [f"freeze={FREEZE}", "data=ud", f"data.treebank={','.join(names)}",
            f"data.root={slices}", "model=minilm", f"model.name_or_path={models['minilm']}",
            "trainer.epochs=1", f"data.max_train_sentences={SENTENCES}", "seed=42",
            f"hydra.launcher.n_jobs={WORKERS}"]  # fmt: skip


def checkout(rev: str, work: Path) -> str:
    """A clone of this repository at ``rev`` and a virtual environment whose python imports its
    ``src`` and this environment's packages; returns that python."""
    clone = work / "before"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", rev], check=True)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(work / "venv")], check=True)
    ask = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    python = str(work / "venv/bin/python")
    site = subprocess.run([python, "-c", ask], capture_output=True, text=True, check=True)
    # plain paths: this environment's own .pth files (the editable install of this checkout's
    # src) are not read, so the clone's ablate is the one imported
    Path(site.stdout.strip(), "before.pth").write_text(
        f"{clone / 'src'}\n{sysconfig.get_paths()['purelib']}\n"
    )
    return python


def sweep(python: str, overrides: list[str], work: Path, env: dict) -> dict:
    """One run of the grid with ``python``; its timeline and overhead."""
    work.mkdir(parents=True)
    uri = f"sqlite:///{work / 'grid.db'}"
    cmd = [python, "-m", "ablate.train", "--multirun", *overrides, f"tracking.uri={uri}",
           f"tracking.experiment={EXPERIMENT}", f"data.tokenized_cache_dir={work / 'tok'}",
           f"hydra.sweep.dir={work / 'sweep'}"]  # fmt: skip
    load = os.getloadavg()[0]
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    with open(work / "log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work).returncode
    wall = time.time() - started
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    marks = gpu_table.timeline((work / "log").read_text(errors="replace"), started, wall)
    marks.update(train_s=gpu_table.jobs_train_s(uri, EXPERIMENT), workers=WORKERS, rc=rc)
    marks.update(
        overhead_s=gpu_table.overhead(marks),
        cpu_s=cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime,
        load=[round(load, 2), round(os.getloadavg()[0], 2)],
    )
    return marks


IMPORT = """
import contextlib, importlib, os, time
t = time.perf_counter()
from ablate.workers import LATER, PRELOAD
for name in PRELOAD:
    importlib.import_module(name)
for name in LATER:
    with contextlib.suppress(ImportError):
        importlib.import_module(name)
print(time.perf_counter() - t)
os._exit(0)  # the import alone: not the interpreter's teardown of it
"""


def import_s(env: dict) -> float:
    """Seconds a fresh process takes to import what a sweep imports before its first job."""
    run = subprocess.run([sys.executable, "-c", IMPORT], env=env, capture_output=True, text=True)
    return float(run.stdout.split()[-1])


def render(saved: dict) -> str:
    """The runs as a table, and the overhead after / before pair by pair."""
    rows, ratios = [], []
    for pair in saved["pairs"]:
        for code in ("before", "after"):
            m = pair[code]
            cells = [m.get(k) for k in ("launch_s", "first_job_s", "last_done_s", "end_s",
                                        "train_s", "overhead_s", "cpu_s")]  # fmt: skip
            rows.append([str(pair["pair"]), code, *(f"{c:.1f}" if c is not None else "—"
                                                    for c in cells),
                         " to ".join(f"{x:.1f}" for x in m["load"])])  # fmt: skip
        ratios.append(pair["after"]["overhead_s"] / pair["before"]["overhead_s"])
    meta = saved["meta"]
    head = (f"{meta['device']}, {meta['cpus']} CPUs, {meta['date']}: before `{meta['before']}`, "
            f"after `{meta['after']}`.")  # fmt: skip
    tail = (f"Overhead after / before, pair by pair: {', '.join(f'{r:.2f}' for r in ratios)} "
            f"(median {statistics.median(ratios):.2f}).")  # fmt: skip
    before = statistics.median(p["before"]["overhead_s"] for p in saved["pairs"])
    imports = statistics.median(saved["import_s"])
    tail += (
        f" The training stack a sweep imports before its first job starts (`ablate.workers`'s "
        f"`PRELOAD` and `LATER`) takes {imports:.1f} s in a fresh process (median of "
        f"{len(saved['import_s'])}); a third of the median overhead before is {before / 3:.1f} s."
    )
    return "\n\n".join([head, markdown_table(rows, COLUMNS, right=COLUMNS[2:]), tail])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="the earlier commit (a revision of this repository)")
    parser.add_argument("--before-overrides", nargs="*", default=[],
                        help="what the earlier code needs besides (its launcher, say)")  # fmt: skip
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "grid-overhead.json")
    parser.add_argument("--render", type=Path, help="print a saved run's table and stop")
    args = parser.parse_args(argv)
    if args.render:
        print(render(json.loads(args.render.read_text())))
        return 0
    if not args.before:
        parser.error("--before REV is required (or --render FILE)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_DISABLE_TELEMETRY": "true",
           "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="ablate-grid-overhead-"))
    try:
        overrides = prepare(work)
        pythons = {"before": checkout(args.before, work), "after": sys.executable}
        extra = {"before": args.before_overrides, "after": []}
        pairs = []
        for i in range(1, args.pairs + 1):
            order = ("before", "after") if i % 2 else ("after", "before")  # ABBA
            pair = {"pair": i}
            for code in order:
                pair[code] = sweep(pythons[code], [*overrides, *extra[code]],
                                   work / f"{code}-{i}", env)  # fmt: skip
                print(code, i, json.dumps(pair[code]), flush=True)
            pairs.append(pair)
        imports = [round(import_s(env), 3) for _ in range(3)]
        from importlib.metadata import version

        saved = {
            "meta": {
                "device": f"CPU, torch {version('torch')}, transformers {version('transformers')}",
                "cpus": os.cpu_count(),
                "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d"),
                "before": " ".join([args.before, *args.before_overrides]),
                "after": commit(SimpleNamespace(assets=ROOT / ".gpu-bench")),
                "command": "python benchmarks/grid_overhead.py " + " ".join(argv or sys.argv[1:]),
            },
            "pairs": pairs,
            "import_s": imports,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(saved, indent=1) + "\n")
        print(render(saved))
        print(f"written {args.out}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
