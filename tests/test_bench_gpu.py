"""``make bench-gpu`` (benchmarks/bench_gpu.py): its dry run on the CPU, the same command as on a
GPU with tiny model shapes and a few sentences; its table's arithmetic; which carried wheels
``make bench-gpu`` installs on a machine without network."""

from __future__ import annotations

import json
import tempfile
import zipfile
from pathlib import Path

import bench_gpu
import gpu_assets
import gpu_report
import gpu_table
import pytest

# the dry run's table recipes (A1 runs best plain compiled: the one compile of the dry run)
RECIPES = ("plain", "best_plain", "ablate")


def test_bench_gpu_dry_run_measures_every_recipe_and_both_grids(tmp_path, monkeypatch):
    temp = tmp_path / "tmp"  # the bench's work folder and its jobs'
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    out = tmp_path / "out"
    rc = bench_gpu.main(
        ["--dry-run", "--assets", str(tmp_path / "no-assets"), "--out", str(out)]
        + ["--freeze", "lora", "--grid-freeze", "none", "--grid-data", "naija,ewt"]
        + ["--recipes", ",".join(RECIPES)]
    )
    assert rc == 0
    # its work folder (model weights, slices, the sweep, the jobs' own folders) is gone
    assert [p.name for p in temp.iterdir() if not p.name.startswith("torchinductor")] == []
    logged = json.loads((out / "bench-gpu.json").read_text())
    jobs = {(j["job"], j["recipe"]): j for j in logged["jobs"]}
    models = ("minilm", "distilbert_multilingual")
    assert set(jobs) == {(f"{m}/lora", r) for m in models for r in RECIPES}
    for model in models:  # every recipe loads the same saved initialisation
        inits = {o for r in RECIPES for o in jobs[(f"{model}/lora", r)]["overrides"]
                 if o.startswith("model.name_or_path=")}  # fmt: skip
        assert len(inits) == 1
    for job in jobs.values():
        assert len(job["epoch_time_s"]) == len(job["dev_accuracy"]) == 2
        assert job["train_tokens"][0] > 0 and job["device"].startswith("CPU")
    rows = {(r["model"], r["recipe"]): r for r in logged["table"]}
    plain = jobs[("minilm/lora", "plain")]
    assert rows[("minilm", "plain")]["train_s"] == pytest.approx(plain["epoch_time_s"][1])
    grid = logged["grid"]
    assert grid["ablate"]["finished"] == grid["plain"]["finished"] == grid["ablate"]["jobs"] == 2
    assert "hydra.launcher.n_jobs=2" in grid["ablate"]["command"]
    marks = grid["ablate"]["timeline"]  # where the sweep's time went, read from its log
    assert 0 < marks["launch_s"] < marks["first_done_s"] <= marks["last_done_s"] < marks["end_s"]
    assert marks["launch_s"] < marks["first_job_s"] < marks["first_done_s"]
    assert 0 < marks["train_s"] < marks["end_s"] and marks["workers"] == 2
    # both jobs ran in the two workers the sweep started and preloaded at its start
    assert marks["preloaded"] == {"workers": 2, "jobs": 2}
    assert "2 job(s) ran in 2 worker(s) preloaded" in (out / "bench-gpu.md").read_text()
    text = (out / "bench-gpu.md").read_text()
    assert text.startswith("GPU bench: CPU, torch ")
    assert "| distilbert_multilingual | lora | plain fp32 |" in text
    assert "| ablate / plain |" in text and "2 of 2" in text
    assert "ablate's sweep launched its jobs at " in text and "(after its report)." in text
    assert "WordPiece of" in text  # the multilingual shape's tokenizer, said in the notes
    log = (out / "bench-gpu.log").read_text()
    assert "===== table" in log and "===== grid-ablate" in log and "Sweep FINISHED" in log
    # the profile: the dry run's profile recipes, the profile's strategies, its window of steps
    profiled = {(j["job"], j["recipe"]): j["profile"] for j in logged["profile"]}
    assert set(profiled) == {(f"minilm/{f}", r) for f in ("none", "lora")
                             for r in ("plain", "ablate")}  # fmt: skip
    for numbers in profiled.values():
        assert numbers["steps"] == 2 and numbers["step_ms"] > 0 and numbers["ops_per_step"] > 50
        assert numbers["kernels_per_step"] is None  # the CPU: no kernels to count
    frozen, full = profiled[("minilm/lora", "plain")], profiled[("minilm/none", "plain")]
    assert frozen["ops_per_step"] < full["ops_per_step"]  # LoRA's frozen weights get no update
    assert "| minilm | none | plain fp32 |" in text.split("Profile:")[1]
    assert gpu_table.render(logged) == text  # the saved JSON renders the same document
    _check_new_phases(logged, jobs, text)


