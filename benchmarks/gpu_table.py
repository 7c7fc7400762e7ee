"""The table of ``bench_gpu.py``: per model, strategy and recipe the train time per epoch,
evaluation time, peak GPU memory, tokens/s and dev accuracy; and the grid's wall times."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import statistics
from pathlib import Path

import gpu_report

from ablate.tables import markdown_table

RECIPE_NAMES = {
    "plain": "plain fp32",
    "plain_bf16": "plain bf16 (`bf16=True`)",
    "ablate": "ablate (its defaults)",
}


def recipe_name(recipe: str) -> str:
    """How the table names ``recipe`` (an ablate variant: ``ablate <name>``)."""
    return RECIPE_NAMES.get(recipe) or gpu_report.recipe_label(recipe) or f"ablate {recipe}"


def steady(values: list[float]) -> float:
    """The mean after the first value (which pays the process's CUDA start-up), else the one."""
    values = values[1:] if len(values) > 1 else values
    return statistics.fmean(values) if values else math.nan


def summarise(result: dict) -> dict:
    """One job's row: steady-state train time per epoch, evaluation time and tokens/s, the first
    epoch's time, dev accuracy after the last epoch, peak GPU memory and wall time; where the
    job timed its steps, their median and p90 and its new- and seen-shape steps."""
    train_s = steady(result["epoch_time_s"])
    tokens = steady(result["train_tokens"])
    acc = result["dev_accuracy"]
    return {
        "train_s": train_s,
        "first_epoch_s": result["epoch_time_s"][0] if result["epoch_time_s"] else math.nan,
        "eval_s": steady(result["dev_eval_time_s"]),
        "tokens_per_s": tokens / train_s if train_s else math.nan,
        "dev_acc": 100 * acc[-1] if acc else math.nan,
        "peak_gpu_mb": result.get("peak_gpu_mb"),
        "padding_pct": steady(result.get("padding_pct") or []),
        "wall_s": result["wall_s"],
        **gpu_report.step_stats(result.get("steps") or []),
    }


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return fmt.format(value)


COLUMNS = ["model", "strategy", "recipe", "train s/epoch", "× plain fp32", "× plain bf16",
           "eval s", "× plain bf16 eval", "peak GPU MiB", "tokens/s", "dev acc (%)"]  # fmt: skip
PROFILE_COLUMNS = ["model", "strategy", "recipe", "step ms (profiled)", "host ops per step",
                   "GPU kernels per step", "GPU busy ms per step",
                   "optimizer ms per step"]  # fmt: skip
GRID_COLUMNS = ["the grid, as it runs", "wall time (s)", "jobs finished"]


def _ratio(row: dict, base, key: str) -> float | None:
    """``row[key]`` over the same cell of ``base`` (a row of another recipe), where both exist."""
    if isinstance(base, dict) and base.get(key):
        return row[key] / base[key]
    return None


def table(rows: dict, models: list[str], freezes: list[str], recipes: list[str]) -> str:
    """The markdown table of ``rows`` ((model, freeze, recipe) -> ``summarise``'s dict, or a
    string saying why the job has no numbers). With a best-plain recipe among ``recipes``,
    ``gpu_report.best_table``: its ratios are against best plain."""
    if any(r in gpu_report.BEST_RECIPES for r in recipes):
        return gpu_report.best_table(rows, models, freezes, recipes, recipe_name)
    lines = []
    for model in models:
        for freeze in freezes:
            fp32, bf16 = (rows.get((model, freeze, r)) for r in ("plain", "plain_bf16"))
            for i, recipe in enumerate(recipes):
                row = rows.get((model, freeze, recipe), "not run")
                label = [model if i == 0 else "", freeze if i == 0 else "", recipe_name(recipe)]
                if isinstance(row, str):
                    lines.append([*label, row, *["—"] * 7])
                    continue
                lines.append([
                    *label,
                    _cell(row["train_s"], "{:.2f}"),
                    _cell(_ratio(row, fp32, "train_s"), "{:.2f}"),
                    _cell(_ratio(row, bf16, "train_s"), "{:.2f}"),
                    _cell(row["eval_s"], "{:.2f}"),
                    _cell(_ratio(row, bf16, "eval_s"), "{:.2f}"),
                    _cell(row["peak_gpu_mb"], "{:.0f}"),
                    _cell(row["tokens_per_s"], "{:.0f}"),
                    _cell(row["dev_acc"], "{:.2f}"),
                ])  # fmt: skip
    return markdown_table(lines, COLUMNS, right=COLUMNS[3:])


def profile_table(jobs: list[dict]) -> str:
    """The profile phase's jobs, one row each (``gpu_profile.summarise``'s numbers)."""
    rank = {r: i for i, r in enumerate(RECIPE_NAMES)}
    lines = []
    for job in sorted(jobs, key=lambda j: (j["job"], rank.get(j["recipe"], len(rank)))):
        model, freeze = job["job"].split("/", 1)
        p = job.get("profile") or {}
        cells = [_cell(p.get(k), f) for k, f in (
            ("step_ms", "{:.1f}"), ("ops_per_step", "{:.0f}"), ("kernels_per_step", "{:.0f}"),
            ("gpu_busy_ms", "{:.2f}"), ("optimizer_ms", "{:.2f}"))]  # fmt: skip
        lines.append([model, freeze, recipe_name(job["recipe"]), *cells])
    return markdown_table(lines, PROFILE_COLUMNS, right=PROFILE_COLUMNS[3:])


# A sweep's log line: Hydra's ``[time][HYDRA] ...``, a logger's ``[time][name][LEVEL] - ...``
_LOG_LINE = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[([^\]]+)\](?:\[\w+\] -)? (.*)$"
)


