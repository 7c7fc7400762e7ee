"""Tracking: one MLflow run per Hydra job (``run``), the store it goes to (``store``), a run's
identity (``identity``), runs whose process died (``stale``, ``procs``), per-epoch histories
(``history``) and the team server (``server``). Importing the package loads nothing heavy."""
