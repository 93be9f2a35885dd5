"""``lakeckpt maintain TARGET``: compact the ledger (fewer, larger files; a log checkpoint)."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from lakeckpt_tables.cli._output import add_output, add_target, emit

if TYPE_CHECKING:
    from lakeckpt_tables.audit.target import LedgerSnapshot

__all__ = ["register", "run"]


def register(parser: argparse.ArgumentParser) -> None:
    add_target(parser)
    add_output(parser)


def _count(snapshot: LedgerSnapshot) -> int:
    """Rows of a ledger version; a Delta ledger's from its files' footers, not read whole."""
    if snapshot.dataset is not None:
        return int(snapshot.dataset.count_rows())
    return int(snapshot.rows.num_rows)


def run(args: argparse.Namespace) -> int:
    from lakeckpt_tables.audit.sources import ledger_options
    from lakeckpt_tables.audit.target import read_ledger
    from lakeckpt_tables.cli._ledger import existing_ledger
    from lakeckpt_tables.cli._options import storage_options

    options = storage_options(args)
    ledger = existing_ledger(args.target, args.catalog, options)
    catalog = getattr(ledger, "_catalog", None)
    delta = ledger_options(args.target, options)
    before = _count(read_ledger(args.target, catalog=catalog, storage_options=delta))
    started = time.perf_counter()
    ledger.compact()
    after = _count(read_ledger(args.target, catalog=catalog, storage_options=delta))
    emit([{"ledger": ledger.describe(), "rows_before": before, "rows_after": after,
           "seconds": round(time.perf_counter() - started, 3)}], args.output,
         title="compacted")
    return 0
