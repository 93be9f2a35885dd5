"""``lakeckpt progress TARGET``: rows (and a packed reader's tokens) consumed per run (and
Mixture source, with its share) and pass, with rate and ETA.

A pass's ``state`` is ``done``, or its run's: ``running``, ``stale`` (the run stopped saving
without finishing: killed, hung) or ``finished``; only a running pass has an ETA.
"""

from __future__ import annotations

import argparse
import time

from lakeckpt_tables.cli._output import add_output, add_target, emit

__all__ = ["STALE_HELP", "add_stale_after", "register", "run"]

COLUMNS = ("run_id", "segment", "epoch", "state", "done", "rows_consumed", "rows_in_pass",
           "percent", "rows_per_s", "eta_s", "last_step", "last_at")

STALE_HELP = ("when a run that stopped saving is shown 'stale': a multiple of its median save "
              "interval (e.g. 5x) or a duration (e.g. 600, 90s, 10m, 2h); default: 3 times the "
              "interval and at least 1 minute")


def add_stale_after(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stale-after", default=None, metavar="Nx|SECONDS", help=STALE_HELP)


def _interval(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return seconds


def register(parser: argparse.ArgumentParser) -> None:
    add_target(parser, sources=True)
    parser.add_argument("--run", default=None, help="only this run id")
    add_stale_after(parser)
    parser.add_argument("--watch", nargs="?", type=_interval, const=5.0, default=None,
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
    from lakeckpt_tables.cli._options import source_catalog, storage_options

    con = connect(args.target, catalog=args.catalog, storage_options=storage_options(args),
                  source_catalog=source_catalog(args), stale_after=args.stale_after)
    params = {} if args.run is None else {"run": args.run}
    where = "" if args.run is None else "WHERE run_id = $run"
    table = con.sql(f"SELECT * FROM progress {where} ORDER BY run_id, source_key NULLS FIRST, "
                    "segment, epoch", params=params or None).to_arrow_table()
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
    columns: tuple[str, ...] = COLUMNS
    if any(r["tokens_consumed"] is not None for r in rows):  # packed: tokens too
        columns = (*columns[:6], "tokens_consumed", *columns[6:])
    if any(r["source_key"] is not None for r in rows):  # a Mixture run: a row per source
        columns = (columns[0], "source_key", "share", *columns[1:])
    emit(rows, "table", columns=columns, title="progress", empty="no run has consumed rows")
