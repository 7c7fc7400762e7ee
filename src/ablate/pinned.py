"""Keys an option does not read: ``data=ewt data.treebank=UD_English-GUM`` would train EWT under a
run that logs, hashes and reports GUM, so it is refused before anything loads or is tracked.

A schema key declared ``option_input`` (``ablate.config.key``) is read by no code, only by the
options whose files interpolate it (``data=ud``: ``dir: ud/${.treebank}``); which options read it
is derived from their files, and every other option refuses it: ``fixed by`` one that sets it
itself, ``not read by`` one that does not.
The chosen options are those the command line picks (every value of a sweep), else the composed
defaults (an ``experiment`` preset's included). A ``freeze`` key that the chosen strategy ignores
is ``ablate.strategies.check_keys``'s to refuse: the strategies import torch, which must not load
before a job has set OpenMP's wait policy.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from typing import Any

from hydra.core.override_parser.types import Override, ValueType
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ablate import config
from ablate.errors import AblateError


def interpolated(text: str, group: str) -> set[str]:
    """The keys of ``group`` that ``text`` (an option file, or its node as YAML) interpolates:
    ``${.key}`` or ``${group.key}``."""
    return set(re.findall(rf"\$\{{\s*(?:\.|{re.escape(group)}\.)(\w+)", text))


# Compositions by search path, config name and overrides (read only: nodes are only read here).
_composed: dict[tuple[str | None, ...], DictConfig] = {}


class Choices:
    """The options a command line picks, and their groups' nodes as each option composes them
    (without the command line's keys of that group), from the ``overrides.Repository`` Hydra
    would compose from."""

    def __init__(self, repo: Any, parsed: list[Override], config_name: str):
        self.repo, self.config_name = repo, config_name
        # group choices and Hydra's own settings (a search path): what picks the options
        self.base = [
            o.input_line
            for o in parsed
            if not o.is_sweep_override()
            and (repo.is_group(o.key_or_group) or o.is_hydra_override())
        ]
        self.given = {o.key_or_group: o for o in parsed if repo.is_group(o.key_or_group)}

    def compose(self, *extra: str) -> DictConfig:
        """The config of the chosen options (and ``extra``), composed once per process: each
        keyed override asks for the defaults and its options' nodes again, at ~0.1 s each."""
        loader = self.repo.loader
        key = (str(loader.get_search_path()), self.config_name, *self.base, None, *extra)
        if key not in _composed:
            if len(_composed) >= 64:  # a test session's many command lines: memory stays flat
                _composed.clear()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # an unavailable search path: Hydra warns itself
                _composed[key] = loader.load_configuration(
                    self.config_name, [*self.base, *extra], run_mode=RunMode.RUN
                )
        return _composed[key]

    def of(self, group: str) -> list[str]:
        """The options of ``group`` the command line picks: its override's (every value of a
        sweep), else the composed default."""
        if group in self.given:
            return selected(self.given[group])
        choice = self.compose().hydra.runtime.choices.get(group)
        return [choice] if choice else []

    def node(self, group: str, option: str) -> DictConfig:
        """``group``'s node as ``option`` composes it, interpolations unresolved."""
        return self.compose(f"{group}={option}")[group]


def selected(o: Override) -> list[str]:
    """The options a group override selects; a glob or an empty choice selects no named one."""
    value = o.value()
    if value is None or o.value_type in (ValueType.GLOB_CHOICE_SWEEP, ValueType.INTERVAL_SWEEP):
        return []
    if o.is_discrete_sweep():
        return list(o.sweep_string_iterator())
    if isinstance(value, list):
        return [str(v) for v in value]
    return [str(value)]


def _readers(repo: Any, group: str, key: str) -> list[str]:
    """The options of ``group`` whose files interpolate ``key``."""
    return [o for o in repo.options(group) if key in interpolated(repo.text(group, o), group)]


def _problem(
    o: Override, group: str, key: str, option: str, node: DictConfig, readers: list[str]
) -> str:
    schema = config.GROUPS.get(group)
    default = getattr(schema(), key, None) if schema else None
    value = node.get(key)
    if value is not None and value != default:
        shown = OmegaConf.to_yaml(OmegaConf.create({key: value})).strip()
        where = f"is fixed by {group}={option} ({shown})"
    else:
        where = f"is not read by {group}={option}"
    use = " or ".join(f"{group}={r} {group}.{key}=..." for r in readers)
    return f"{o.input_line}: {group}.{key} {where}; to choose a {key}, use {use}"


def problems(repo: Any, parsed: list[Override], config_name: str) -> Iterator[str]:
    """One message per override of a key that a chosen option does not read."""
    keyed = [
        o
        for o in parsed
        if not o.is_delete()
        and "." in o.key_or_group
        and not o.is_hydra_override()
        and repo.is_group(o.key_or_group.partition(".")[0])
    ]
    choices = Choices(repo, parsed, config_name)
    inputs = config.flags("option_input")
    for o in keyed:
        group, _, rest = o.key_or_group.partition(".")
        key = rest.partition(".")[0]
        if not inputs.get(f"{group}.{key}") or not (readers := _readers(repo, group, key)):
            continue
        for option in choices.of(group):
            node = choices.node(group, option)
            if key not in interpolated(OmegaConf.to_yaml(node), group):
                yield _problem(o, group, key, option, node, readers)
                break


def check(repo: Any, parsed: list[Override], config_name: str) -> None:
    """Raise an ``AblateError`` naming every override of a key that a chosen option does not
    read (``problems``). A config Hydra cannot compose is left to Hydra's own message."""
    try:
        found = list(problems(repo, parsed, config_name))
    except (HydraException, OmegaConfBaseException):
        return
    if found:
        raise AblateError("; ".join(found))
