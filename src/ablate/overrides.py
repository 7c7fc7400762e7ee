"""Strict command lines: every override names a key of the schema or an option that exists.

Hydra's ``+key=value`` adds any key, so ``+trainer.lrr=1e-4`` would train at the default lr under
a run named for an lr it never used. ``check`` reads a command line's overrides the way Hydra
will (its parser, its search path: ``conf/``, ``--config-dir``, ``hydra.searchpath``, search path
plugins) before Hydra composes anything or a sweep opens its parent run. A key outside the schema
(``ablate.config``, extension switches included), with ``+`` or without, and an option that no
config group holds (every value of a sweep) are one ``AblateError`` line naming the closest allowed
names (difflib) and the allowed ones. Only keys under a dict or list key (``tracking.tags``,
``model.config_overrides``, ``data.splits``, ...) are free.

Only Hydra, OmegaConf and the schema are imported here, so errors answer at once.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from hydra.core.object_type import ObjectType
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, ValueType
from hydra.errors import HydraException
from omegaconf import MISSING, OmegaConf, ValidationError

from ablate import config, pinned
from ablate.errors import AblateError
from ablate.pinned import selected

CONFIG_NAME = "train"
HELP = "python -m ablate.train --help"


class Repository:
    """The config groups and options Hydra finds for a command line's overrides (with their
    ``hydra.searchpath``), from a Hydra config loader."""

    def __init__(self, loader: Any, overrides: Sequence[str], config_name: str = CONFIG_NAME):
        self.loader = loader  # composes a command line from the same search path
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an unavailable search path: Hydra warns itself
            _, self.repo = loader._parse_overrides_and_create_caching_repo(
                config_name, list(overrides)
            )

    @classmethod
    def for_command_line(
        cls,
        overrides: Sequence[str],
        config_dir: str | None = None,
        config_name: str = CONFIG_NAME,
    ) -> Repository:
        """The repository ``python -m ablate.train`` composes from, as Hydra builds it."""
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from hydra._internal.utils import create_config_search_path
        from hydra.core.config_search_path import SearchPathQuery

        search_path = create_config_search_path(str(config.conf_dir()))
        if config_dir and os.path.isdir(config_dir):
            search_path.prepend(
                provider="command-line",
                path=f"file://{os.path.abspath(config_dir)}",
                anchor=SearchPathQuery(provider="schema"),
            )
        return cls(ConfigLoaderImpl(config_search_path=search_path), overrides, config_name)

    def is_group(self, name: str) -> bool:
        """Whether ``name`` (``freeze``, ``hydra/launcher``) is a config group."""
        return self.repo.group_exists(name)

    def options(self, group: str) -> list[str]:
        """The options of ``group``, over every source of the search path."""
        return sorted(self.repo.get_group_options(group, ObjectType.CONFIG))

    def groups(self, parent: str = "") -> list[str]:
        """Every config group under ``parent`` that holds options, nested ones included."""
        found = []
        for name in self.repo.get_group_options(parent, ObjectType.GROUP):
            group = f"{parent}/{name}" if parent else name
            if self.options(group):
                found.append(group)
            found += self.groups(group)
        return sorted(found)

    def text(self, group: str, option: str) -> str:
        """An option file's text, from the first source that holds it ("": none, or not a file)."""
        path = f"{group}/{option}"
        for source in self.repo.get_sources():
            if source.is_config(path):
                return _source_text(source, f"{path}.yaml") or ""
        return ""

    def doc(self, group: str, option: str) -> str:
        """An option's one-line description: its file's first comment line, else its ``name``."""
        path = f"{group}/{option}"
        for source in self.repo.get_sources():
            if not source.is_config(path):
                continue
            if (text := _source_text(source, f"{path}.yaml")) and (line := first_comment(text)):
                return line
            loaded = source.load_config(path).config
            name = loaded.get("name") if hasattr(loaded, "get") else None
            return f"name: {name}" if isinstance(name, str) and "${" not in name else ""
        return ""


def first_comment(text: str) -> str:
    """The first comment line of a YAML file, ``# @package`` headers aside."""
    for line in text.splitlines():
        if line.startswith("#") and not re.match(r"#\s*@", line):
            return line.lstrip("# ").strip()
    return ""


def _source_text(source: Any, path: str) -> str | None:
    """The raw text of ``path`` in a file or package config source (None: another kind)."""
    try:
        if source.scheme() == "file":
            return (Path(source.path) / path).read_text(encoding="utf-8")
        if source.scheme() == "pkg":
            return resources.files(source.path).joinpath(path).read_text(encoding="utf-8")
    except (OSError, ModuleNotFoundError):
        pass
    return None


