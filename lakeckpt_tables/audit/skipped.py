"""Skipped batches in the audit: rows consumed without training (NOTE [ skipped batches ] in
``checkpoint/skip.py``), read back from the ledger's ``skipped`` events."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lakeckpt_tables.audit.target import LedgerSnapshot
from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.ledger.records import CheckpointRecord

__all__ = ["SKIP_EVENT", "skip_events", "skipped_records", "skipped_table", "state_after_skips"]

SKIP_EVENT = "skipped"


def skip_events(snapshot: LedgerSnapshot, run_id: str | None = None
                ) -> dict[str, list[dict[str, Any]]]:
    """The ``skipped`` events' details by the checkpoint that committed them, in the order
    the batches were skipped."""
    where = (pc.field(s.RECORD) == s.RECORD_EVENT) & (pc.field(s.EVENT) == SKIP_EVENT)
    if run_id is not None:
        where = where & (pc.field(s.RUN_ID) == run_id)
    out: dict[str, list[dict[str, Any]]] = {}
    table = snapshot.scan(where, [s.CHECKPOINT_ID, s.DETAIL])
    for checkpoint_id, detail in zip(table[s.CHECKPOINT_ID].to_pylist(),
                                     table[s.DETAIL].to_pylist(), strict=True):
        out.setdefault(checkpoint_id, []).append(json.loads(detail))
    for details in out.values():
        details.sort(key=lambda d: int(d.get("index", 0)))
    return out


def skipped_records(details: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The consumption records (the ledger's columns, as dicts) the skips hold."""
    return [dict(zip(d["columns"], row, strict=True)) for d in details for row in d["records"]]


def state_after_skips(snapshot: LedgerSnapshot, record: CheckpointRecord,
                      events: Mapping[str, list[dict[str, Any]]] | None = None
                      ) -> dict[str, Any] | None:
    """The merged reader state after the last batches skipped before ``record`` (what its
    training started from), or None when it skipped none."""
    from lakeckpt_tables.reader.state import decode_state

    details = (events if events is not None else skip_events(snapshot, record.run_id)).get(
        record.checkpoint_id)
    if not details or details[-1].get("state") is None:
        return None
    return decode_state(details[-1]["state"])


def skipped_table(details: list[dict[str, Any]]) -> pa.Table:
    """One row per skip: when, why, by whom, how much."""
    return pa.table({
        "after_step": pa.array([d.get("after_step") for d in details], pa.int64()),
        "resumed_from": pa.array([d.get("resumed_from") for d in details], pa.string()),
        "batches": pa.array([d["batches"] for d in details], pa.int64()),
        "rows": pa.array([d["rows"] for d in details], pa.int64()),
        "tokens": pa.array([d.get("tokens") for d in details], pa.int64()),
        "reason": pa.array([d["reason"] for d in details], pa.string()),
        "by": pa.array([d["by"] for d in details], pa.string()),
    })
