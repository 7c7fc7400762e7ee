"""The tables of ``bench_gpu.py``'s phases A0 to A3 and of its table's per-step and best-plain
columns (``gpu_table.render`` adds them where a run measured them; a run from before them
renders as it did)."""

from __future__ import annotations

import math
import statistics

from ablate.tables import markdown_table

BEST_RECIPES = ("best_plain", "best_plain_compiled")  # gpu_plain's, without importing torch
ORDER = ("plain", "plain_tf32", "plain_bf16", "plain_bf16_nocudnn", *BEST_RECIPES, "ablate")
NAMES = {
    "plain_tf32": "plain fp32 + TF32 (`tf32=True`)",
    "plain_bf16_nocudnn": "plain bf16, no cuDNN attention",
    "best_plain": "best plain",
    "best_plain_compiled": "best plain, compiled (`torch_compile=True`)",
}
BEST_COLUMNS = ["model", "strategy", "recipe", "train s/epoch", "step ms median",
                "step ms p90", "new-shape ms (steps)", "seen-shape ms (steps)", "× best plain",
                "eval s", "× best plain eval", "job wall s", "peak GPU MiB", "tokens/s",
                "dev acc (%)"]  # fmt: skip
A1_COLUMNS = ["recipe", "step ms median", "step ms p90", "new-shape steps", "new-shape ms",
              "seen-shape steps", "seen-shape ms", "train s/epoch", "eval s", "job wall s",
              "dev acc (%)"]  # fmt: skip
A2_COLUMNS = ["model", "precision", "eager ms/step", "CUDA graph ms/step", "capture ms",
              "graph / eager"]  # fmt: skip
A3_COLUMNS = ["processes", "steps/s, all", "steps/s per process", "× 1 process"]
SAID = {
    "A0": "A0: versions; the kernels one bf16 `scaled_dot_product_attention` call (batch 16, "
    "12 heads, length 64, head size 32, inputs that need grads, dropout 0.1) runs without and "
    "with a padding mask, with cuDNN's attention on (torch's default) and off (`torch.profiler`; "
    "on the CPU its ops); each module's import in a fresh Python, twice (the first pays a cold "
    "file cache where it is cold).",
    "A1": "A1: MiniLM's shape, `none`, the plain recipes one process each (the table's data and "
    "epochs). Step ms: from the previous step's end (data loading included; CUDA events on the "
    "GPU's stream, the CPU's clock on the CPU); median and p90 over the epochs after the "
    "first. A new-shape step is one whose (batch, length) the job had not computed before, its "
    "first step left out.",
    "A2": "A2: a bare training step (forward, backward, fused AdamW; random weights from each "
    "model's config; one fixed batch, no padding), eager and captured whole as one CUDA graph "
    "(AdamW `capturable=True`, static inputs), in fp32 with TF32 and in bf16 (autocast).",
    "A3": "A3: processes each running MiniLM's bare eager step at the same time on one device: "
    "their steps per second summed.",
}


def recipe_label(recipe: str) -> str | None:
    """The new recipes' names in the tables (None: ``gpu_table`` names it)."""
    return NAMES.get(recipe)


def step_stats(steps: list) -> dict:
    """Median and p90 step ms over the epochs after the first (all, with one epoch); the median
    ms and count of steps whose shape the job had not computed before (``new``) and of the
    others (``seen``), the job's first step left out (it pays the process's start-up)."""
    if not steps:
        return {}
    last = max(e for e, _, _ in steps)
    steady = [ms for e, ms, _ in steps if e > 1 or last == 1]
    seen: set[str] = {steps[0][2]}
    new_ms, seen_ms = [], []
    for _, ms, shape in steps[1:]:
        (seen_ms if shape in seen else new_ms).append(ms)
        seen.add(shape)
    deciles = statistics.quantiles(steady, n=10, method="inclusive") if len(steady) > 1 else steady
    return {
        "step_ms_median": statistics.median(steady),
        "step_ms_p90": deciles[-1],
        "new_shape_steps": len(new_ms),
        "new_shape_ms": statistics.median(new_ms) if new_ms else None,
        "seen_shape_steps": len(seen_ms),
        "seen_shape_ms": statistics.median(seen_ms) if seen_ms else None,
    }


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return fmt.format(value)


