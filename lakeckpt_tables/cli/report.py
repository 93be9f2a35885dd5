"""``lakeckpt report TARGET -o report.html``: one self-contained page for an auditor."""

from __future__ import annotations

import argparse

from lakeckpt_tables.cli._output import add_target
from lakeckpt_tables.cli.progress import add_stale_after

__all__ = ["register", "run"]


def register(parser: argparse.ArgumentParser) -> None:
    add_target(parser, sources=True)
    add_stale_after(parser)
    parser.add_argument("-o", "--out", required=True, metavar="FILE.html",
                        help="where to write the page")
    parser.add_argument("--title", default=None, help="page title (default: the target)")


def run(args: argparse.Namespace) -> int:
    from lakeckpt_tables.audit.report import render_report
    from lakeckpt_tables.audit.views import connect
    from lakeckpt_tables.cli._options import source_catalog, storage_options

    con = connect(args.target, catalog=args.catalog, storage_options=storage_options(args),
                  source_catalog=source_catalog(args), stale_after=args.stale_after)
    page = render_report(con, title=args.title or f"lakeckpt report: {args.target}")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(page)
    print(f"wrote {args.out}")
    return 0