def timeline(log: str, started: float, wall_s: float) -> dict:
    """Where a sweep's wall time went, from its log's timestamps (seconds after ``started``, the
    command's start, a Unix time on the same clock): ``launch_s`` (Hydra launches the jobs),
    ``first_job_s`` (a job's first line: its worker is up and its imports done), ``first_done_s``
    and ``last_done_s`` (a job's run FINISHED), ``end_s`` (the command ended, after the sweep's
    report)."""
    marks: dict[str, float] = {"end_s": wall_s}
    for line in log.splitlines():
        match = _LOG_LINE.match(line)
        if not match:
            continue
        when, source, message = match.groups()
        at = dt.datetime.strptime(when, "%Y-%m-%d %H:%M:%S,%f").timestamp() - started
        if source == "HYDRA" and "Launching" in message:
            marks.setdefault("launch_s", at)
        elif source.startswith("ablate") and "launch_s" in marks:
            marks.setdefault("first_job_s", at)
            if source == "ablate" and message.startswith("run ") and " FINISHED" in message:
                marks.setdefault("first_done_s", at)
                marks["last_done_s"] = at
    return marks


def overhead(marks: dict) -> float | None:
    """A sweep's wall time minus its jobs' training and evaluation (``train_s``, the runs'
    ``train_runtime_s`` summed) spread over its ``workers``: what starting, tracking and
    reporting the jobs cost."""
    if "train_s" not in marks or not marks.get("workers"):
        return None
    return marks["end_s"] - marks["train_s"] / marks["workers"]


def timeline_line(marks: dict) -> str:
    """One sentence of ``timeline``'s marks, those present, and the sweep's overhead."""
    said = {
        "launch_s": "launched its jobs at {:.1f} s",
        "first_job_s": "its first job started at {:.1f} s",
        "first_done_s": "its first job finished at {:.1f} s",
        "last_done_s": "its last at {:.1f} s",
        "end_s": "and it ended at {:.1f} s (after its report)",
    }
    parts = [text.format(marks[key]) for key, text in said.items() if key in marks]
    if len(parts) <= 1:
        return ""
    line = "ablate's sweep " + ", ".join(parts) + "."
    if (cost := overhead(marks)) is not None:
        line += (
            f" Its jobs trained and evaluated for {marks['train_s']:.1f} s in all (their runs' "
            f"train_runtime_s) on {marks['workers']} worker(s): an overhead of {cost:.1f} s."
        )
    if ran := marks.get("preloaded"):
        line += f" {ran['jobs']} job(s) ran in {ran['workers']} worker(s) preloaded at its start."
    return line


def grid_table(grid: dict) -> str:
    """The grid's wall times: ablate's sweep, plain's jobs one after another, their ratio; then
    where the sweep's time went, where its log was read."""
    lines = []
    for key in ("ablate", "plain"):
        part = grid.get(key)
        if not part:
            continue
        wall = _cell(part.get("wall_s"), "{:.1f}")
        if part.get("cut"):
            wall = f"> {wall} (cut at the time budget)"
        lines.append([part["how"], wall, f"{part['finished']} of {part['jobs']}"])
    a, p = grid.get("ablate") or {}, grid.get("plain") or {}
    if a.get("wall_s") and p.get("wall_s") and not a.get("cut"):
        bound = "< " if p.get("cut") else ""  # plain's whole grid would have taken longer
        lines.append(["ablate / plain", f"{bound}{a['wall_s'] / p['wall_s']:.2f}", ""])
    text = markdown_table(lines, GRID_COLUMNS, right=GRID_COLUMNS[1:])
    said = timeline_line(a.get("timeline") or {})
    return f"{text}\n\n{said}" if said else text