def best_of(rows: dict, model: str, freeze: str) -> dict | None:
    """The better (shorter train s/epoch) of the two best-plain rows of a cell, where measured."""
    found = [rows.get((model, freeze, r)) for r in BEST_RECIPES]
    found = [r for r in found if isinstance(r, dict) and r.get("train_s")]
    return min(found, key=lambda r: r["train_s"]) if found else None


def _shaped(row: dict, kind: str) -> str:
    """``<median ms> (<steps>)`` of a row's new- or seen-shape steps."""
    ms, n = row.get(f"{kind}_shape_ms"), row.get(f"{kind}_shape_steps")
    return "—" if n is None else f"{_cell(ms, '{:.1f}')} ({n})"


def _ratio(row: dict, best: dict | None, key: str) -> float | None:
    return row[key] / best[key] if best and best.get(key) else None


def best_table(rows: dict, models: list[str], freezes: list[str], recipes: list[str], name) -> str:
    """The table with best-plain recipes: every ratio against the better of the two."""
    lines = []
    for model in models:
        for freeze in freezes:
            best = best_of(rows, model, freeze)
            for i, recipe in enumerate(recipes):
                row = rows.get((model, freeze, recipe), "not run")
                label = [model if i == 0 else "", freeze if i == 0 else "", name(recipe)]
                if isinstance(row, str):
                    lines.append([*label, row, *["—"] * 11])
                    continue
                lines.append([
                    *label, _cell(row["train_s"], "{:.2f}"),
                    _cell(row.get("step_ms_median"), "{:.1f}"),
                    _cell(row.get("step_ms_p90"), "{:.1f}"),
                    _shaped(row, "new"), _shaped(row, "seen"),
                    _cell(_ratio(row, best, "train_s"), "{:.2f}"),
                    _cell(row["eval_s"], "{:.2f}"),
                    _cell(_ratio(row, best, "eval_s"), "{:.2f}"),
                    _cell(row.get("wall_s"), "{:.1f}"),
                    _cell(row["peak_gpu_mb"], "{:.0f}"), _cell(row["tokens_per_s"], "{:.0f}"),
                    _cell(row["dev_acc"], "{:.2f}"),
                ])  # fmt: skip
    return markdown_table(lines, BEST_COLUMNS, right=BEST_COLUMNS[3:])


BEST_SAID = (
    "× best plain is the train time's ratio to the better (shorter train s/epoch) of best plain "
    "and best plain compiled, × best plain eval the evaluation time's to that recipe's; step "
    "ms is per optimizer step from the previous one's end (CUDA events on a GPU), median and "
    "p90 over the epochs after the first; new- and seen-shape ms: the median step that computed "
    "a (batch, length) its job had not before, and the others, over all epochs (the first step "
    "left out), their counts in brackets; job wall s is the job from its start to "
    "its end (a compiled recipe's compile time in it)."
)


def a1_table(jobs: list[dict], summarise, name) -> str:
    """Phase A1's jobs, one row each."""
    lines = []
    rank = {r: i for i, r in enumerate(ORDER)}
    for job in sorted(jobs, key=lambda j: rank.get(j["recipe"], len(rank))):
        row = summarise(job)
        lines.append([name(job["recipe"]), *(_cell(row.get(k), f) for k, f in (
            ("step_ms_median", "{:.1f}"), ("step_ms_p90", "{:.1f}"), ("new_shape_steps", "{}"),
            ("new_shape_ms", "{:.1f}"), ("seen_shape_steps", "{}"), ("seen_shape_ms", "{:.1f}"),
            ("train_s", "{:.2f}"), ("eval_s", "{:.2f}"), ("wall_s", "{:.1f}"),
            ("dev_acc", "{:.2f}")))])  # fmt: skip
    return markdown_table(lines, A1_COLUMNS, right=A1_COLUMNS[1:])


