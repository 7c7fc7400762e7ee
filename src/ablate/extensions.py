"""Extensions: every module of the ``ablate_plugins`` namespace package is imported when ablate
starts, as Hydra imports ``hydra_plugins``. A module there registers tasks
(``ablate.tasks.register``), strategies (``ablate.strategies.register``) and speed plugins with
their switches (``ablate.speed.plugins.register``, ``ablate.speed.registry.register``); the config
schema then holds the new switches. docs/extending.md has a worked example of each.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil

log = logging.getLogger(__name__)
NAMESPACE = "ablate_plugins"
_loaded: set[str] = set()


def load() -> list[str]:
    """Import every ``ablate_plugins.*`` module not imported yet (on ``sys.path``: installed, or
    a folder on PYTHONPATH), then register the schema again so their switches join it. Returns
    the modules imported by this call."""
    try:
        namespace = importlib.import_module(NAMESPACE)
    except ModuleNotFoundError:
        return []
    new = []
    for info in pkgutil.iter_modules(namespace.__path__, f"{NAMESPACE}."):
        if info.name not in _loaded:
            importlib.import_module(info.name)
            _loaded.add(info.name)
            new.append(info.name)
    if new:
        from ablate import config

        config.register()
        log.debug("extensions: %s", ", ".join(new))
    return new
