"""docs/extending.md's worked examples, written into an ``ablate_extensions`` folder and run."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from helpers.data import ROOT
from helpers.runs import run_cli, slice_overrides
from helpers.store import logged_runs, new_store, run_info

DOC = ROOT / "docs" / "extending.md"


def examples(kind: str = "python") -> dict[str, str]:
    """The doc's Python (or YAML) blocks that name their file (``# ablate_extensions/<name>.py``,
    ``# my_conf/freeze/<name>.yaml``)."""
    pattern = rf"```{kind}\n(# ([\w/]+\.\w+)\n.*?)```"
    blocks = re.findall(pattern, DOC.read_text(), re.S)
    return {path: code for code, path in blocks}


def written(tmp_path: Path, files: dict[str, str]) -> None:
    for path, code in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(code)


def test_the_extending_examples_register_a_task_a_strategy_and_a_switch_and_run(
    slice_root, tmp_path
):
    files = examples()
    assert sorted(files) == [
        "ablate_extensions/coarse_pos.py",
        "ablate_extensions/flush_denormal.py",
        "ablate_extensions/fourierft.py",
        "ablate_extensions/layernorm.py",
    ]
    files.pop("ablate_extensions/fourierft.py")  # its own run: the test below
    written(tmp_path, files)
    store = new_store(tmp_path)
    # from the folder holding ablate_extensions/, as a user runs it: the new task, strategy and
    # switch
    proc = run_cli(
        *slice_overrides(slice_root, store, tmp_path),
        "trainer.epochs=1",
        "data.task=coarse_pos",
        "freeze.strategy=layernorm",
        "freeze.name=layernorm",
        "trainer.flush_denormal=true",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = logged_runs(store)
    assert run.info.status == "FINISHED"
    assert run.info.run_name.startswith("UD_Naija-Slice-layernorm-tiny-s42 ")
    m = run.data.metrics
    assert 0 <= m["dev_accuracy"] <= 1 and m["best_dev_accuracy"] == m["dev_accuracy"]
    # LN-tuning: 2 LayerNorms a block plus the embeddings', weight and bias each, and the head
    hidden, blocks = 32, 6  # conf/model/tiny.yaml
    layernorms = (2 * blocks + 1) * 2 * hidden
    head = hidden * 4 + 4  # four coarse classes
    assert m["trainable_params"] == layernorms + head
    flushed = run_info(store, run.info.run_id)["speed"]["flush_denormal"]
    assert flushed in ("on", "not applied: this device cannot flush denormals")
    assert run.data.params["trainer.flush_denormal"] == "True"
    # without the folder, the new keys are unknown: a composition error naming the key
    plain = run_cli(*slice_overrides(slice_root, store, tmp_path), "trainer.flush_denormal=true")
    assert plain.returncode != 0 and "flush_denormal" in plain.stderr


def test_a_peft_method_with_two_new_keys_is_one_declaration_and_one_option_file(
    slice_root, tmp_path
):
    (option,) = examples("yaml")
    written(tmp_path, {**examples(), **examples("yaml")})
    store = new_store(tmp_path)
    search = f"hydra.searchpath=[file://{tmp_path / option.split('/')[0]}]"
    base = [*slice_overrides(slice_root, store, tmp_path), search, "data.task=coarse_pos"]
    proc = run_cli(*base, "trainer.epochs=1", "freeze=fourierft", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = logged_runs(store)
    assert run.info.status == "FINISHED"
    assert run.data.params["freeze.n_frequency"] == "1000"
    # 1,000 coefficients on query and value of each of the tiny model's 6 blocks, and the head
    hidden, blocks, classes = 32, 6, 4  # conf/model/tiny.yaml, coarse_pos
    assert run.data.metrics["trainable_params"] == 2 * blocks * 1000 + hidden * classes + classes
    # the declared check, before anything is tracked
    bad = run_cli(*base, "freeze=fourierft", "freeze.n_frequency=0", cwd=tmp_path)
    assert bad.returncode != 0
    assert "freeze.n_frequency=0: must be a positive integer" in bad.stdout + bad.stderr
    assert len(logged_runs(store)) == 1


def without(conf: Path, keys: set[str]) -> None:
    """Delete the lines of ``keys`` (``group.name``) from every option file under ``conf``, and a
    group line left with nothing under it."""
    names = {k.split(".", 1)[1] for k in keys}
    for path in conf.rglob("*.yaml"):
        kept = [ln for ln in path.read_text().splitlines() if ln.split(":")[0].strip() not in names]
        emptied = {
            i
            for i, ln in enumerate(kept)
            if re.fullmatch(r"\w+:", ln) and (i + 1 == len(kept) or not kept[i + 1].startswith(" "))
        }
        path.write_text("".join(f"{ln}\n" for i, ln in enumerate(kept) if i not in emptied))


def test_without_the_speed_folder_and_its_keys_runs_train_track_and_report(slice_root, tmp_path):
    from ablate.speed.switches import SPEED

    shutil.copytree(
        ROOT / "src" / "ablate",
        tmp_path / "src" / "ablate",
        ignore=shutil.ignore_patterns("speed", "__pycache__"),
    )
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    without(tmp_path / "conf", {s.key for s in SPEED})
    assert "length_grouping" not in (tmp_path / "conf" / "trainer" / "default.yaml").read_text()
    env = {"PYTHONPATH": str(tmp_path / "src")}
    store = new_store(tmp_path)
    proc = run_cli(
        *slice_overrides(slice_root, store, tmp_path),
        "trainer.epochs=1",
        "freeze=first2",
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = logged_runs(store)
    assert run.info.status == "FINISHED" and 0 <= run.data.metrics["dev_accuracy"] <= 1
    assert run.data.metrics["train_flops"] > 0  # the meter is training's own
    assert run_info(store, run.info.run_id).get("speed", {}) == {}  # no plugin ran
    assert not any(k.startswith("trainer.length_grouping") for k in run.data.params)
    # a speed switch is then no key at all, and the report reads the run
    gone = run_cli(
        *slice_overrides(slice_root, store, tmp_path),
        "trainer.length_grouping=off",
        cwd=tmp_path,
        env=env,
    )
    assert gone.returncode != 0 and "length_grouping" in gone.stderr
    report = run_cli(
        "--uri",
        store,
        "--out",
        str(tmp_path / "report"),
        "--all",
        module="ablate.report",
        cwd=tmp_path,
        env=env,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    assert "first2" in (tmp_path / "report" / "summary.md").read_text()
