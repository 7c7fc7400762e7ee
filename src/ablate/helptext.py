"""``python -m ablate.train --help``: ablate's own help, through Hydra's help template.

``conf/hydra/help/ablate.yaml`` (chosen in ``conf/train.yaml``) is a Hydra help template whose
``${ablate.help:groups}`` and ``${ablate.help:keys}`` this resolver fills when Hydra prints the
help: every config group with its options, a line each (their files' first comment line), and
the schema's keys with their docs and the values the command line composes. Hydra composes the
config for ``--help`` as for ``--cfg job`` (``render``); nothing heavier is imported.
"""

from __future__ import annotations

import string
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ablate import config
from ablate.errors import AblateError
from ablate.overrides import Repository, schema_keys
from ablate.switches import BY_KEY

WIDTH = 100
# conf/local/ is this machine's; hydra's own groups: only those a user picks
SKIP_GROUPS = ("local",)
HYDRA_GROUPS = ("hydra/launcher", "hydra/sweeper")


def render(overrides: Sequence[str]) -> str:
    """The help text for a command line's ``overrides``: Hydra's help template as Hydra fills it,
    without the group listings Hydra computes for ``$APP_CONFIG_GROUPS`` and
    ``$HYDRA_CONFIG_GROUPS`` (a second, and unused here). A config that does not compose (a
    wrong type) is an ``AblateError`` with Hydra's reason."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register()
    try:
        template = config.compose(*overrides, hydra=True).hydra.help.template
    except (HydraException, OmegaConfBaseException) as exc:
        reasons = [str(e).strip().splitlines()[0] for e in (exc, exc.__cause__) if e and str(e)]
        raise AblateError(": ".join(reasons)) from None
    return string.Template(template).safe_substitute()


def register() -> None:
    """Register the ``ablate.help`` resolver the help template calls."""
    OmegaConf.register_new_resolver("ablate.help", section, replace=True)


def section(name: str, _root_: DictConfig) -> str:
    """The help section ``name`` (``groups``, ``keys``) for the composed config ``_root_``."""
    text = SECTIONS[name](_root_)
    return text.replace("$", "$$")  # Hydra reads the resolved template as a string.Template


def _repository(root: DictConfig) -> Repository:
    """The groups Hydra composed ``root`` from (its search path and ``hydra.searchpath``)."""
    from hydra.core.global_hydra import GlobalHydra

    given = [*root.hydra.overrides.hydra, *root.hydra.overrides.task]
    if GlobalHydra.instance().is_initialized():
        return Repository(GlobalHydra.instance().config_loader(), given)
    return Repository.for_command_line(given)


def _lines(head: str, doc: str, column: int) -> list[str]:
    """``head`` then ``doc`` wrapped in a column (on the next line when ``head`` is wider)."""
    if not doc:
        return [head]
    body = textwrap.wrap(doc, WIDTH - column) or [""]
    pad = " " * column
    if len(head) < column - 1:
        return [head.ljust(column) + body[0], *(pad + b for b in body[1:])]
    return [head, *(pad + b for b in body)]


def groups(root: DictConfig) -> str:
    """Every config group with its options, a line each; ``*`` marks the one composed now."""
    repo = _repository(root)
    choices = root.hydra.runtime.choices
    names = [g for g in repo.groups() if not g.startswith("hydra") and g not in SKIP_GROUPS]
    options = {g: repo.options(g) for g in names}
    column = 4 + max((len(o) for opts in options.values() for o in opts), default=0) + 2
    lines = []
    for group in names:
        lines.append(f"{group}=")
        for option in options[group]:
            mark = "*" if choices.get(group) == option else " "
            lines += _lines(f"  {mark} {option}", repo.doc(group, option), column)
    for group in HYDRA_GROUPS:
        if repo.is_group(group):
            lines.append(f"{group}=  {', '.join(repo.options(group))}")
    return "\n".join(lines)


def shown(value: Any) -> str:
    """A value as the command line writes it; a non-empty dict or a long list as ``{...}``,
    ``[...]`` (no file lists, URLs or checksums)."""
    if isinstance(value, bool) or value is None:
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, dict):
        return "{...}" if value else "{}"
    if isinstance(value, list):
        flat = f"[{','.join(shown(v) for v in value)}]"
        return flat if len(flat) <= 24 else "[...]"
    return str(value)


def _value(tree: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def keys(root: DictConfig) -> str:
    """The schema's keys with their docs and composed values; speed switches by name."""
    tree = OmegaConf.to_container(root, resolve=False)
    assert isinstance(tree, dict)
    fields = schema_keys()
    plain = [k for k in fields if k not in BY_KEY]
    column = 38
    lines = []
    for key in plain:
        head = f"  {key}={shown(_value(tree, key))}"
        lines += _lines(head, fields[key].metadata.get("doc", ""), column)
    switches = ", ".join(f"{k}={shown(_value(tree, k))}" for k in fields if k in BY_KEY)
    lines.append("Speed switches (what each does: docs/speed.md):")
    lines += textwrap.wrap(switches, WIDTH, initial_indent="  ", subsequent_indent="  ")
    return "\n".join(lines)


SECTIONS: dict[str, Callable[[DictConfig], str]] = {"groups": groups, "keys": keys}