def describe(args, notes: dict, commit: str, cpus: int, argv: list[str]) -> dict:
    """What the document says of its run: device (filled in from the jobs), date, commit,
    command, settings and notes."""
    dev = f"the first {args.dev_sentences}" if args.dev_sentences else "all"
    command = "python benchmarks/bench_gpu.py " + " ".join(argv)
    return {
        "device": "not measured",
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d"),
        "commit": commit,
        "command": command.strip(),
        "cpus": cpus,
        "settings": (
            f"Table: {args.epochs} epoch(s) on the first {args.train_sentences} Naija training "
            f"sentences, {dev} dev sentences, the study's recipe (lr 5e-5, batch 16), seed "
            f"{args.seed}{', tiny model shapes on the CPU (--dry-run)' if args.dry_run else ''}."
        ),
        "grid_settings": (
            f"Grid: {len(args.grid_freeze) * len(args.grid_data)} jobs "
            f"({','.join(args.grid_freeze)} x {','.join(args.grid_data)}), 1 epoch on the first "
            f"{args.grid_train_sentences} training sentences, MiniLM's shape; wall time from "
            "the command's start to its end (process start-up, tokenisation, training, "
            "evaluation, tracking)."
        ),
        "profile_settings": (
            f"Profile: one epoch of {16 * (args.profile_skip + args.profile_steps + 2)} Naija "
            f"training sentences under torch.profiler, which reads optimizer steps "
            f"{args.profile_skip + 1} to {args.profile_skip + args.profile_steps}."
        ),
        "notes": [
            *(f"{m}: {notes[m]}" for m in args.models if m in notes),
            "Every recipe starts from the same random weights (saved once); LoRA's adapters are "
            "drawn from the same seed. Dropout masks differ between recipes (ablate packs other "
            "batches), so dev accuracy agrees within seed noise, not to the last digit.",
            "The table's ablate jobs run without epoch checkpoints and the kept model "
            "(trainer.checkpoints=false, keep_model=false): neither is in a measured column. "
            "The grid runs with ablate's defaults.",
        ],
    }


COLUMNS_SAID = (
    "train s/epoch and tokens/s (non-pad training tokens per second) are the mean over the "
    "epochs after the first, which pays the process's CUDA start-up; eval s is the dev "
    "evaluation after those epochs; dev acc after the last epoch; × plain fp32 and × plain bf16 "
    "are the train time's ratios to those recipes', × plain bf16 eval the evaluation time's."
)
PROFILE_SAID = (
    "Per step: its wall time under the profiler (which slows the host), the host ops that "
    "launch work (aten leaf ops other than views), the GPU kernels and their busy time, and the "
    "optimizer's host time."
)


def document(meta: dict, body: str, grid: str, profile: str = "", phases=(), best=False) -> str:
    """The markdown the bench prints and writes: what ran where, ``phases`` ((settings, text)
    of A0 to A3), the table (``best``: its best-plain form), the grid, the profile (each where
    it ran), notes."""
    head = [
        f"GPU bench: {meta['device']}; {meta['date']}; commit {meta['commit']}.",
        f"Command: `{meta['command']}`",
    ]
    said = gpu_report.BEST_SAID if best else COLUMNS_SAID
    parts = [
        *phases,
        (f"{meta['settings']} {said}", body),
        (meta["grid_settings"], grid),
        (f"{meta.get('profile_settings')} {PROFILE_SAID}", profile),
    ]
    for settings, part in parts:
        if part:
            head += ["", settings, "", part]
    head += ["", "Notes:", *[f"- {note}" for note in meta["notes"]]]
    return "\n".join(head).rstrip() + "\n"


def render(saved: dict) -> str:
    """The markdown of a run from its ``bench-gpu.json``: what ``write`` wrote beside it."""
    rows = {(r["model"], r["freeze"], r["recipe"]): r.get("why", r) for r in saved["table"]}
    order = [list(dict.fromkeys(key[i] for key in rows)) for i in range(3)]
    body = table(rows, *order) if rows else ""
    grid = grid_table(saved["grid"]) if saved["grid"] else ""
    profile = profile_table(saved.get("profile") or [])
    phases = gpu_report.sections(saved, summarise, recipe_name)
    best = any(r in gpu_report.BEST_RECIPES for r in order[2])
    return document(saved["meta"], body, grid, profile if saved.get("profile") else "", phases,
                    best)  # fmt: skip


def results(folder: Path) -> list[dict]:
    """The results a worker wrote into ``folder`` (one JSON file per finished job)."""
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def preloaded_workers(sweep_dir: Path) -> list[dict]:
    """The records of the workers a sweep started and preloaded (none before ablate did)."""
    try:
        from ablate.workers import preloaded
    except ImportError:  # ablate from before preloaded workers: the bench measures it as it is
        return []
    return preloaded(sweep_dir)


