"""ablate's launcher for ``hydra/launcher=joblib`` (``conf/hydra/launcher/joblib.yaml``): the
joblib launcher's keys, its jobs run in workers forked from the sweep after it imported the
training stack (``ablate.workers``). Hydra finds launchers only in the ``hydra_plugins`` package."""

from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher


class PreloadedLauncher(JoblibLauncher):
    """The joblib launcher whose jobs run in the sweep's preloaded workers where it started
    them, else in joblib's own (``ablate.workers.launch``)."""

    def launch(self, job_overrides, initial_job_idx):
        from ablate import workers

        return workers.launch(self, job_overrides, initial_job_idx)
