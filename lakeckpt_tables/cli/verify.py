"""``lakeckpt verify TARGET``: prove exactly-once from the ledger; exit 1 on a violation."""

from __future__ import annotations

import argparse
import sys

from lakeckpt_tables.cli._output import add_output, add_target, emit

__all__ = ["register", "run"]


def register(parser: argparse.ArgumentParser) -> None:
    add_target(parser)
    parser.add_argument("--run", default=None, help="only this run (default: every run)")
    parser.add_argument("--checkpoint", default=None, metavar="ID",
                        help="verify up to this checkpoint (default: each run's newest)")
    add_output(parser)


def run(args: argparse.Namespace) -> int:
    from lakeckpt_tables.audit.exactly_once import verify

    verdicts = verify(args.target, run=args.run, checkpoint=args.checkpoint,
                      catalog=args.catalog)
    rows = []
    for v in verdicts:
        row = v.to_json()
        row["first_violation"] = v.violations[0] if v.violations else None
        row["violations"] = len(v.violations)
        rows.append(row)
    columns = ("run_id", "step", "ok", "checkpoints", "records", "rows", "finished_passes",
               "violations", "first_violation")
    if args.output == "json":
        emit([v.to_json() for v in verdicts], "json")
    else:
        emit(rows, args.output, columns=columns, title="exactly-once")
    failed = [v for v in verdicts if not v.ok]
    if failed:
        print(f"FAILED: {failed[0].violations[0]}", file=sys.stderr)
        return 1
    return 0
