"""The phases of ``bench_gpu.py`` that run as their own commands: each one in its own process
group, stopped at the budget's end, its log kept (``run_phase``); the recipes' jobs
(``worker``); the grid (``grid_phase``); phases A0, A2 and A3 (``step_phase``,
``gpu_step.py``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gpu_table

HERE = Path(__file__).resolve().parent
MIN_PHASE_S = 15.0  # a phase with less time left is not started


def _stop(proc: subprocess.Popen) -> int:
    """Stop ``proc`` and the process group it leads (a sweep's workers too)."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            return proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def run_phase(name: str, cmd: list[str], args, state: dict) -> dict:
    """``cmd`` in its own process group, stopped at the budget's end; its log kept."""
    left = state["deadline"] - time.monotonic()
    if left < MIN_PHASE_S:
        return {"skipped": f"{left:.0f} s of the budget left"}
    log_path = state["work"] / f"{name}.log"
    started, t0 = time.time(), time.monotonic()
    with open(log_path, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=state["env"],
                                cwd=state["work"], start_new_session=True)  # fmt: skip
        cut = False
        try:
            rc = proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            cut = True
            rc = _stop(proc)
        finally:
            if proc.poll() is None:  # interrupted: no process of the phase outlives the bench
                _stop(proc)
    phase = {"wall_s": time.monotonic() - t0, "rc": rc, "cut": cut, "started": started}
    state["logs"][name] = log_path
    print(f"{name}: {phase['wall_s']:.1f} s, exit {rc}{' (cut at the budget)' if cut else ''}",
          flush=True)  # fmt: skip
    return phase


def worker(name: str, jobs: list[dict], args, state: dict) -> dict:
    """``gpu_worker.py`` running ``jobs``; their results land in ``<work>/<name>``."""
    spec = {"jobs": jobs, "results": str(state["work"] / name)}
    path = state["work"] / f"{name}.json"
    path.write_text(json.dumps(spec))
    return run_phase(name, [sys.executable, str(HERE / "gpu_worker.py"), str(path)], args, state)


def finished_runs(uri: str, experiment: str) -> int | str:
    """Training runs (not the sweep's own) FINISHED in ``experiment`` of the store ``uri``, or
    why they could not be counted."""
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(uri)
        found = client.get_experiment_by_name(experiment)
        runs = client.search_runs([found.experiment_id]) if found else []
    except Exception as exc:  # a store the sweep could not open either: the table says why
        return f"? ({type(exc).__name__}: {exc})"
    return sum(r.info.status == "FINISHED" and r.data.tags.get("ablate.role") != "sweep"
               for r in runs)  # fmt: skip


def grid_phase(args, state: dict, model: str, data: dict[str, list[str]]) -> None:
    """ablate's sweep of the grid, then plain's jobs one after another."""
    from omegaconf import OmegaConf

    from ablate.training.resources import plan_workers, usable_cpus, visible_gpus

    work = state["work"]
    freezes, datasets = args.grid_freeze, args.grid_data
    common = [
        "model=minilm",
        f"model.name_or_path={model}",
        "trainer.epochs=1",
        f"data.max_train_sentences={args.grid_train_sentences}",
        f"seed={args.seed}",
    ]
    n = len(freezes) * len(datasets)
    uri, experiment = f"sqlite:///{work / 'grid.db'}", "bench-gpu-grid"
    if data[datasets[0]][0] == "data=ud":  # slices: one data=ud, the sweep over their folders
        treebanks = ",".join(data[d][1].split("=", 1)[1] for d in datasets)
        sweep_data = ["data=ud", f"data.treebank={treebanks}", data[datasets[0]][2]]
    else:
        sweep_data = [f"data={','.join(datasets)}", data[datasets[0]][1]]
    launcher, workers = [f"hydra.launcher.n_jobs={args.grid_workers}"], args.grid_workers
    if workers == -1:  # ablate's default: its launcher's own plan (n_jobs=auto), as a user runs it
        launcher = []
        workers = plan_workers(OmegaConf.load(HERE.parent / "conf/hydra/launcher/workers.yaml"))[0]
    cmd = [sys.executable, "-m", "ablate.train", "--multirun", f"freeze={','.join(freezes)}",
           *sweep_data, *common, f"tracking.uri={uri}", f"tracking.experiment={experiment}",
           f"data.tokenized_cache_dir={work / 'grid-tokenized'}",
           f"hydra.sweep.dir={work / 'grid-sweep'}", *launcher]  # fmt: skip
    gpus = len(visible_gpus()) if not args.dry_run else 0
    where = f"{gpus} GPU(s)" if gpus else "the CPU"
    phase = run_phase("grid-ablate", cmd, args, state)
    state["phases"]["grid-ablate"] = phase
    state["grid"]["ablate"] = {
        "how": f"ablate: `--multirun`, {workers} worker(s) on {where}, "
               f"CPU threads each: {max(1, usable_cpus() // workers)}",
        "jobs": n, "finished": finished_runs(uri, experiment) if "skipped" not in phase else 0,
        "command": "python -m ablate.train " + " ".join(cmd[4:]), **phase,
    }  # fmt: skip
    if "skipped" not in phase:  # where its wall time went, from the timestamps of its log
        log = state["logs"]["grid-ablate"].read_text(errors="replace")
        marks = gpu_table.timeline(log, phase["started"], phase["wall_s"])
        if isinstance(train_s := gpu_table.jobs_train_s(uri, experiment), float):
            marks.update(train_s=train_s, workers=workers)
        if ran := gpu_table.preloaded_workers(work / "grid-sweep"):
            marks["preloaded"] = {"workers": len(ran), "jobs": sum(len(r["jobs"]) for r in ran)}
        state["grid"]["ablate"]["timeline"] = marks
    gpu_table.write(args, state)
    jobs = [{"id": f"grid/{d}/{f}", "recipe": args.grid_plain,
             "overrides": [*data[d], f"freeze={f}", *common]}
            for f in freezes for d in datasets]  # fmt: skip
    phase = worker("grid-plain", jobs, args, state)
    state["phases"]["grid-plain"] = phase
    state["grid"]["plain"] = {
        "how": f"{gpu_table.recipe_name(args.grid_plain)}, one job after another in one process",
        "jobs": n, "finished": len(gpu_table.results(work / "grid-plain")), **phase,
    }  # fmt: skip
    gpu_table.write(args, state)


def step_phase(name: str, what: str, spec: dict, said: str, args, state: dict) -> None:
    """Phase ``name``: ``gpu_step.py what`` on ``spec``; what it wrote (after each of its
    measurements) kept in the bench's JSON with ``said`` (its settings), also where it was cut."""
    work = state["work"] / name
    work.mkdir(parents=True, exist_ok=True)
    out = work / "result.json"
    path = work / "spec.json"
    path.write_text(json.dumps({**spec, "out": str(out)}))
    cmd = [sys.executable, str(HERE / "gpu_step.py"), what, str(path)]
    state["phases"][name] = run_phase(name, cmd, args, state)
    with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
        state["probes"][name] = {"said": said, "results": json.loads(out.read_text())}
        state["probes"][name]["platform"] = json.loads((work / "platform.json").read_text())
    gpu_table.write(args, state)