def _check_new_phases(logged: dict, jobs: dict, text: str) -> None:
    """What phases A0 to A3 and the table's best-plain and per-step columns wrote."""
    a0 = logged["A0"]["results"]
    assert a0["torch"] and a0["transformers"] and a0["device"] == "CPU" and a0["cuda"] is None
    # each step phase says where it ran: a call of A2 or A3 alone names its device by it
    assert {logged[p]["platform"]["device"] for p in ("A0", "A2", "A3")} == {"CPU"}
    cases = ("cuDNN on", "cuDNN on, padding mask", "cuDNN off", "cuDNN off, padding mask")
    assert tuple(a0["attention"]) == cases
    for case in cases:  # the CPU's attention ops, read by the profiler
        assert any("scaled_dot_product" in k for k in a0["attention"][case])
    assert set(a0["imports"]) == {"numpy"}  # the dry run's: torch's costs seconds
    # its import by package: numpy's own modules take the most of numpy's import
    assert next(iter(a0["import_packages"])) == "numpy" and a0["import_packages"]["numpy"] > 0
    assert "| package (`import numpy`, -X importtime) | its modules' own s |" in text
    assert a0["imports"]["numpy"]["cold_s"] > 0 and a0["imports"]["numpy"]["warm_s"] > 0
    a1 = {j["recipe"]: j for j in logged["A1"]}
    assert set(a1) == {"best_plain_compiled"}
    assert a1["best_plain_compiled"]["settings"] == {
        "bf16": True, "tf32": False, "cudnn_sdp": False, "optim": "adamw_torch_fused",
        "eval_batch": 64, "argmax_on_device": True, "nan_filter": False, "compile": True,
        "compile_backend": "eager",  # the CPU's: dynamo's tracing, no code generation
    }  # fmt: skip
    for job in a1.values():  # 16 sentences in batches of 4: 4 timed steps an epoch
        assert [e for e, _, _ in job["steps"]] == [1] * 4 + [2] * 4
        assert all(ms > 0 and "x" in shape for _, ms, shape in job["steps"])
        row = gpu_table.summarise(job)
        assert 0 < row["step_ms_median"] <= row["step_ms_p90"]
        assert row["new_shape_steps"] + row["seen_shape_steps"] == 7 and row["seen_shape_steps"]
    a2 = logged["A2"]["results"]
    assert set(a2) == {f"{m}/{d}" for m in ("minilm", "distilbert_multilingual")
                       for d in ("tf32", "bf16")}  # fmt: skip
    for got in a2.values():
        assert got["eager"]["ms_per_step"] > 0 and got["graph"] == "not available on cpu"
    a3 = logged["A3"]["results"]
    assert set(a3) == {"1", "2"} and all(a3[n]["steps_per_s"] > 0 for n in a3)
    assert len(a3["2"]["steps"]) == 2 and min(a3["2"]["steps"]) >= 1
    # every recipe of the table timed its steps, ablate's (through a plugin) too
    for (job, recipe), got in jobs.items():
        assert got["steps"] and all(ms > 0 for _, ms, _ in got["steps"]), (job, recipe)
    best_settings = jobs[("minilm/lora", "best_plain")]["settings"]
    assert best_settings["optim"] == "adamw_torch_fused" and best_settings["cudnn_sdp"] is False
    rows = {(r["model"], r["recipe"]): r for r in logged["table"]}
    best = rows[("minilm", "best_plain")]  # the one best plain of the dry run's table
    ablate = rows[("minilm", "ablate")]
    said = f"| {ablate['train_s']:.2f} | {ablate['step_ms_median']:.1f} |"
    assert (
        f"{said} {ablate['step_ms_p90']:.1f} | " in text
        and f"| {ablate['train_s'] / best['train_s']:.2f} | {ablate['eval_s']:.2f} |" in text
    )
    assert "| step ms p90 | new-shape ms (steps) | seen-shape ms (steps) | × best plain |" in text
    assert "|  |  | best plain | " in text
    for phase in ("A0: versions", "A1: MiniLM's shape", "A2: a bare training step", "A3: "):
        assert phase in text
    assert "| minilm | tf32 |" in text and "| not available on cpu | — | — |" in text
    assert "| best plain, compiled (`torch_compile=True`) |" in text and "| 2 |" in text


