"""Studies first: before a sweep's jobs start, those whose strategy trains at the lr its own study
picked (``lr_study.freeze``, ``experiment=fair``) while that study holds no finished trial with
the job's settings are found all at once, and the sweep refuses in one error with the command
that runs their studies (``refuse_unstudied``)."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import shlex
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from ablate.errors import AblateError

# keys whose sweep may change which strategies train at a study's pick
_PICKERS = ("experiment", "lr_study")


def refuse_unstudied(sweep: DictConfig) -> None:
    """Raise one ``AblateError`` naming the strategies of the sweep's jobs (``sweep``: its
    config) that train at their lr study's pick while the study holds no finished trial with
    the job's settings, and the ``python -m ablate.lrstudy`` command that runs those studies
    (one per set of the jobs' other overrides). Only the store is read, in a process of its own
    (``_apart``); a sweep none of whose jobs trains at a study's pick costs nothing."""
    tuned = _tuned_jobs(sweep)
    if not tuned:
        return
    jobs = list(tuned.items())
    lacking = _apart(_lacking, [cfg for _, cfg in jobs])
    if not lacking:
        return
    commands: dict[tuple[str, ...], list[str]] = {}
    for i in lacking:
        overrides, cfg = jobs[i]
        options = commands.setdefault(_as_given(sweep, overrides), [])
        if cfg.freeze.name not in options:
            options.append(cfg.freeze.name)
    named = list(dict.fromkeys(n for options in commands.values() for n in options))
    cfg = jobs[lacking[0]][1]
    experiment = cfg.lr_study.experiment or cfg.tracking.experiment
    lines = [
        shlex.join(["python", "-m", "ablate.lrstudy", *rest, f"freeze={','.join(options)}"])
        for rest, options in commands.items()
    ]
    them = "its study holds" if len(named) == 1 else "their studies hold"
    raise AblateError(
        f"freeze={', '.join(named)}: these strategies train at the lr their own study picks "
        f"(lr_study.freeze), but {them} no finished trial with this sweep's settings "
        f"(experiment {experiment!r} in {cfg.tracking.uri}); nothing has run. Run the studies "
        f"first, then this sweep again: {'; '.join(lines)}"
    )


def _key(override: str) -> str:
    return override.lstrip("+~").partition("=")[0]


def _as_given(sweep: DictConfig, job: tuple[str, ...]) -> tuple[str, ...]:
    """A job's overrides for its study's command, seed and freeze option aside: the command
    line's as typed, a swept key's as this job has it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    aside = ("seed", "freeze")
    typed = [o for o in sweep.hydra.overrides.task if _key(o) not in aside]
    parsed = OverridesParser.create().parse_overrides(typed)  # as the sweep's grid parsed them
    swept = {_key(o.input_line) for o in parsed if o.is_sweep_override()}
    own = {_key(o): o for o in job if _key(o) not in aside}
    kept = [own.get(_key(o), o) if _key(o) in swept else o for o in typed]
    given = {_key(o) for o in typed}
    return (*kept, *(o for k, o in own.items() if k not in given))  # a preset's grid's own


def _tuned_jobs(sweep: DictConfig) -> dict[tuple[str, ...], DictConfig]:
    """The sweep's jobs whose strategy trains at its study's pick, composed, by their overrides
    (seeds aside: one study serves every seed)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ablate import config
    from ablate.overrides import sweep_jobs

    try:
        jobs = sweep_jobs(sweep.hydra.sweeper.get("params"), sweep.hydra.overrides.task)
    except HydraException:  # a grid only the sweep's loader expands: each job checks its own
        return {}
    values: dict[str, set[str]] = {}
    for job in jobs:
        for o in job:
            values.setdefault(_key(o), set()).add(o)
    swept = [k for k, v in values.items() if len(v) > 1]
    if not sweep.lr_study.freeze and not [k for k in swept if k.startswith(_PICKERS)]:
        return {}
    tuned: dict[tuple[str, ...], DictConfig] = {}
    for job in jobs:
        key = tuple(o for o in job if _key(o) != "seed")
        if key in tuned:
            continue
        try:
            cfg = config.compose(*key)
        except (HydraException, OmegaConfBaseException):
            continue  # Hydra says what is wrong with it when it composes the job
        if cfg.freeze.name in cfg.lr_study.freeze:
            tuned[key] = cfg
    return tuned


def _lacking(configs: list[DictConfig]) -> list[int]:
    """The indices of ``configs`` whose strategy's study holds no finished trial with their
    settings (``ablate.lrstudy.runs.tuned_lr``); a store that cannot be read is an error."""
    from mlflow.exceptions import MlflowException

    from ablate.lrstudy.runs import tuned_lr
    from ablate.tracking.store import absent, check_reachable

    lacking = []
    for i, cfg in enumerate(configs):
        uri = cfg.tracking.uri
        if absent(uri):  # no store yet: no study either, and none is made by asking
            lacking.append(i)
            continue
        if uri.startswith(("http://", "https://")):
            check_reachable(uri)  # in seconds, where MLflow's client retries for minutes
        try:
            tuned_lr(cfg, "")
        except AblateError as exc:
            if isinstance(exc.__cause__, MlflowException):
                raise  # the store, not the study
            lacking.append(i)
    return lacking


def _apart(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a forked process of its own where the platform forks: the store
    connections MLflow keeps for a process's life then stay out of the sweep's workers, which
    the sweep forks next (``ablate.workers``)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return fn(*args)
    with cf.ProcessPoolExecutor(1, multiprocessing.get_context("fork")) as pool:
        return pool.submit(fn, *args).result()
