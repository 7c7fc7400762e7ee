"""``python -m ablate.tracking.replay <job folder> [--uri URI]``: log a run's record that a
tracking server missed (it was away longer than ``tracking.outage_min``), from the journal the
run left in its job folder; records already in the store are not sent again."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ablate.errors import AblateError
from ablate.tracking.journal import Journal
from ablate.tracking.store import check_reachable


def replay(folder: Path, uri: str | None = None) -> tuple[str, int]:
    """Send what the journal in ``folder`` holds and the store lacks; returns (run id, the
    number of records sent). The journal is removed once the run's end is in the store."""
    journal = Journal.reopen(folder, uri)
    check_reachable(journal.uri)
    count = journal.pending
    if not journal.flush():
        raise AblateError(f"tracking.uri={journal.uri}: the server went away again; run again")
    if journal.ended:
        journal.remove()
    return journal.run_id, count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ablate.tracking.replay",
        description="Log the record of a run that a tracking server missed (away longer than "
        "tracking.outage_min), from the journal the run left in its job folder; records already "
        "in the store are not sent again.",
    )
    parser.add_argument("folder", type=Path, help="the job folder (or its mlflow_journal/)")
    parser.add_argument("--uri", help="send to this store instead of the one the run used")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        run_id, count = replay(args.folder, args.uri)
    except AblateError as exc:
        print(f"ablate.tracking.replay: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"run {run_id}: {count} records sent")


if __name__ == "__main__":
    main()
