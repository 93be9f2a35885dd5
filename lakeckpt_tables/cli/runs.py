"""``lakeckpt runs``: the runs registered in a catalog, across checkpoint roots."""

from __future__ import annotations

import argparse

from lakeckpt_tables.cli._output import add_output, emit

__all__ = ["register", "run"]


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--catalog", default=None, metavar="NAME",
                        help="pyiceberg catalog name or SQLAlchemy URI (default: the lakeckpt "
                        "catalog, embedded SQLite unless configured)")
    parser.add_argument("--status", choices=("running", "finished", "failed"), default=None,
                        help="only runs with this status")
    add_output(parser)


def run(args: argparse.Namespace) -> int:
    from lakeckpt_tables.audit.registry import PROPERTIES, registered_runs

    runs = [r for r in registered_runs(args.catalog)
            if args.status is None or r["status"] == args.status]
    columns = PROPERTIES if args.output != "table" else (
        "run_id", "experiment", "status", "latest_step", "best_step", "table_uri",
        "table_version", "ledger", "updated_at")
    emit(runs, args.output, columns=columns, title="runs", empty="no registered runs")
    return 0
