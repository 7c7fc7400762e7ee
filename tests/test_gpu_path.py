"""The prepared GPU path cannot break unseen: what a real run and a sweep import is on the GPU
machine (its image or the carried wheels, ``benchmarks/gpu_image.txt``), what a device call
carries fits, and a training run loads nothing it does not use."""

from __future__ import annotations

import gpu_assets
from helpers.imports import distributions, loaded, recorder
from helpers.runs import run_cli, slice_overrides

# What a plain training run must not load: the lr study's Optuna (a trial's side loads it), the
# team server, the report and the archive (other commands').
NOT_IN_A_RUN = ("optuna", "ablate.server", "ablate.report", "ablate.archive", "ablate.docs")


def _lacking(modules: set[str]) -> dict[str, list[str]]:
    """Distribution -> modules of it that the GPU machine would not have."""
    owners = distributions(modules)
    missing = set(gpu_assets.unavailable(set(owners)))
    by_module: dict[str, set[str]] = {}
    for dist, names in owners.items():
        for module in names:
            by_module.setdefault(module, set()).add(dist)
    lacking: dict[str, list[str]] = {}
    for module, dists in by_module.items():
        if dists <= missing:  # no owner of it is there
            for dist in dists:
                lacking.setdefault(dist, []).append(module)
    return {d: sorted(m)[:3] for d, m in lacking.items()}


def test_a_run_and_a_sweep_import_only_what_the_gpu_machine_has(slice_root, tmp_path):
    store = f"sqlite:///{tmp_path}/mlflow.db"
    run_env = recorder(tmp_path / "run")
    res = run_cli(*slice_overrides(slice_root, store, tmp_path / "r"), env=run_env)
    assert res.returncode == 0, res.stderr[-3000:]
    sweep_env = recorder(tmp_path / "sweep")
    args = [*slice_overrides(slice_root, store, tmp_path / "s"), "trainer.epochs=1"]
    res = run_cli("--multirun", *args, "freeze=none,lora", env=sweep_env)
    assert res.returncode == 0, res.stderr[-3000:]
    run = loaded(tmp_path / "run")
    sweep = loaded(tmp_path / "sweep")
    assert sweep  # the sweep (its workers fork from it preloaded: what they add, each records)
    modules = set().union(*run.values(), *sweep.values())
    assert {"torch", "transformers", "mlflow", "hydra", "peft"} <= modules  # the hook saw them
    assert _lacking(modules) == {}, "install these on the GPU machine: add them to CARRIED"
    # the single run's process loaded none of what other commands use
    (single,) = run.values()
    assert sorted(m for m in single if m.startswith(NOT_IN_A_RUN)) == []


def test_the_check_names_what_the_gpu_machine_lacks():
    """The optuna breakage, as the check above would have caught it."""
    assert gpu_assets.unavailable({"optuna", "torch", "hydra-core", "colorlog"}) == [
        "colorlog",
        "optuna",
    ]
    lacking = _lacking({"optuna", "optuna.trial", "torch", "omegaconf"})
    assert lacking == {"optuna": ["optuna", "optuna.trial"]}


def test_what_travels_to_the_gpu_machine_fits():
    tree, assets = gpu_assets.travel_bytes()
    limit = gpu_assets.LIMIT_MIB * 2**20
    assert tree + assets <= limit, (
        f"the working tree ({tree / 2**20:.1f} MiB) and the assets `make gpu-wheels` carries "
        f"({assets / 2**20:.1f} MiB) exceed the {gpu_assets.LIMIT_MIB} MiB a device call carries"
    )
    # the record is of today's carried packages: a new one is filled (and weighed) again
    from packaging.utils import canonicalize_name, parse_wheel_filename

    recorded = gpu_assets.json.loads(gpu_assets.RECORD.read_text())["wheels"]
    names = {canonicalize_name(parse_wheel_filename(w)[0]) for w in recorded}
    assert names == {canonicalize_name(n) for n in gpu_assets.CARRIED}


def test_the_image_list_is_consistent():
    known = gpu_assets.image()
    assert {"torch", "transformers", "peft", "pandas"} <= known["has"]
    assert {"hydra-core", "omegaconf", "mlflow", "datasets", "optuna"} <= known["lacks"]
    assert known["has"] & known["lacks"] == set()
