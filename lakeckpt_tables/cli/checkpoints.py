"""``lakeckpt checkpoints TARGET``: the checkpoints a ledger holds (retired ones with --all).

A committed checkpoint whose model files retention or gc removed is shown as ``removed``: it
cannot be restored any more (what it trained still counts in ``progress``).
"""

from __future__ import annotations

import argparse

from lakeckpt_tables.cli._output import add_output, add_target, emit

__all__ = ["register", "run"]

COLUMNS = ("run_id", "step", "checkpoint_id", "status", "tags", "world_size", "source_version",
           "rows", "committed_at")


def register(parser: argparse.ArgumentParser) -> None:
    add_target(parser)
    parser.add_argument("--run", default=None, help="only this run id")
    parser.add_argument("--all", action="store_true",
                        help="also retired and abandoned checkpoints (a restore skipped them, or "
                        "resumed from before them)")
    parser.add_argument("--ledger", default=None, help=argparse.SUPPRESS)  # older spelling
    add_output(parser)


def run(args: argparse.Namespace) -> int:
    from lakeckpt_tables.audit.views import connect
    from lakeckpt_tables.cli._options import storage_options

    con = connect(args.ledger or args.target, catalog=args.catalog,
                  storage_options=storage_options(args))
    where = ["TRUE"]
    params: dict[str, object] = {}
    if not args.all:
        where.append("status = 'committed'")
    if args.run is not None:
        where.append("run_id = $run")
        params["run"] = args.run
    # 'removed': committed, but its model files are gone (not restorable)
    sql = ("SELECT * REPLACE (CASE WHEN status = 'committed' AND removed_reason IS NOT NULL "
           "THEN 'removed' ELSE status END AS status), "
           "status = 'committed' AND removed_reason IS NULL AS restorable "
           f"FROM checkpoints WHERE {' AND '.join(where)} ORDER BY run_id, step")
    columns = (*COLUMNS, "restorable") if args.output == "table" else None
    emit(con.sql(sql, params=params or None).to_arrow_table(), args.output, columns=columns,
         title="checkpoints", empty="no committed checkpoints")
    return 0