def schema_keys() -> dict[str, dataclasses.Field]:
    """Every leaf key of the schema by dotted name (extension switches included)."""
    return dict(config.schema_keys())


def _is_container(f: dataclasses.Field) -> bool:
    return re.search(r"\b(dict|list|Dict|List)\b", str(f.type)) is not None


def is_key(key: str, keys: dict[str, dataclasses.Field]) -> bool:
    """Whether ``key`` is a schema key, a group's node, or lies under a dict or list key."""
    if key in keys or key in config.GROUPS:
        return True
    parts = key.split(".")
    prefixes = (".".join(parts[:i]) for i in range(1, len(parts)))
    return any(p in keys and _is_container(keys[p]) for p in prefixes)


def guess(word: str, allowed: Sequence[str], prefix: str = "") -> str:
    """`` did you mean 'x'?`` (or 'x' or 'y'), the closest of ``allowed`` (each shown after
    ``prefix``), or nothing."""
    close = difflib.get_close_matches(word, allowed, n=3)
    if close:  # the best, and those nearly as close
        score = [difflib.SequenceMatcher(None, word, c).ratio() for c in close]
        close = [c for c, s in zip(close, score, strict=True) if s >= score[0] - 0.1]
    return f" did you mean {' or '.join(repr(prefix + c) for c in close)}?" if close else ""


def as_job_sees(given: Sequence[str]) -> list[str]:
    """``given`` as Hydra's basic sweeper hands them to a job (``trainer.lr=0.003`` for
    ``trainer.lr=3e-3``), so a run and a multirun's job name one value alike."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(given))
    except HydraException:
        return list(given)
    return [
        o.input_line
        if o.is_sweep_override() or o.is_delete()
        else f"{o.get_key_element()}={o.get_value_element_as_str()}"
        for o in parsed
    ]


def sweep_jobs(
    params: Mapping[str, Any] | None, given: Sequence[str], loader: Any = None
) -> list[list[str]]:
    """The overrides of each job of a ``--multirun`` as Hydra's basic sweeper expands them, in its
    order (its job numbers): the sweeper's ``params`` (a preset's grid), then ``given`` (the
    command line's overrides of the job config). A sweep it cannot expand (an interval; a glob of
    options without the config ``loader``) raises Hydra's ``HydraException``."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    listed = [f"{k}={v}" for k, v in (params or {}).items()]
    parsed = OverridesParser.create(config_loader=loader).parse_overrides([*listed, *given])
    (jobs,) = BasicSweeper.split_arguments(parsed, None)
    return jobs


def _option_problem(o: Override, repo: Repository) -> str | None:
    group = o.key_or_group
    options = repo.options(group)
    bad = [v for v in selected(o) if v not in options]
    if not bad:
        return None
    return (
        f"{o.input_line}: {group} has no option {bad[0]!r};{guess(bad[0], options)} "
        f"Available options in '{group}': {', '.join(options)}"
    )


def _key_problem(o: Override, repo: Repository, keys: dict[str, dataclasses.Field]) -> str | None:
    key = o.key_or_group
    if "/" in key:  # a group path that names no group
        groups = repo.groups()
        return (
            f"{o.input_line}: no config group {key!r};{guess(key, groups)} "
            f"Groups: {', '.join(groups)}"
        )
    if o.is_hydra_override():
        return None  # Hydra's own schema checks its keys
    if is_key(key, keys):
        return None
    node, _, leaf = key.partition(".")
    if node in config.GROUPS:
        fields = [k.removeprefix(f"{node}.") for k in keys if k.startswith(f"{node}.")]
        return (
            f"{o.input_line}: {node} has no key {leaf!r};{guess(leaf, fields, f'{node}.')} "
            f"Keys of {node}: {', '.join(fields)} ({HELP})"
        )
    groups = [g for g in repo.groups() if "/" not in g and g != "local"]
    top = sorted({k.split(".")[0] for k in keys} | set(groups))
    return (
        f"{o.input_line}: {key!r} is no config key;{guess(key, sorted({*keys, *top}))} "
        f"Top-level keys and groups: {', '.join(top)} ({HELP})"
    )


