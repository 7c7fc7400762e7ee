"""``make bench-gpu`` (``python benchmarks/bench_gpu.py``): ablate against the plain recipe on this
machine's GPU, in one command that keeps to a time budget (``--budget-s``).

1. **The table.** For each model (MiniLM's shape and the earlier study's multilingual
   DistilBERT's, random weights drawn once so that every recipe starts from the same ones) and
   strategy (``none``, ``first4``, ``all``, ``lora``), each recipe trains the same epochs on the
   first ``--train-sentences`` Naija training sentences and evaluates on the Naija dev set:
   plain fp32, plain bf16 (what a user writes: the Trainer with ``bf16=True`` and
   ``DataCollatorForTokenClassification``) and ablate with its defaults for the device, one
   process per recipe (``gpu_worker.py``).
2. **The grid.** The earlier study's 10 jobs (5 strategies x naija, ewt, 1 epoch, MiniLM's
   shape) as ablate runs them, ``python -m ablate.train --multirun`` with ablate's launcher's
   workers sharing the GPUs, against the plain recipe's, one job after another in one process.
3. **The profile.** Per recipe and ``--profile-freeze`` strategy, ``torch.profiler`` over
   ``--profile-steps`` optimizer steps (``gpu_profile.py``): per step, the host ops that launch
   work, GPU kernels, GPU busy time and the optimizer's time, which say where a step's time goes.

The table (markdown and JSON, with every job's numbers) and the phases' logs are written to
``--out`` after every phase, so a run cut by its budget keeps what it measured. ``--dry-run``
runs the same on the CPU with tiny model shapes and a few sentences (tests/test_bench_gpu.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import gpu_table
from shared import compose

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
MODELS = ("minilm", "distilbert_multilingual")
FREEZES = ("none", "first4", "all", "lora")
RECIPES = ("plain", "plain_bf16", "ablate")
# --dry-run: CPU, tiny shapes of the same architectures, a few sentences
DRY = {
    "train_sentences": 16, "dev_sentences": 16, "epochs": 2, "grid_freeze": "none,all",
    "grid_train_sentences": 16, "grid_workers": 2, "budget_s": 300.0, "profile_steps": 2,
    "profile_skip": 1,
}  # fmt: skip
TINY = {
    "bert": {"hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64,
             "num_hidden_layers": 4},
    "distilbert": {"dim": 32, "n_heads": 2, "hidden_dim": 64, "n_layers": 4},
}  # fmt: skip
MIN_PHASE_S = 15.0  # a phase with less time left is not started


def study_grid() -> tuple[str, str]:
    """The earlier study's grid (conf/experiment/study.yaml): its strategies and datasets."""
    from omegaconf import OmegaConf

    params = OmegaConf.load(ROOT / "conf" / "experiment" / "study.yaml").hydra.sweeper.params
    return params.freeze, params.data


def data_root(args, work: Path) -> str:
    """``--data-root``, else the carried treebanks unpacked, else the configured ``data.root``."""
    if args.data_root:
        return str(Path(args.data_root).resolve())
    packed = args.assets / "ud.tar.xz"
    if packed.is_file():
        with tarfile.open(packed) as tar:
            tar.extractall(work / "data", filter="data")
        return str(work / "data")
    return compose(["data=naija"]).data.root


def init_models(args, names, shapes: Path, dest: Path) -> dict[str, str]:
    """Random weights for each model, drawn once from ``--seed`` and saved with its config and
    tokenizer: every recipe loads the same initialisation. Returns model -> folder."""
    import torch
    from transformers import AutoConfig

    from ablate import tasks

    task = tasks.get("pos")
    folders = {}
    for name in names:
        shape = shapes / name
        kind = json.loads((shape / "config.json").read_text())["model_type"]
        config = AutoConfig.from_pretrained(
            shape, num_labels=len(task.labels), id2label=dict(enumerate(task.labels)),
            label2id={label: i for i, label in enumerate(task.labels)},
            **(TINY[kind] if args.dry_run else {}),
        )  # fmt: skip
        torch.manual_seed(args.seed)
        folder = dest / name
        task.model_class.from_config(config).save_pretrained(folder)
        for file in shape.iterdir():
            if file.name != "config.json":
                shutil.copy(file, folder / file.name)
        folders[name] = str(folder)
    return folders


