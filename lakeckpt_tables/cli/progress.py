"""``lakeckpt progress TARGET``: rows consumed per run and pass, with rate and ETA."""

from __future__ import annotations

import argparse
import time

from lakeckpt_tables.cli._output import add_output, add_target, emit

__all__ = ["register", "run"]

COLUMNS = ("run_id", "segment", "epoch", "done", "rows_consumed", "rows_in_pass", "percent",
           "rows_per_s", "eta_s", "last_step", "last_at")


def register(parser: argparse.ArgumentParser) -> None:
    add_target(parser)
    parser.add_argument("--run", default=None, help="only this run id")
    parser.add_argument("--watch", nargs="?", type=float, const=5.0, default=None,
                        metavar="SECONDS", help="show again every SECONDS (default 5) until "
                        "interrupted")
    parser.add_argument("--times", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--plot", default=None, metavar="FILE.png",
                        help="also draw rows consumed over time per run to a PNG")
    add_output(parser)


def run(args: argparse.Namespace) -> int:
    shown = 0
    while True:
        _show(args)
        shown += 1
        if args.watch is None or (args.times is not None and shown >= args.times):
            return 0
        time.sleep(args.watch)


def _show(args: argparse.Namespace) -> None:
    from lakeckpt_tables.audit.views import connect

    con = connect(args.target, catalog=args.catalog)
    params = {} if args.run is None else {"run": args.run}
    where = "" if args.run is None else "WHERE run_id = $run"
    table = con.sql(f"SELECT * FROM progress {where} ORDER BY run_id, segment, epoch",
                    params=params or None).to_arrow_table()
    if args.plot is not None:
        from lakeckpt_tables.audit.plot import plot_progress

        plot_progress(con, args.plot, run=args.run)
    if args.output != "table":
        emit(table, args.output)
        return
    from rich.progress_bar import ProgressBar

    rows = table.to_pylist()
    for r in rows:
        total, done = r["rows_in_pass"], r["rows_consumed"]
        r["done"] = ProgressBar(total=float(total), completed=float(done), width=20) \
            if total else None
    emit(rows, "table", columns=COLUMNS, title="progress", empty="no run has consumed rows")
