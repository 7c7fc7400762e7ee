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
import gpu_table
import pytest


def test_bench_gpu_dry_run_measures_every_recipe_and_both_grids(tmp_path, monkeypatch):
    temp = tmp_path / "tmp"  # the bench's work folder and its jobs'
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    out = tmp_path / "out"
    rc = bench_gpu.main(
        ["--dry-run", "--assets", str(tmp_path / "no-assets"), "--out", str(out)]
        + ["--freeze", "lora", "--grid-freeze", "none", "--grid-data", "naija,ewt"]
    )
    assert rc == 0
    # its work folder (model weights, slices, the sweep, the jobs' own folders) is gone
    assert [p.name for p in temp.iterdir() if not p.name.startswith("torchinductor")] == []
    logged = json.loads((out / "bench-gpu.json").read_text())
    jobs = {(j["job"], j["recipe"]): j for j in logged["jobs"]}
    models = ("minilm", "distilbert_multilingual")
    assert set(jobs) == {(f"{m}/lora", r) for m in models for r in bench_gpu.RECIPES}
    for model in models:  # every recipe loads the same saved initialisation
        inits = {o for r in bench_gpu.RECIPES for o in jobs[(f"{model}/lora", r)]["overrides"]
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
    assert "hydra/launcher=workers hydra.launcher.n_jobs=2" in grid["ablate"]["command"]
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
    # the profile: every recipe, the profile's strategies, its window of steps read
    profiled = {(j["job"], j["recipe"]): j["profile"] for j in logged["profile"]}
    assert set(profiled) == {(f"{m}/{f}", r) for m in models for f in ("none", "lora")
                             for r in bench_gpu.RECIPES}  # fmt: skip
    for numbers in profiled.values():
        assert numbers["steps"] == 2 and numbers["step_ms"] > 0 and numbers["ops_per_step"] > 50
        assert numbers["kernels_per_step"] is None  # the CPU: no kernels to count
    frozen, full = profiled[("minilm/lora", "plain")], profiled[("minilm/none", "plain")]
    assert frozen["ops_per_step"] < full["ops_per_step"]  # LoRA's frozen weights get no update
    assert "| minilm | none | plain fp32 |" in text.split("Profile:")[1]
    assert gpu_table.render(logged) == text  # the saved JSON renders the same document


MEASURED = Path(__file__).resolve().parents[1] / "benchmarks" / "measured"


def test_the_gpu_tables_in_the_docs_are_the_measured_runs_rendered():
    speed = (MEASURED.parents[1] / "docs" / "speed.md").read_text(encoding="utf-8")
    runs = sorted(MEASURED.glob("*.json"))
    assert any(p.name.startswith("gpu-") for p in runs), "no measured GPU run is kept"
    for path in runs:
        saved = json.loads(path.read_text())
        measured_on = "NVIDIA" if path.name.startswith("gpu-") else "CPU"  # as each is named
        assert saved["meta"]["device"].startswith(measured_on), path.name
        rendered = gpu_table.render(saved)
        tables = [b for b in rendered.split("\n\n") if b.startswith("| ")]
        assert tables
        for block in tables:  # each table of the run, as the tool renders it
            assert block.strip() in speed, f"docs/speed.md lacks {path.name}'s table"


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
    assert "ablate / plain" not in shown  # no ratio against a cut run


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
