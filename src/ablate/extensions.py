"""Extensions: the parts of ablate that declare keys or plugins (``BUILTIN``: the strategies, the
speed switches and plugins, the lr study's trial plugin), then every module of the
``ablate_extensions`` namespace package, imported when the config schema is built
(``ablate.config.register``), as Hydra imports ``hydra_plugins``.
A module there registers tasks (``ablate.tasks.register``), strategies
(``ablate.strategies.register``), training plugins (``ablate.plugins.register``) and their
switches (``ablate.switches.register``); the schema then holds the new switches.
docs/extending.md has a worked example of each.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import pkgutil

log = logging.getLogger(__name__)
NAMESPACE = "ablate_extensions"
# ablate's own parts that declare keys or plugins (the strategies: the freeze keys; speed: its
# switches and plugins; lrstudy: its trial's plugin), loaded by name as extensions are, since they
# sit above the schema they add to; speed may be deleted, so each is loaded where it is there
BUILTIN = ("ablate.strategies", "ablate.speed", "ablate.lrstudy")
_loaded: set[str] = set()


def load() -> list[str]:
    """Import each ``BUILTIN`` part that is there and every ``ablate_extensions.*`` module (on
    ``sys.path``: installed, or a folder on PYTHONPATH) not imported yet. Returns the modules
    imported by this call."""
    names = [name for name in BUILTIN if importlib.util.find_spec(name) is not None]
    try:
        namespace = importlib.import_module(NAMESPACE)
        names += [info.name for info in pkgutil.iter_modules(namespace.__path__, f"{NAMESPACE}.")]
    except ModuleNotFoundError:
        pass
    new = []
    for name in names:
        if name not in _loaded:
            importlib.import_module(name)
            _loaded.add(name)
            new.append(name)
    if new:
        log.debug("extensions: %s", ", ".join(new))
    return new