def profile_sentences(args) -> int:
    """Training sentences for one epoch that covers the profile's window (the recipe's batch
    16), with two steps to spare."""
    return 16 * (args.profile_skip + args.profile_steps + 2)


def data_overrides(args, root: str, work: Path, datasets: list[str]) -> dict[str, list[str]]:
    """Per dataset, the overrides that select it: the pinned release under ``root``, or with
    ``--dev-sentences`` a slice of it (``data=ud``)."""
    from shared import write_slice

    if args.dev_sentences is None:
        return {d: [f"data={d}", f"data.root={root}"] for d in datasets}
    most = max(args.train_sentences, args.grid_train_sentences, profile_sentences(args))
    sizes = {"train": most, "dev": args.dev_sentences, "test": args.dev_sentences}
    slices = work / "slices"
    return {
        d: ["data=ud", f"data.treebank={write_slice(d, slices, sizes, root)}",
            f"data.root={slices}"]
        for d in datasets
    }  # fmt: skip


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


def commit(args) -> str:
    """This checkout's commit, or the one ``make gpu-wheels`` recorded where there is no git."""
    try:
        git = {"cwd": ROOT, "capture_output": True, "text": True, "check": True}
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], **git).stdout.strip()
        status = ["git", "status", "--porcelain", "--untracked-files=no"]
        dirty = subprocess.run(status, **git).stdout.strip()
        return head + (" with uncommitted changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        manifest = args.assets / "manifest.json"
        made = json.loads(manifest.read_text())["commit"] if manifest.is_file() else "unknown"
        return f"{made} (as of make gpu-wheels; no git here)"


def table_phase(
    args, state: dict, models: dict[str, str], data: dict[str, list[str]], kind: str = "table"
) -> None:
    """One worker per recipe, each running every model and strategy (on the CPU, --dry-run: one
    worker for all, plain first: no setting there is process-wide). ``kind="profile"``: the
    profile's jobs, one epoch just long enough for its window of steps."""
    work = state["work"]
    groups = [[r] for r in state["recipes"]] if not args.dry_run else [state["recipes"]]
    epochs, sentences, freezes, profile = args.epochs, args.train_sentences, args.freeze, None
    if kind == "profile":
        profile = [args.profile_skip, args.profile_steps]
        epochs, freezes = 1, args.profile_freeze
        sentences = profile_sentences(args)
    for recipes in groups:
        jobs = [
            {"id": f"{model}/{freeze}", "recipe": recipe, "profile": profile, "overrides": [
                *data["naija"], f"model={model}", f"model.name_or_path={models[model]}",
                "model.pretrained=true", f"freeze={freeze}", f"trainer.epochs={epochs}",
                f"data.max_train_sentences={sentences}", f"seed={args.seed}",
                "trainer.checkpoints=false", "trainer.keep_model=false",
                f"data.tokenized_cache_dir={work / 'tokenized'}",
                *state["variants"].get(recipe, [])]}
            for recipe in recipes for model in args.models for freeze in freezes
        ]  # fmt: skip
        if not jobs:
            continue
        name = f"{kind}-{recipes[0]}" if len(recipes) == 1 else kind
        phase = worker(name, jobs, args, state)
        state["phases"].update({f"{kind}-{r}": phase for r in recipes})
        gpu_table.write(args, state)


def grid_phase(args, state: dict, model: str, data: dict[str, list[str]]) -> None:
    """ablate's sweep of the grid, then plain's jobs one after another."""
    from ablate.training.resources import usable_cpus, visible_gpus

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
    launcher = []
    workers = max(1, args.grid_workers)
    if workers > 1:
        launcher = ["hydra/launcher=workers", f"hydra.launcher.n_jobs={workers}"]
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


def parse(argv: list[str] | None) -> argparse.Namespace:
    freeze, data = study_grid()
    parser = argparse.ArgumentParser(
        prog="python benchmarks/bench_gpu.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--assets", type=Path, default=ROOT / ".gpu-bench",
        help="what make gpu-wheels prepared: models/ (configs, tokenizers), ud.tar.xz")  # fmt: skip
    add("--out", type=Path, default=ROOT / "reports" / "bench-gpu")
    add("--data-root", help="treebanks folder (default: the carried ones, else data.root)")
    add("--models", default=",".join(MODELS))
    add("--freeze", default=",".join(FREEZES), help="the table's strategies")
    add("--recipes", default=",".join(RECIPES))
    add("--variant", nargs="+", action="append", default=[], metavar=("NAME", "OVERRIDE"),
        help="one more ablate recipe: its name and overrides, e.g. "
             "--variant nopack trainer.length_grouping=off (repeatable)")  # fmt: skip
    add("--train-sentences", type=int, default=1000)
    add("--dev-sentences", type=int, default=None, help="a dev/test slice (default: all)")
    add("--epochs", type=int, default=2, help="the table's epochs (the first is not averaged)")
    add("--grid-freeze", default=freeze, help="the grid's strategies (the study's)")
    add("--grid-data", default=data, help="the grid's datasets (the study's)")
    add("--grid-train-sentences", type=int, default=2000)
    add("--grid-workers", type=int, default=5, help="ablate's workers (0: no grid)")
    add("--grid-plain", default="plain", choices=("plain", "plain_bf16"))
    add("--profile-freeze", default="none,lora", help="the profile's strategies")
    add("--profile-steps", type=int, default=20,
        help="optimizer steps the profile reads, per job (0: no profile)")  # fmt: skip
    add("--profile-skip", type=int, default=10, help="steps before the profile's window")
    add("--seed", type=int, default=42)
    add("--budget-s", type=float, default=540.0, help="stop starting or continuing phases then")
    add("--dry-run", action="store_true", help="CPU, tiny shapes, a few sentences")
    args = parser.parse_args(argv)
    if args.dry_run:  # what the command line names stays, its default's value too
        words = sys.argv[1:] if argv is None else argv
        given = {
            k for k in DRY if any(w.split("=")[0] == "--" + k.replace("_", "-") for w in words)
        }
        for key, value in DRY.items():
            if key not in given:
                setattr(args, key, value)
    for key in ("models", "freeze", "recipes", "grid_freeze", "grid_data", "profile_freeze"):
        setattr(args, key, [x.strip() for x in str(getattr(args, key)).split(",") if x.strip()])
    unknown = [r for r in args.recipes if r not in RECIPES]
    if unknown:
        parser.error(f"--recipes: unknown {unknown}; known: {', '.join(RECIPES)}")
    args.assets, args.out = args.assets.resolve(), args.out.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    state = {"deadline": time.monotonic() + args.budget_s, "phases": {}, "grid": {}, "logs": {}}
    state["variants"] = {v[0]: v[1:] for v in args.variant}
    state["recipes"] = [*args.recipes, *state["variants"]]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_DISABLE_TELEMETRY": "true",
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    if args.dry_run:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU, on a GPU machine too
    work = Path(tempfile.mkdtemp(prefix="ablate-bench-gpu-"))
    state.update(env=env, work=work)
    try:
        return _bench(args, argv, state)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _bench(args, argv, state: dict) -> int:
    from ablate.training.resources import usable_cpus

    work = state["work"]
    root = data_root(args, work)
    data = data_overrides(args, root, work, sorted({"naija", *args.grid_data}))
    shapes = args.assets / "models"
    if all((shapes / m / "config.json").is_file() for m in MODELS):
        manifest = args.assets / "manifest.json"
        notes = json.loads(manifest.read_text())["models"] if manifest.is_file() else {}
    else:  # no make gpu-wheels here: the tokenizer learns from the data the bench reads
        from gpu_assets import write_shapes

        shapes = work / "shapes"
        notes = write_shapes(shapes, {d: data[d] for d in ("naija", "ewt") if d in data})
    names = [*args.models, *(["minilm"] if args.grid_workers > 0 else [])]
    models = init_models(args, dict.fromkeys(names), shapes, work / "init")
    argv = argv if argv is not None else sys.argv[1:]
    state["meta"] = gpu_table.describe(args, notes, commit(args), usable_cpus(), argv)
    table_phase(args, state, models, data)
    if args.grid_workers > 0:
        grid_phase(args, state, models["minilm"], data)
    if args.profile_steps > 0:
        table_phase(args, state, models, data, kind="profile")
    print(gpu_table.write(args, state))
    print(f"written {args.out / 'bench-gpu.md'} (and .json, .log)")
    failed = [name for name, p in state["phases"].items() if p.get("rc") not in (0, None)]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
