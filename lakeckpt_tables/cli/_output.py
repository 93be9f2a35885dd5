"""One way to print results: ``--output table|json|csv``, tables through rich.

Every read command builds a list of row dicts (or an Arrow table) and hands it here, so the
three formats show the same columns. JSON and CSV are meant for pipes: plain text, no colour,
one document.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa

__all__ = ["add_output", "add_target", "emit"]

FORMATS = ("table", "json", "csv")


def add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", choices=FORMATS, default="table",
                        help="table (default), json or csv")


def add_target(parser: argparse.ArgumentParser, *, sources: bool = False) -> None:
    """The target (a ledger), its catalog and storage options; with ``sources``, also where
    the runs' Iceberg source tables live (commands that open them)."""
    from lakeckpt_tables.cli._options import add_source_catalog, add_storage_options

    parser.add_argument("target", help="checkpoint root (its _ledger), 'delta:<uri>' or "
                        "'iceberg:<namespace.table>'")
    parser.add_argument("--catalog", default=None, metavar="NAME|URI",
                        help="pyiceberg catalog of an Iceberg ledger (default: the lakeckpt "
                        "catalog)")
    add_storage_options(parser)
    if sources:
        add_source_catalog(parser)


def emit(rows: Sequence[dict[str, Any]] | pa.Table, fmt: str, *, title: str | None = None,
         columns: Sequence[str] | None = None, empty: str = "nothing to show") -> None:
    """Print ``rows`` in format ``fmt``."""
    if isinstance(rows, pa.Table):
        columns = columns or rows.column_names
        rows = rows.to_pylist()
    rows = list(rows)
    if columns is None:
        columns = list(rows[0]) if rows else []
    if fmt == "json":
        print(json.dumps([{c: r.get(c) for c in columns} for r in rows], default=_json_default,
                         indent=2))
    elif fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        for r in rows:
            writer.writerow([_text(r.get(c), plain=True) for c in columns])
    else:
        _rich_table(rows, columns, title, empty)


def _rich_table(rows: list[dict[str, Any]], columns: Sequence[str], title: str | None,
                empty: str) -> None:
    from rich.console import Console
    from rich.table import Table

    # a pipe or a file gets whole lines rather than rich's default 80 columns
    console = Console(soft_wrap=False, width=None if sys.stdout.isatty() else 250)
    if not rows:
        console.print(f"{title + ': ' if title else ''}{empty}", highlight=False)
        return
    table = Table(title=title, title_justify="left", show_lines=False)
    for c in columns:
        table.add_column(c, overflow="fold")
    for r in rows:
        table.add_row(*[v if _is_renderable(v) else _text(v) for v in (r.get(c) for c in columns)])
    console.print(table)


def _is_renderable(value: Any) -> bool:
    return hasattr(value, "__rich_console__") or hasattr(value, "__rich__")


def _text(value: Any, *, plain: bool = False) -> str:
    """``value`` as a cell: never in scientific notation; for people (not ``plain``), rounded,
    with thousands separated."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    if isinstance(value, float):
        return _plain_float(value) if plain else _human_float(value)
    if isinstance(value, list | tuple):
        return ",".join(_text(v, plain=plain) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, default=_json_default)
    return str(value)


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if _is_renderable(value):
        return None
    return str(value)


def _human_float(value: float) -> str:
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 0.01 or value == 0:
        return f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{value:.6f}".rstrip("0").rstrip(".")


def _plain_float(value: float) -> str:
    text = repr(value)
    if "e" in text and value == value and abs(value) != float("inf"):
        text = f"{value:.20f}".rstrip("0").rstrip(".")
    return text
