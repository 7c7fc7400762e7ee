"""Tracking: one MLflow run per Hydra job (``run``; what it records of where it came from and its
name: ``provenance``), the store it goes to (``store``), a run's identity (``identity``), runs
whose process died (``stale``, ``procs``), per-epoch histories (``history``), a run's pages in
the UI (``ui_links``) and how a client reaches a server that asks for a password (``auth``,
``access``); the team server itself is ``ablate.server``. Importing the package loads nothing
heavy."""
