"""``lakeckpt checkpoints ROOT``: the committed checkpoints the ledger holds."""

from __future__ import annotations

import argparse
import json
from typing import Any

from lakeckpt_tables.ledger import CheckpointRecord, open_ledger

__all__ = ["register", "run"]


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("root", help="checkpoint root (its ledger is <root>/_ledger by default)")
    parser.add_argument("--run", default=None, help="only this run id")
    parser.add_argument("--ledger", default=None,
                        help="ledger spec: delta:<uri> or iceberg:<namespace.table>")
    parser.add_argument("--output", choices=("text", "json"), default="text")


def _row(record: CheckpointRecord) -> dict[str, Any]:
    return {
        "run_id": record.run_id,
        "step": record.step,
        "checkpoint_id": record.checkpoint_id,
        "committed_at": None if record.committed_at is None else record.committed_at.isoformat(),
        "world_size": record.world_size,
        "source": None if record.source is None else record.source.location,
        "source_version": record.source_version,
        "tags": list(record.tags),
        "model_location": record.model_location,
        "files": len(record.manifest),
        "bytes": sum(int(d["bytes"]) for d in record.manifest.values()),
        "parent_id": record.parent_id,
    }


def run(args: argparse.Namespace) -> int:
    ledger = open_ledger(args.ledger, root=args.root)
    rows = [_row(r) for r in ledger.checkpoints(args.run)]
    if args.output == "json":
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no committed checkpoints in {ledger.describe()}")
        return 0
    header = ("run_id", "step", "checkpoint_id", "committed_at", "world_size", "source_version",
              "tags", "bytes")
    table = [[str(r[h]) if h != "tags" else ",".join(r["tags"]) for h in header] for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    return 0
