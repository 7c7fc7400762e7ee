"""``make bench-gpu`` (``python benchmarks/bench_gpu.py``): ablate against the plain recipe on this
machine's GPU, in one command that keeps to a time budget (``--budget-s``).

1. **The table.** For each model (MiniLM's shape and the earlier study's multilingual
   DistilBERT's, random weights drawn once so that every recipe starts from the same ones) and
   strategy (``none``, ``first4``, ``all``, ``lora``), each recipe trains the same epochs on the
   first ``--train-sentences`` Naija training sentences and evaluates on the Naija dev set:
   plain fp32, plain bf16 (what a user writes: the Trainer with ``bf16=True`` and
   ``DataCollatorForTokenClassification``), best plain without and with ``torch_compile``
   (``gpu_plain.py``) and ablate with its defaults for the device, one process per recipe
   (``gpu_worker.py``); every recipe's steps timed; ratios against the better best plain.
2. **The grid.** The earlier study's 10 jobs (5 strategies x naija, ewt, 1 epoch, MiniLM's
   shape) as ablate runs them, ``python -m ablate.train --multirun`` with ablate's launcher's
   workers sharing the GPUs, against the plain recipe's, one job after another in one process.
3. **The profile.** Per recipe and ``--profile-freeze`` strategy, ``torch.profiler`` over
   ``--profile-steps`` optimizer steps (``gpu_profile.py``): per step, the host ops that launch
   work, GPU kernels, GPU busy time and the optimizer's time, which say where a step's time goes.

And (``--phases`` says which phases run, in its order; all by default): **A0** versions, the
kernels bf16 SDPA runs, import times; **A1** MiniLM ``none`` under each plain recipe of
``gpu_plain.py`` (fp32, TF32, bf16, bf16 without cuDNN attention, best plain, compiled), step
medians, new- vs seen-shape steps; **A2** a bare training step, eager vs one CUDA graph; **A3**
1, 4, 8 processes each running it at once (A0, A2, A3: ``gpu_step.py``).

The table (markdown and JSON, with every job's numbers) and the phases' logs are written to
``--out`` after every phase, so a run cut by its budget keeps what it measured. ``--dry-run``
runs the same on the CPU with tiny model shapes and a few sentences (tests/test_bench_gpu.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import gpu_table
from gpu_phases import grid_phase, step_phase, worker
from shared import compose

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
MODELS = ("minilm", "distilbert_multilingual")
FREEZES = ("none", "first4", "all", "lora")
# the table's, in the order they run: what its ratios compare first (best plain, ablate, best plain
# compiled), where a budget cuts last; plain fp32 and bf16 (A1 measures them too) after
RECIPES = ("best_plain", "ablate", "best_plain_compiled", "plain", "plain_bf16")
A1_RECIPES = ("plain", "plain_tf32", "plain_bf16", "plain_bf16_nocudnn", "best_plain",
              "best_plain_compiled")  # fmt: skip
PHASES = ("A0", "A1", "A2", "A3", "table", "grid", "profile")
IMPORTS = "torch,transformers,ablate.training.fit"
# --dry-run: CPU, tiny shapes of the same architectures, a few sentences
DRY = {
    "train_sentences": 16, "dev_sentences": 16, "epochs": 2, "grid_freeze": "none,all",
    "grid_train_sentences": 16, "grid_workers": 2, "budget_s": 900.0, "profile_steps": 2,
    "profile_skip": 1, "imports": "numpy", "a2_steps": 1, "a3_processes": "1,2",
    "a3_seconds": 0.3, "a1_recipes": "best_plain_compiled", "a1_batch_size": 4,
    "profile_recipes": "plain,ablate", "profile_models": "minilm",
}  # fmt: skip
TINY = {
    "bert": {"hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64,
             "num_hidden_layers": 4},
    "distilbert": {"dim": 32, "n_heads": 2, "hidden_dim": 64, "n_layers": 4},
}  # fmt: skip


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
    worker for all: the process-wide settings there are restored after each job or do not
    apply). ``kind="profile"``: the profile's jobs, one epoch just long enough for its window
    of steps; ``kind="A1"``: the A1 recipes on MiniLM's shape, ``none``."""
    work = state["work"]
    recipes, names = state["recipes"], args.models
    epochs, sentences, freezes, profile = args.epochs, args.train_sentences, args.freeze, None
    batch = []
    if kind == "A1":
        recipes, names, freezes = args.a1_recipes, ["minilm"], ["none"]
        batch = [f"trainer.batch_size={args.a1_batch_size}"] if args.a1_batch_size else []
    if kind == "profile":
        profile = [args.profile_skip, args.profile_steps]
        epochs, freezes = 1, args.profile_freeze
        recipes = [r for r in args.profile_recipes or recipes if r in recipes]
        names = [m for m in args.profile_models or names if m in names]
        sentences = profile_sentences(args)
    groups = [[r] for r in recipes] if not args.dry_run else [recipes]
    for recipes in groups:
        jobs = [
            {"id": f"{model}/{freeze}", "recipe": recipe, "profile": profile, "overrides": [
                *data["naija"], f"model={model}", f"model.name_or_path={models[model]}",
                "model.pretrained=true", f"freeze={freeze}", f"trainer.epochs={epochs}",
                f"data.max_train_sentences={sentences}", f"seed={args.seed}",
                "trainer.checkpoints=false", "trainer.keep_model=false",
                f"data.tokenized_cache_dir={work / 'tokenized'}",
                *batch, *state["variants"].get(recipe, [])]}
            for recipe in recipes for model in names for freeze in freezes
        ]  # fmt: skip
        if not jobs:
            continue
        name = f"{kind}-{recipes[0]}" if len(recipes) == 1 else kind
        phase = worker(name, jobs, args, state)
        state["phases"].update({f"{kind}-{r}": phase for r in recipes})
        gpu_table.write(args, state)