PACKAGES_SHOWN = 10  # A0's import table: the slowest packages, the rest summed


def a0_text(a0: dict) -> str:
    """Phase A0's versions line, attention kernels and import times."""
    lines = [f"torch {a0['torch']} (CUDA {a0['cuda'] or '—'}), transformers "
             f"{a0['transformers']}, {a0['device']}."]  # fmt: skip
    kernels = [[case, ", ".join(f"`{k}`" for k in names) or "—"]
               for case, names in a0["attention"].items()]  # fmt: skip
    lines += ["", markdown_table(kernels, ["attention", "kernels of one bf16 SDPA call"])]
    imports = [[m, f"{t['cold_s']:.2f}", f"{t['warm_s']:.2f}"] for m, t in a0["imports"].items()]
    lines += ["", markdown_table(imports, ["import", "first s", "again s"], right=[1, 2])]
    if spent := a0.get("import_packages"):  # where the last module's import went
        top = [[f"`{p}`", f"{s:.2f}"] for p, s in list(spent.items())[:PACKAGES_SHOWN]]
        rest = sum(list(spent.values())[PACKAGES_SHOWN:])
        top += [[f"{len(spent) - PACKAGES_SHOWN} others", f"{rest:.2f}"]] if rest else []
        last = list(a0["imports"])[-1]
        head = [f"package (`import {last}`, -X importtime)", "its modules' own s"]
        lines += ["", markdown_table(top, head, right=[1])]
    return "\n".join(lines)


def a2_table(a2: dict) -> str:
    """Phase A2: eager and graphed ms per bare step (a graph's reason where it has none)."""
    lines = []
    for key, got in a2.items():
        model, dtype = key.split("/")
        eager, graph = got["eager"], got["graph"]
        if isinstance(graph, dict):
            cells = [f"{graph['ms_per_step']:.2f}", f"{graph['capture_ms']:.0f}",
                     f"{graph['ms_per_step'] / eager['ms_per_step']:.2f}"]  # fmt: skip
        else:
            cells = [graph, "—", "—"]
        lines.append([model, dtype, f"{eager['ms_per_step']:.2f}", *cells])
    return markdown_table(lines, A2_COLUMNS, right=A2_COLUMNS[2:])


def a3_table(a3: dict) -> str:
    """Phase A3: steps/s summed over the concurrent processes, per count."""
    one = (a3.get("1") or {}).get("steps_per_s")
    lines = [[n, f"{r['steps_per_s']:.1f}", f"{r['steps_per_s'] / int(n):.1f}",
              _cell(r["steps_per_s"] / one if one else None, "{:.2f}")]
             for n, r in a3.items()]  # fmt: skip
    return markdown_table(lines, A3_COLUMNS, right=A3_COLUMNS[1:])


def sections(saved: dict, summarise, name) -> list[tuple[str, str]]:
    """(what it measured, its tables) of each of phases A0 to A3 the run wrote."""
    out = []
    phases = saved.get("phases") or {}
    render = {"A0": a0_text, "A2": a2_table, "A3": a3_table}
    for key in ("A0", "A1", "A2", "A3"):
        part = saved.get(key)
        state = phases.get(key) or {}
        if key == "A1":  # one phase per recipe: the first that did not end well, if any
            ended = [p for k, p in phases.items() if k.startswith("A1-")]
            state = next((p for p in ended if p.get("cut") or p.get("rc") not in (0, None)), {})
        if key == "A1" and part:
            text = a1_table(part, summarise, name)
        elif part and part.get("results"):
            text = render[key](part["results"])
        else:
            text = ""
        more = part.get("said") if isinstance(part, dict) else ""
        said = f"{SAID[key]} {more}".strip()
        if "skipped" in state:
            text = f"{text}\n\n{key} skipped: {state['skipped']}".strip()
        elif state.get("cut") or state.get("rc") not in (0, None):
            why = "cut at the budget" if state.get("cut") else f"exit {state['rc']} (bench-gpu.log)"
            text = f"{text}\n\n{key} {why}: what it measured before is above.".strip()
        if text:
            out.append((said, text))
    return out
