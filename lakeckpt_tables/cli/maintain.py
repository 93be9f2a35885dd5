"""``lakeckpt maintain TARGET``: compact the ledger (fewer, larger files; a log checkpoint)."""

from __future__ import annotations

import argparse
import time

from lakeckpt_tables.cli._output import add_output, add_target, emit

__all__ = ["register", "run"]


def register(parser: argparse.ArgumentParser) -> None:
    add_target(parser)
    add_output(parser)


def run(args: argparse.Namespace) -> int:
    from lakeckpt_tables.audit._target import read_ledger
    from lakeckpt_tables.cli._ledger import existing_ledger

    ledger = existing_ledger(args.target, args.catalog)
    before = read_ledger(ledger)
    started = time.perf_counter()
    ledger.compact()
    after = read_ledger(ledger)
    emit([{"ledger": ledger.describe(), "rows_before": before.rows.num_rows,
           "rows_after": after.rows.num_rows,
           "seconds": round(time.perf_counter() - started, 3)}], args.output,
         title="compacted")
    return 0
