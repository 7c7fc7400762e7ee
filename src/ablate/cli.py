"""The command line of ``python -m ablate.train`` before Hydra sees it: a bad override is one
line and exit status 2 (``ablate.overrides``), ``--help`` is ablate's own (``ablate.helptext``),
``--multirun --cfg job`` shows each job's config (``show_jobs``)."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ablate import helptext
from ablate.errors import AblateError
from ablate.overrides import (
    CONFIG_NAME,
    Repository,
    check,
    check_grid,
    check_values,
    sweep_jobs,
)

_COMMANDS = ("--run", "--multirun", "--cfg", "--info")  # Hydra takes one of them at a time


def _commands(args: argparse.Namespace) -> tuple[bool, ...]:
    return (args.run, args.multirun, args.cfg is not None, args.info is not None)


def before_hydra(argv: Sequence[str]) -> argparse.Namespace:
    """What ``python -m ablate.train ARGV`` does before Hydra: ``check`` its overrides (a bad one:
    one line on stderr, exit status 2) and answer ``--help`` (``ablate.helptext``); returns the
    command line as Hydra parses it."""
    from hydra._internal.utils import get_args_parser

    helptext.register()  # the help template's resolver, for Hydra's own --help too
    args, _ = get_args_parser().parse_known_args(list(argv))
    if args.shell_completion or args.config_path:
        return args  # another primary config folder: Hydra's own checks
    try:
        check(args.overrides, args.config_dir, args.config_name or CONFIG_NAME)
        if not (args.help or args.hydra_help or args.cfg or args.info):
            name = args.config_name or CONFIG_NAME
            check_composed(args.overrides, args.config_dir, name, args.multirun)
        given = [f for f, on in zip(_COMMANDS, _commands(args), strict=True) if on]
        if len(given) > 1 and given != ["--multirun", "--cfg"]:  # that one: show_jobs
            jobs = " (--multirun with --cfg shows each job's config)" if args.multirun else ""
            raise AblateError(f"{' and '.join(given)}: give one of them{jobs}")
        if args.help and not (args.config_dir or args.config_name):
            try:
                print(helptext.render(args.overrides), flush=True)
            except BrokenPipeError:  # --help | head: the reader has what it wanted
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(0)
    except AblateError as exc:
        _refuse(exc)
    return args


def _refuse(exc: AblateError) -> None:
    print(f"ablate: error: {exc}", file=sys.stderr)
    raise SystemExit(2) from None


def show_jobs(app: Callable[..., Any], args: argparse.Namespace) -> None:
    """``--multirun --cfg job`` (or ``hydra``, ``all``): each job's config as ``--cfg`` shows a
    single run's (Hydra's own, through ``app``), after a comment naming the job as the sweep's
    log will (``# job #0: trainer.lr=0.0001``). Only Hydra's basic sweeper (ablate's) tells its
    jobs before they run; another one is one line."""
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf.errors import OmegaConfBaseException

    name = args.config_name or CONFIG_NAME
    try:
        loader = Repository.for_command_line(args.overrides, args.config_dir, name).loader
        cfg = loader.load_configuration(name, args.overrides, run_mode=RunMode.MULTIRUN)
        sweeper = cfg.hydra.sweeper
        if not str(sweeper.get("_target_", "")).endswith(".BasicSweeper"):
            raise AblateError(
                f"--cfg with --multirun: hydra.sweeper {sweeper.get('_target_')} chooses its "
                "jobs as it runs; drop --multirun and give one value per key to see a job's config"
            )
        jobs = sweep_jobs(sweeper.get("params"), cfg.hydra.overrides.task, loader)
    except (HydraException, OmegaConfBaseException) as exc:
        raise AblateError(f"--cfg with --multirun: {exc}") from None
    flags = ["--cfg", args.cfg, *(["--package", args.package] if args.package else [])]
    flags += ["--resolve"] if args.resolve else []
    flags += ["--config-dir", args.config_dir] if args.config_dir else []
    flags += ["--config-name", args.config_name] if args.config_name else []
    hydra_given = list(cfg.hydra.overrides.hydra)  # as the launcher composes each job
    argv = sys.argv
    try:
        for i, job in enumerate(jobs):
            print(f"# job #{i}: {' '.join(job)}", flush=True)
            sys.argv = [argv[0], *hydra_given, *job, *flags]
            app()
            sys.stdout.flush()
    finally:
        sys.argv = argv


def check_composed(
    overrides: Sequence[str], config_dir: str | None, config_name: str, multirun: bool = False
) -> None:
    """Refuse a ``data.root`` that is not a folder, or an unpinned dataset's missing folder
    (``ablate.data.files.check_folders``), for every dataset the command line picks, a value
    that an option's file sets and its key does not allow (``ablate.overrides.check_values``),
    and with ``multirun`` an entry of a preset's grid that the command line's check would refuse
    (``ablate.overrides.check_grid``): in a second, where a job would find it after its imports
    (~10 s) and once per job of a sweep. A sweep over a ``data`` key leaves the check to each
    job; a config Hydra cannot compose, to Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf.errors import OmegaConfBaseException

    from ablate.data.files import check_folders

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        swept = [o for o in parsed if o.is_sweep_override()]
        if any(o.key_or_group.startswith("data.") for o in swept):
            return
        data = [o for o in swept if o.key_or_group == "data"]
        fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
        repo = Repository.for_command_line(overrides, config_dir, config_name)
        for choice in [f"data={v}" for o in data for v in o.sweep_string_iterator()] or [""]:
            given = [*fixed, choice] if choice else fixed
            cfg = repo.loader.load_configuration(config_name, given, run_mode=RunMode.RUN)
            if multirun:
                check_grid(cfg.hydra.sweeper.get("params"), overrides, repo)
            check_values(cfg)
            check_folders(cfg.data)
    except (HydraException, OmegaConfBaseException):
        return


def strict(app: Callable[..., Any]) -> Callable[..., Any]:
    """``app`` (a ``hydra.main`` function) that runs ``before_hydra`` on its command line first,
    before Hydra composes or a sweep opens its parent run. Called with a config, ``app`` runs as
    is."""

    @functools.wraps(app)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs:
            given = before_hydra(sys.argv[1:])
            if given.multirun and given.cfg and not given.config_path:
                try:
                    return show_jobs(app, given)
                except AblateError as exc:
                    _refuse(exc)
        return app(*args, **kwargs)

    return checked
