"""``lakeckpt sql TARGET "QUERY"``: any SQL over the ledger's views (DuckDB dialect)."""

from __future__ import annotations

import argparse

import duckdb

from lakeckpt_tables.cli._output import add_output, add_target, emit
from lakeckpt_tables.cli.progress import add_stale_after
from lakeckpt_tables.errors import AuditError

__all__ = ["register", "run"]


def register(parser: argparse.ArgumentParser) -> None:
    add_target(parser, sources=True)
    parser.add_argument("query", help="a DuckDB query over the views checkpoints, consumption, "
                        "progress, runs, events, recoveries, follow_lag (and the raw table "
                        "ledger); columns in catalog/README.md")
    add_stale_after(parser)
    add_output(parser)


def run(args: argparse.Namespace) -> int:
    from lakeckpt_tables.audit.views import connect
    from lakeckpt_tables.cli._options import source_catalog, storage_options

    con = connect(args.target, catalog=args.catalog, storage_options=storage_options(args),
                  source_catalog=source_catalog(args), stale_after=args.stale_after)
    try:
        result = con.sql(args.query)
    except duckdb.Error as e:
        raise AuditError(f"query failed: {e}") from e
    if result is None:
        return 0
    emit(result.to_arrow_table(), args.output)
    return 0
