"""The command line of ``python -m ablate.train`` before Hydra sees it: a bad override is one
line and exit status 2 (``ablate.overrides``), ``--help`` is ablate's own (``ablate.helptext``)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ablate import helptext
from ablate.errors import AblateError
from ablate.overrides import CONFIG_NAME, check


def before_hydra(argv: Sequence[str]) -> None:
    """What ``python -m ablate.train ARGV`` does before Hydra: ``check`` its overrides (a bad one:
    one line on stderr, exit status 2) and answer ``--help`` (``ablate.helptext``)."""
    from hydra._internal.utils import get_args_parser

    helptext.register()  # the help template's resolver, for Hydra's own --help too
    args, _ = get_args_parser().parse_known_args(list(argv))
    if args.shell_completion or args.config_path:
        return  # another primary config folder: Hydra's own checks
    try:
        check(args.overrides, args.config_dir, args.config_name or CONFIG_NAME)
        if args.help and not (args.config_dir or args.config_name):
            print(helptext.render(args.overrides))
            raise SystemExit(0)
    except AblateError as exc:
        print(f"ablate: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def strict(app: Callable[..., Any]) -> Callable[..., Any]:
    """``app`` (a ``hydra.main`` function) that runs ``before_hydra`` on its command line first,
    before Hydra composes or a sweep opens its parent run. Called with a config, ``app`` runs as
    is."""

    @functools.wraps(app)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs:
            before_hydra(sys.argv[1:])
        return app(*args, **kwargs)

    return checked