def test_a_phase_or_recipe_the_bench_does_not_know_is_refused_naming_the_known_ones(capsys):
    said = {
        "--phases": "--phases: unknown ['A9']; known: A0, A1, A2, A3, table, grid, profile",
        "--a1-recipes": "--a1-recipes: unknown ['best']; known: plain, plain_tf32, plain_bf16,",
        "--a3-processes": "--a3-processes: ['0'] are not counts of processes (e.g. 1,4,8)",
    }
    for flag, value in (("--phases", "A1,A9"), ("--a1-recipes", "best"), ("--a3-processes", "0")):
        with pytest.raises(SystemExit):
            bench_gpu.parse([flag, value])
        assert said[flag] in capsys.readouterr().err


def test_the_plain_recipes_settings_on_the_cpu_say_what_does_not_apply_there():
    import gpu_plain

    assert gpu_plain.resolved("plain_tf32") == {"tf32": None, "note": "tf32: not available on cpu"}
    assert gpu_plain.resolved("plain_bf16_nocudnn") == {"bf16": True, "cudnn_sdp": False}
    assert gpu_plain.resolved("best_plain")["bf16"] is True  # the CPU's bf16 autocast


def test_step_stats_read_the_epochs_after_the_first_and_split_new_from_seen_shapes():
    steps = [[1, 50.0, "16x9"], [1, 30.0, "16x12"], [1, 10.0, "16x9"], [2, 12.0, "16x9"],
             [2, 40.0, "16x20"], [2, 11.0, "16x12"], [2, 13.0, "16x9"]]  # fmt: skip
    got = gpu_report.step_stats(steps)
    assert got["step_ms_median"] == 12.5  # epoch 2's steps: 11, 12, 13, 40
    assert got["step_ms_p90"] == pytest.approx(40 - 0.3 * (40 - 13))
    # the first step (the job's start-up) is left out; 16x12 and 16x20 are new when first seen
    assert (got["new_shape_steps"], got["new_shape_ms"]) == (2, 35.0)
    assert (got["seen_shape_steps"], got["seen_shape_ms"]) == (4, 11.5)
    row = {"train_s": 2.0, "eval_s": 1.0, "peak_gpu_mb": None, "tokens_per_s": 10.0,
           "dev_acc": 50.0, "wall_s": 9.0, **got}  # fmt: skip
    rows = {("m", "none", "best_plain"): {**row, "train_s": 4.0, "eval_s": 0.5},
            ("m", "none", "best_plain_compiled"): {**row, "train_s": 3.0, "eval_s": 2.0},
            ("m", "none", "ablate"): row}  # fmt: skip
    text = gpu_table.table(rows, ["m"], ["none"], ["best_plain", "best_plain_compiled", "ablate"])
    # the better best plain is the compiled one (3.0 s): every ratio is against it
    ablate = "|  |  | ablate (its defaults) | 2.00 | 12.5 | 31.9 | 35.0 (2) | 11.5 (4) | 0.67 |"
    assert f"{ablate} 1.00 | 0.50 | 9.0 |" in text
    assert (
        "| m | none | best plain | 4.00 | 12.5 | 31.9 | 35.0 (2) | 11.5 (4) | 1.33 | 0.50 | 0.25 |"
        in text
    )