def run_one_phase(phase: str, args, state: dict, models: dict, data: dict) -> None:
    """Phase ``phase`` (one of ``PHASES``), its results written to ``--out`` as it ends."""
    from ablate.training.resources import usable_cpus

    shape = [4, 16] if args.dry_run else [16, 64]  # A2's and A3's batch (tokens, no padding)
    if phase == "A0":
        step_phase("A0", "probe", {"imports": args.imports}, "", args, state)
    elif phase in ("A1", "table"):
        table_phase(args, state, models, data, kind=phase)
    elif phase == "A2":
        n, warm = args.a2_steps, max(1, min(5, args.a2_steps // 2))
        spec = {"models": {m: models[m] for m in args.models}, "steps": n, "warmup": warm,
                "shape": shape}  # fmt: skip
        said = f"One batch of {shape[0]} x {shape[1]} tokens; {n} steps timed after {warm}."
        step_phase("A2", "step", spec, said, args, state)
    elif phase == "A3":
        dtype = "fp32" if args.dry_run else "bf16"
        counts = [int(n) for n in args.a3_processes]
        spec = {"model": models["minilm"], "dtype": dtype, "seconds": args.a3_seconds,
                "processes": counts, "cpus": usable_cpus(), "shape": shape}  # fmt: skip
        said = (f"{dtype}, batches of {shape[0]} x {shape[1]}, {args.a3_seconds:g} s at once, "
                "the CPU's threads shared among them.")  # fmt: skip
        step_phase("A3", "concurrent", spec, said, args, state)
    elif phase == "grid" and args.grid_workers != 0:
        grid_phase(args, state, models["minilm"], data)
    elif phase == "profile" and args.profile_steps > 0:
        table_phase(args, state, models, data, kind="profile")


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
    add("--recipes", default=",".join(RECIPES), help="the table's")
    add("--phases", default=",".join(PHASES), help="which phases run, in this order")
    add("--a1-recipes", default=",".join(A1_RECIPES), help="A1's recipes")
    add("--a1-batch-size", type=int, default=None, help="A1's batch (default: the study's 16)")
    add("--imports", default=IMPORTS, help="A0: the modules whose import it times")
    add("--a2-steps", type=int, default=30, help="A2: bare steps timed per variant")
    add("--a3-processes", default="1,4,8", help="A3: the counts of concurrent processes")
    add("--a3-seconds", type=float, default=5.0, help="A3: how long they step at once")
    add("--variant", nargs="+", action="append", default=[], metavar=("NAME", "OVERRIDE"),
        help="one more ablate recipe: its name and overrides, e.g. "
             "--variant nopack trainer.length_grouping=off (repeatable)")  # fmt: skip
    add("--train-sentences", type=int, default=1000)
    add("--dev-sentences", type=int, default=None, help="a dev/test slice (default: all)")
    add("--epochs", type=int, default=2, help="the table's epochs (the first is not averaged)")
    add("--grid-freeze", default=freeze, help="the grid's strategies (the study's)")
    add("--grid-data", default=data, help="the grid's datasets (the study's)")
    add("--grid-train-sentences", type=int, default=2000)
    add("--grid-workers", type=int, default=-1,
        help="ablate's workers (-1: its default, n_jobs=auto; 0: no grid)")  # fmt: skip
    add("--grid-plain", default="best_plain", choices=("plain", "plain_bf16", "best_plain"),
        help="the plain recipe the grid runs")  # fmt: skip
    add("--profile-freeze", default="none,lora", help="the profile's strategies")
    add("--profile-recipes", default="", help="the profile's (default: the table's)")
    add("--profile-models", default="", help="the profile's (default: --models)")
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
    lists = ("models", "freeze", "recipes", "grid_freeze", "grid_data", "profile_freeze",
             "phases", "a1_recipes", "imports", "a3_processes", "profile_recipes",
             "profile_models")  # fmt: skip
    for key in lists:
        setattr(args, key, [x.strip() for x in str(getattr(args, key)).split(",") if x.strip()])
    known = (*A1_RECIPES, "ablate")
    for key, allowed in (("recipes", known), ("a1_recipes", known), ("phases", PHASES)):
        if unknown := [r for r in getattr(args, key) if r not in allowed]:
            flag = "--" + key.replace("_", "-")
            parser.error(f"{flag}: unknown {unknown}; known: {', '.join(allowed)}")
    if bad := [n for n in args.a3_processes if not n.isdigit() or int(n) < 1]:
        parser.error(f"--a3-processes: {bad} are not counts of processes (e.g. 1,4,8)")
    args.assets, args.out = args.assets.resolve(), args.out.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    state = {"deadline": time.monotonic() + args.budget_s, "phases": {}, "grid": {}, "logs": {},
             "probes": {}}  # fmt: skip
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
    run = set(args.phases)
    names = [*(args.models if run & {"A2", "table", "profile"} else []),
             *(["minilm"] if run & {"A1", "A3", "grid"} else [])]  # fmt: skip
    models = init_models(args, dict.fromkeys(names), shapes, work / "init")
    argv = argv if argv is not None else sys.argv[1:]
    state["meta"] = gpu_table.describe(args, notes, commit(args), usable_cpus(), argv)
    for phase in dict.fromkeys(args.phases):  # in the order asked for
        run_one_phase(phase, args, state, models, data)
    print(gpu_table.write(args, state))
    print(f"written {args.out / 'bench-gpu.md'} (and .json, .log)")
    failed = [name for name, p in state["phases"].items() if p.get("rc") not in (0, None)]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