def disallowed(f: dataclasses.Field, value: Any) -> str | None:
    """What a schema key allows, in words, where ``value`` (of the key's type) is not allowed
    (``config.key``'s ``allowed``: ``trainer.lr`` a positive number); else None. Null passes: the
    type says whether the key takes it."""
    rule = f.metadata.get("allowed")
    return rule[1] if rule and value is not None and not rule[0](value) else None


def _default_example(key: str, f: dataclasses.Field) -> str:
    default = config.key_default(f)
    return "" if default is None or default == MISSING else f"; e.g. {key}={default}, the default"


def check_values(cfg: Any) -> None:
    """Raise an ``AblateError`` naming every key of a composed config whose value its key does
    not allow (``disallowed``): one an option's file or ``conf/local`` sets, or an interpolation,
    where the check of the command line (``check``) does not look."""
    found = []
    for key, f in schema_keys().items():
        if f.metadata.get("allowed") is None:
            continue
        value = OmegaConf.select(cfg, key, default=None)
        if words := disallowed(f, value):
            found.append(f"{key}={value}: must be {words}{_default_example(key, f)}")
    if found:
        raise AblateError("; ".join(found))


_TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}


def _value_problem(o: Override, keys: dict[str, dataclasses.Field]) -> str | None:
    """A value the key's type in the schema cannot hold (``trainer.lr=abc``, ``seed=null``) or
    the key does not allow (``trainer.lr=0``: ``disallowed``), each value of a sweep checked, as
    one line: Hydra's own says it in five, or a job after its imports."""
    key = o.key_or_group
    f = keys.get(key)
    if f is None or _is_container(f) or o.is_delete() or o.value_type in (
        ValueType.INTERVAL_SWEEP, ValueType.GLOB_CHOICE_SWEEP,
    ):  # fmt: skip
        return None
    node, _, leaf = key.rpartition(".")
    schema = config.GROUPS[node] if node else config.TrainConfig
    values = list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
    for value in values:
        if isinstance(value, str) and "${" in value:
            continue  # an interpolation: resolved when the job composes
        said = "null" if value is None else repr(value)
        node = OmegaConf.structured(schema)
        try:
            node[leaf] = value
        except ValidationError:
            kind = getattr(f.type, "__name__", str(f.type))
            words = _TYPE_WORDS.get(kind.removesuffix(" | None"), kind)
            words += " or null" if kind.endswith("None") else ""
            return f"{o.input_line}: {key} takes {words}, not {said} ({HELP})"
        if words := disallowed(f, node[leaf]):  # as the key's type holds it: 0 -> 0.0
            return f"{o.input_line}: {key} must be {words}, not {said}{_default_example(key, f)}"
    return None


def check(
    overrides: Sequence[str], config_dir: str | None = None, config_name: str = CONFIG_NAME
) -> None:
    """Raise an ``AblateError`` naming every override of an unknown key or option, then every
    override of a key that a chosen option does not read (``ablate.pinned``).

    An override Hydra cannot parse, or a search path it refuses, is left to Hydra's own message.
    """
    config.register()  # an extension's switches are keys of the schema
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        repo = Repository.for_command_line(overrides, config_dir, config_name)
    except HydraException:
        return
    if found := _problems(parsed, repo):
        raise AblateError("; ".join(found))
    pinned.check(repo, parsed, config_name)


def _problems(parsed: Sequence[Override], repo: Repository) -> list[str]:
    """What is wrong with each override: an unknown option, key, or a value its key refuses."""
    problems, keys = [], schema_keys()
    for o in parsed:
        if repo.is_group(o.key_or_group):
            problems.append(_option_problem(o, repo))
        else:
            problems.append(_key_problem(o, repo, keys) or _value_problem(o, keys))
    return [p for p in problems if p]


def check_grid(params: Mapping[str, Any] | None, given: Sequence[str], repo: Repository) -> None:
    """Raise an ``AblateError`` naming every entry of a sweep's grid that a preset sets
    (``hydra.sweeper.params``) which ``check`` refuses on the command line; the keys the command
    line ``given`` sets are its own (they replace the grid's)."""
    here = {o.lstrip("+~").partition("=")[0] for o in given}
    lines = [f"{k}={v}" for k, v in (params or {}).items() if k not in here]
    try:
        parsed = OverridesParser.create().parse_overrides(lines)
    except HydraException:
        return  # Hydra's own message
    if found := _problems(parsed, repo):
        preset = [o for o in given if o.partition("=")[0] == "experiment"]
        where = f"the grid of {preset[0]}" if preset else "the sweep's grid"
        raise AblateError(f"{'; '.join(found)} (in {where}: hydra.sweeper.params)")
