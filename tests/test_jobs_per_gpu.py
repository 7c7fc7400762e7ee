"""How many jobs a --multirun runs at once (``resources.plan_workers``): ablate's launcher is every
sweep's, one job at a time on a CPU, several per GPU on a GPU machine, from the GPUs' free
memory and the CPUs; each job's threads follow the plan (a default sweep on the CPU:
tests/test_train.py)."""

from __future__ import annotations

import pytest
from helpers.data import ROOT
from helpers.runs import run_cli, slice_overrides
from helpers.store import logged_runs
from omegaconf import OmegaConf

from ablate import workers
from ablate.errors import AblateError
from ablate.training.resources import free_of_visible, plan_workers

GIB = 1024


def _launcher(**keys):
    """ablate's launcher as conf/ declares it (auto, 8 jobs a GPU, 10 GiB a job), with ``keys``."""
    declared = OmegaConf.load(ROOT / "conf" / "hydra" / "launcher" / "workers.yaml")
    assert declared._target_ == workers.LAUNCHER
    assert (declared.n_jobs, declared.jobs_per_gpu, declared.gpu_memory_per_job_gib) == (
        "auto",
        8,
        10,
    )
    return OmegaConf.merge(declared, keys)


def test_auto_runs_one_job_on_a_cpu_and_several_per_gpu_within_memory_and_cpus():
    assert plan_workers(_launcher(), cpus=16, free_mib=[])[0] == 1  # no GPU: clean times
    assert plan_workers(_launcher(), cpus=16, free_mib=[139 * GIB])[0] == 8  # jobs_per_gpu
    assert plan_workers(_launcher(), cpus=16, free_mib=[25 * GIB])[0] == 2  # memory holds 2
    assert plan_workers(_launcher(), cpus=16, free_mib=[79 * GIB])[0] == 7  # an H100's
    assert plan_workers(_launcher(), cpus=16, free_mib=[5 * GIB])[0] == 1  # at least one
    assert plan_workers(_launcher(), cpus=6, free_mib=[80 * GIB] * 2)[0] == 6  # one CPU a job
    assert plan_workers(_launcher(), cpus=1, free_mib=[80 * GIB] * 2)[0] == 2  # one per GPU
    # GPUs taken in turn: each runs as many as the one with the least free memory holds
    assert plan_workers(_launcher(), cpus=16, free_mib=[80 * GIB, 15 * GIB])[0] == 2
    unbounded = _launcher(jobs_per_gpu=None, gpu_memory_per_job_gib=20)
    workers_, why = plan_workers(unbounded, cpus=16, free_mib=[139 * GIB])
    assert workers_ == 6 and "139 GiB free" in why and "6 jobs at once" in why
    assert "NVIDIA's MPS" in why  # several jobs a GPU: the operator's option for them, named
    assert "MPS" not in plan_workers(_launcher(), cpus=1, free_mib=[80 * GIB] * 2)[1]
    # an integer is that many; negative counts as joblib does
    assert plan_workers(_launcher(n_jobs=3), cpus=16, free_mib=[139 * GIB])[0] == 3
    assert plan_workers(_launcher(n_jobs=-1), cpus=16, free_mib=[])[0] == 16
    assert plan_workers(_launcher(n_jobs=-2), cpus=16, free_mib=[])[0] == 15
    # other launchers' configs: joblib's n_jobs, or none (the basic launcher, SLURM)
    assert plan_workers(OmegaConf.create({"n_jobs": 4}), cpus=2)[0] == 4
    assert plan_workers(OmegaConf.create({}), cpus=2)[0] == 1


@pytest.mark.parametrize(
    ("key", "value"),
    [("n_jobs", "four"), ("n_jobs", 0), ("jobs_per_gpu", 0), ("gpu_memory_per_job_gib", -1)],
)
def test_a_launcher_key_out_of_range_is_one_error_naming_it(key, value):
    with pytest.raises(AblateError, match=rf"hydra\.launcher\.{key}={value!r}: n_jobs takes"):
        plan_workers(_launcher(**{key: value}), cpus=2, free_mib=[])


def test_the_gpus_free_memory_is_read_for_the_visible_ones_by_index_or_uuid():
    smi = "0, GPU-aa, 81000\n1, GPU-bb, 40000\n2, GPU-cc, 1000\n"
    assert free_of_visible(smi, None) == [81000, 40000, 1000]
    assert free_of_visible(smi, "2,0") == [1000, 81000]  # CUDA's order: the variable's
    assert free_of_visible(smi, "GPU-bb") == [40000]
    assert free_of_visible(smi, "") == []  # none visible: a CPU run
    assert free_of_visible(smi, "GPU-b") == [40000]  # a UUID's unique prefix, as CUDA takes it
    assert free_of_visible(smi, "GPU-") == []  # not unique: none
    unreadable = "0, GPU-aa, [N/A]\n1, GPU-bb, 40000\nWarning: something\n"
    assert free_of_visible(unreadable, None) == [40000]  # what it cannot read is left out


def test_a_launcher_key_out_of_range_on_the_command_line_stops_the_sweep_before_any_job(
    slice_root, store, tmp_path
):
    bad = run_cli("--multirun", "hydra.launcher.jobs_per_gpu=0", "freeze=none",
                  *slice_overrides(slice_root, store, tmp_path))  # fmt: skip
    assert bad.returncode == 2 and "hydra.launcher.jobs_per_gpu=0" in bad.stderr
    assert logged_runs(store) == []  # nothing tracked
