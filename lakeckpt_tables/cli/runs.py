"""``lakeckpt runs``: the runs registered in a catalog, across checkpoint roots.

The registry says what a run's process last reported (``running``, ``finished``, ``failed``);
a process killed without warning reports nothing. So a run the registry calls running is
checked against its ledger: ``stale`` when it stopped saving without finishing (its last
commit older than its save cadence allows, see ``--stale-after``), ``finished`` when it
consumed every pass it planned.
"""

from __future__ import annotations

import argparse
from typing import Any

from lakeckpt_tables.cli._output import add_output, emit
from lakeckpt_tables.cli.progress import add_stale_after
from lakeckpt_tables.errors import LakeckptError

__all__ = ["register", "run"]

STATES = ("running", "stale", "finished", "failed")
TABLE_COLUMNS = ("run_id", "parent", "experiment", "status", "latest_step", "best_step",
                 "last_commit_at", "table_uri", "table_version", "ledger", "updated_at")


def register(parser: argparse.ArgumentParser) -> None:
    from lakeckpt_tables.cli._options import add_storage_options

    parser.add_argument("--catalog", default=None, metavar="NAME|URI",
                        help="pyiceberg catalog name or SQLAlchemy URI (default: the lakeckpt "
                        "catalog, embedded SQLite unless configured)")
    parser.add_argument("--status", choices=STATES, default=None,
                        help="only runs with this status")
    add_stale_after(parser)
    add_storage_options(parser)
    add_output(parser)


def run(args: argparse.Namespace) -> int:
    from lakeckpt_tables.audit.registry import PROPERTIES, load_catalog, registered_runs
    from lakeckpt_tables.audit.views import stale_threshold

    stale_threshold(args.stale_after)  # a bad threshold fails before any ledger is read
    catalog = load_catalog(args.catalog)
    runs = registered_runs(catalog)
    states = _ledger_states(runs, catalog, args)
    for r in runs:
        found = states.get((r["ledger"], r["run_id"]))
        r["last_commit_at"] = found["last_commit_at"] if found else None
        r["registered_status"] = r["status"]
        if r["status"] == "running" and found is not None:
            r["status"] = found["state"]
    runs = [r for r in runs if args.status is None or r["status"] == args.status]
    runs = _as_tree(runs, indent=args.output == "table")
    columns = (*PROPERTIES, "registered_status", "last_commit_at") \
        if args.output != "table" else TABLE_COLUMNS
    emit(runs, args.output, columns=columns, title="runs", empty="no registered runs")
    return 0


def _as_tree(runs: list[dict[str, Any]], *, indent: bool) -> list[dict[str, Any]]:
    """Runs in tree order: each branched run (``parent`` ``<run>@<step>``) right after the run
    it came from in the same ledger, its id indented by depth for a table."""
    by_key = {(r["ledger"], r["run_id"]): r for r in runs}
    children: dict[Any, list[dict[str, Any]]] = {}
    roots = []
    for r in runs:
        parent = (r["ledger"], (r.get("parent") or "").rsplit("@", 1)[0])
        if parent in by_key and parent != (r["ledger"], r["run_id"]):
            children.setdefault(parent, []).append(r)
        else:
            roots.append(r)
    out: list[dict[str, Any]] = []
    shown: set[int] = set()

    def visit(r: dict[str, Any], depth: int) -> None:
        if id(r) in shown:
            return
        shown.add(id(r))
        out.append({**r, "run_id": "  " * (depth - 1) + "└ " + r["run_id"]}
                   if indent and depth else r)
        for child in children.get((r["ledger"], r["run_id"]), []):
            visit(child, depth + 1)

    for r in roots + runs:  # then any run a cycle of parents kept from the roots
        visit(r, 0)
    return out


def _ledger_states(runs: list[dict[str, Any]], catalog: Any,
                   args: argparse.Namespace) -> dict[tuple[str, str], dict[str, Any]]:
    """(ledger, run) -> the ``runs`` view's row, for runs the registry calls running."""
    import sys

    from lakeckpt_tables.audit.sources import ledger_options
    from lakeckpt_tables.audit.target import read_ledger
    from lakeckpt_tables.audit.views import connect_snapshots
    from lakeckpt_tables.cli._options import redact, secrets_of, storage_options

    options = storage_options(args)
    ledgers = sorted({r["ledger"] for r in runs if r["ledger"] and r["status"] == "running"})
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for ledger in ledgers:
        try:
            snapshot = read_ledger(ledger, catalog=catalog,
                                   storage_options=ledger_options(ledger, options))
            # the ledger alone: its 'round' events size the passes; no source table is opened
            con = connect_snapshots([snapshot], look_up_sources=False,
                                    stale_after=args.stale_after)
            rows = con.sql("SELECT run_id, state, last_commit_at FROM runs").to_arrow_table()
        except LakeckptError as e:
            # one unreadable ledger does not hide the others: its runs keep the registry's word
            print(f"lakeckpt runs: warning: {redact(str(e), secrets_of(args))}",
                  file=sys.stderr)
            continue
        for row in rows.to_pylist():
            out[(ledger, row["run_id"])] = row
    return out