def jobs_train_s(uri: str, experiment: str) -> float | None:
    """The training runs' ``train_runtime_s`` (training with its dev evaluations) summed, or
    None where the store cannot be read."""
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(uri)
        found = client.get_experiment_by_name(experiment)
        runs = client.search_runs([found.experiment_id]) if found else []
    except Exception:  # the grid's table says how many runs finished, or why not
        return None
    return float(sum(r.data.metrics.get("train_runtime_s", 0.0) for r in runs))


def write(args, state: dict) -> str:
    """Write bench-gpu.md, .json and .log to ``--out`` from what has run so far; returns the
    markdown."""
    work = state["work"]
    rows, raw = {}, []
    for folder in sorted(work.glob("table*")):
        raw += results(folder) if folder.is_dir() else []
    got = {(r["job"], r["recipe"]): r for r in raw}
    for recipe in state["recipes"] if "table" in getattr(args, "phases", ["table"]) else []:
        phase = state["phases"].get(f"table-{recipe}")
        missing = "not run"
        if phase is not None:
            missing = "cut at the budget" if phase.get("cut") else "failed (bench-gpu.log)"
            missing = f"skipped: {phase['skipped']}" if "skipped" in phase else missing
        for model in args.models:
            for freeze in args.freeze:
                job = got.get((f"{model}/{freeze}", recipe))
                rows[(model, freeze, recipe)] = summarise(job) if job else missing
    profile = [r for f in sorted(work.glob("profile*")) if f.is_dir() for r in results(f)]
    a1_jobs = [r for f in sorted(work.glob("A1*")) if f.is_dir() for r in results(f)]
    meta = state["meta"]
    ran = [p.get("platform") for p in state["probes"].values() if p.get("platform")]
    if ran:
        meta["device"] = "{device}, torch {torch}, transformers {transformers}".format(**ran[0])
    for job in [*raw, *profile, *results(work / "grid-plain"), *a1_jobs]:
        meta["device"] = job["device"]
        break
    flat = [{"model": m, "freeze": f, "recipe": r, **(v if isinstance(v, dict) else {"why": v})}
            for (m, f, r), v in rows.items()]  # fmt: skip
    saved = {"meta": meta, "table": flat, "grid": state["grid"], "profile": profile,
             "phases": state["phases"], "jobs": raw, **state["probes"]}  # fmt: skip
    if a1_jobs:
        saved["A1"] = a1_jobs
    text = render(saved)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-gpu.md").write_text(text)
    (out / "bench-gpu.json").write_text(json.dumps(saved, indent=1, default=str))
    with open(out / "bench-gpu.log", "w") as log:
        for name, path in state["logs"].items():
            log.write(f"===== {name}\n{path.read_text(errors='replace')[-200_000:]}\n")
    return text


def merge(runs: list[dict]) -> dict:
    """Several calls' ``bench-gpu.json`` on one warm machine as one run: a measured table row
    or grid side replaces one a budget cut or skipped; phases, jobs and commands add up."""
    merged = json.loads(json.dumps(runs[0]))
    rows = {(r["model"], r["freeze"], r["recipe"]): r for r in merged["table"]}
    for run in runs[1:]:
        for row in run["table"]:
            key = (row["model"], row["freeze"], row["recipe"])
            if key not in rows or ("why" in rows[key] and "why" not in row):
                rows[key] = row
        for side, part in (run.get("grid") or {}).items():
            had = merged.setdefault("grid", {}).get(side) or {}
            if part and part.get("finished", 0) >= had.get("finished", 0):
                merged["grid"][side] = part
        merged["phases"].update(run["phases"])
        merged["jobs"] += run["jobs"]
        merged["profile"] = merged.get("profile") or run.get("profile") or []
        merged.update({k: v for k, v in run.items() if k not in merged})
        merged["meta"]["command"] += f"`, then on the same machine `{run['meta']['command']}"
    merged["table"] = list(rows.values())
    return merged


if __name__ == "__main__":  # python benchmarks/gpu_table.py RUN.json: its markdown again
    import sys  # --merge OUT.json RUN.json...: one warm machine's calls saved as one run

    if sys.argv[1:2] == ["--merge"]:
        runs = [json.loads(Path(path).read_text()) for path in sys.argv[3:]]
        Path(sys.argv[2]).write_text(json.dumps(merge(runs), indent=1, default=str))
        sys.exit()
    for path in sys.argv[1:]:
        print(render(json.loads(Path(path).read_text())))
