"""``python -m ablate.archive export|import``: a study's runs to a folder of files (plain text;
metrics and predictions gzipped) and back into any MLflow store. Every error is one line that
names the file or run and the fix."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ablate.archive import read
from ablate.errors import AblateError
from ablate.report.cli import add_filters
from ablate.report.load import MlflowException

_URI_HELP = "MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///<project>/mlflow.db)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ablate.archive", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    out = sub.add_parser(
        "export",
        help="write the runs a report covers (its filters), their sweeps and lr-study trials",
        description="Write the runs the report's filters select, their sweeps' parent runs and "
        "the lr-study trials their lrs came from, to an archive folder.",
    )
    out.add_argument("dir", type=Path, help="the archive folder (new, empty, or an archive)")
    out.add_argument("--uri", help=_URI_HELP)
    add_filters(out, "every run of the experiment")  # an archive holds what a report covers
    into = sub.add_parser(
        "import",
        help="load an archive into a store; twice adds nothing",
        description="Load an archive into an MLflow store (sqlite, a team server), each run "
        "once: runs it already holds are left as they are.",
    )
    into.add_argument("dir", type=Path, help="the archive folder")
    into.add_argument("--uri", help=_URI_HELP)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: export or import; one line per error, exit status 2."""
    from ablate.config import default_tracking_uri

    args = _parser().parse_args(argv)
    uri = args.uri or default_tracking_uri()
    try:
        if args.command == "export":
            from ablate.archive.export import export

            args.uri = uri
            counts = export(args, args.dir)
            what = ", ".join(
                f"{n} {role}{'s' if n != 1 else ''}" for role, n in sorted(counts.items())
            )
            print(f"archived {what} from {uri} to {args.dir}")
        else:
            from ablate.archive.import_ import import_archive

            archive = read(args.dir)
            created, ids = import_archive(archive, uri)
            print(
                f"imported {len(created)} of {len(ids)} runs from {args.dir} into {uri}; "
                f"{len(ids) - len(created)} were there already"
            )
    except (AblateError, MlflowException) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