def test_table_reads_the_epochs_after_the_first_and_says_why_a_job_has_none():
    job = {"epoch_time_s": [9.0, 2.0, 4.0], "dev_eval_time_s": [1.0, 0.5, 0.7],
           "dev_accuracy": [0.5, 0.6, 0.7], "train_tokens": [900, 1000, 2000],
           "peak_gpu_mb": 1234.0, "padding_pct": [50, 40, 30], "wall_s": 20.0}  # fmt: skip
    plain = gpu_table.summarise(job)
    assert plain["train_s"] == 3.0 and plain["first_epoch_s"] == 9.0
    assert plain["eval_s"] == pytest.approx(0.6)
    assert plain["tokens_per_s"] == 500.0 and plain["dev_acc"] == pytest.approx(70.0)
    faster = gpu_table.summarise({**job, "epoch_time_s": [9.0, 1.0, 2.0]})
    rows = {("m", "none", "plain"): plain, ("m", "none", "ablate"): faster,
            ("m", "none", "plain_bf16"): "cut at the budget"}  # fmt: skip
    text = gpu_table.table(rows, ["m"], ["none"], ["plain", "plain_bf16", "ablate"])
    assert "| m | none | plain fp32 | 3.00 | 1.00 | — | 0.60 | — | 1234 | 500 | 70.00 |" in text
    assert "|  |  | plain bf16 (`bf16=True`) | cut at the budget | — |" in text
    assert "|  |  | ablate (its defaults) | 1.50 | 0.50 | — |" in text
    rows[("m", "none", "plain_bf16")] = gpu_table.summarise({**job, "epoch_time_s": [9.0, 6.0]})
    text = gpu_table.table(rows, ["m"], ["none"], ["plain", "plain_bf16", "ablate"])
    assert "|  |  | ablate (its defaults) | 1.50 | 0.50 | 0.25 | 0.60 | 1.00 |" in text
    grid = {
        "ablate": {"how": "a", "jobs": 10, "finished": 10, "wall_s": 50.0, "cut": False},
        "plain": {"how": "p", "jobs": 10, "finished": 7, "wall_s": 90.0, "cut": True},
    }
    shown = gpu_table.grid_table(grid)
    assert "| p | > 90.0 (cut at the time budget) | 7 of 10 |" in shown
    assert "| ablate / plain | \\< 0.56 |" in shown  # a bound: plain's whole grid took longer
    grid["ablate"]["cut"] = True
    assert "ablate / plain" not in gpu_table.grid_table(grid)  # no bound from a cut ablate


def test_merge_keeps_one_warm_machines_calls_as_one_run_measured_rows_first():
    row = {"train_s": 2.0, "eval_s": 0.2}

    def run(command, table, grid):
        return {
            "meta": {"command": command},
            "table": table,
            "grid": grid,
            "profile": [],
            "phases": {f"table-{r['recipe']}": {"rc": 0} for r in table},
            "jobs": [command],
        }

    first = run(
        "one",
        [
            {"model": "m", "freeze": "none", "recipe": "best_plain", **row},
            {"model": "m", "freeze": "none", "recipe": "ablate", "why": "skipped"},
        ],
        {"ablate": {"finished": 0}, "plain": {"finished": 0}},
    )
    second = run(
        "two",
        [
            {"model": "m", "freeze": "none", "recipe": "ablate", **row},
            {"model": "m", "freeze": "none", "recipe": "best_plain", "why": "cut"},
        ],
        {"ablate": {"finished": 10, "wall_s": 60.0}, "plain": {"finished": 9}},
    )
    merged = gpu_table.merge([first, second])
    assert [(r["recipe"], r.get("why")) for r in merged["table"]] == [
        ("best_plain", None),
        ("ablate", None),
    ]  # measured rows kept, in the first call's order
    assert merged["grid"]["ablate"]["wall_s"] == 60.0 and merged["grid"]["plain"]["finished"] == 9
    assert (
        merged["jobs"] == ["one", "two"]
        and "then on the same machine `two" in merged["meta"]["command"]
    )
    assert first["table"][1]["why"] == "skipped"  # the runs merged from are left as they were


def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A real (empty) wheel file: its METADATA names its requirements."""
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA",
                   f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}")  # fmt: skip
    return path


def test_install_takes_what_is_missing_or_too_old_and_warns_of_what_nothing_carried_meets(
    tmp_path,
):
    from importlib.metadata import version

    here = version("transformers")
    wheels = [
        _wheel(tmp_path, "transformers", "99.0"),  # installed here, meets ablate's >=5.23: kept
        _wheel(tmp_path, "ablate-missing-pkg", "1.0",  # not installed: taken
               ("pyyaml>=99", "ablate-absent-dep>=1", "numpy; extra == 'test'")),
        _wheel(tmp_path, "pyyaml", "99.0"),  # installed, too old for the wheel taken: taken
        _wheel(tmp_path, "packaging", "0.1"),  # installed, and nothing asks for more: kept
    ]  # fmt: skip
    chosen, unmet = gpu_assets.to_install(wheels)
    assert sorted(w.name.split("-")[0] for w in chosen) == ["ablate_missing_pkg", "pyyaml"]
    assert unmet == ["ablate-absent-dep>=1 (for ablate-missing-pkg): not installed here"]
    assert version("transformers") == here  # nothing was installed: to_install only chooses
