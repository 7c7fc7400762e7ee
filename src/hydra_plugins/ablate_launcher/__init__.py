"""ablate's launcher, ``hydra/launcher=workers`` (``conf/hydra/launcher/workers.yaml``): its jobs
run in workers forked from the sweep after it imported the training stack (``ablate.workers``).
Hydra finds launchers only in the ``hydra_plugins`` package."""

from hydra.plugins.launcher import Launcher


class PreloadedLauncher(Launcher):
    """Runs a sweep's jobs in the workers its callback started (``ablate.workers.launch``)."""

    def __init__(self, n_jobs: int | str, jobs_per_gpu, gpu_memory_per_job_gib: float) -> None:
        # defaults: conf/hydra/launcher/workers.yaml; the plan is resources.plan_workers's
        self.n_jobs, self.jobs_per_gpu = n_jobs, jobs_per_gpu
        self.gpu_memory_per_job_gib = gpu_memory_per_job_gib
        self.config = self.task_function = self.hydra_context = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        from ablate import workers

        # the sweeper's context too: the configs it composes to check a batch are the jobs'
        hydra_context.config_loader = workers.Kept(hydra_context.config_loader)
        self.config, self.task_function, self.hydra_context = config, task_function, hydra_context

    def launch(self, job_overrides, initial_job_idx):
        from ablate import workers

        return workers.launch(self, job_overrides, initial_job_idx)
