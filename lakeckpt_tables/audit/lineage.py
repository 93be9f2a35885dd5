"""A checkpoint's lineage: its parent, grandparent... within its run and, through a ``branch``
event, into the run it was branched from (NOTE [ branched runs ] in
``checkpoint/restore_policy.py``).

Two lineages, for two questions:
- the *model's* (:func:`lineage`): every checkpoint whose training the model carries, across
  branches whatever their reader did: what a model has seen (``rows(cumulative=True)``,
  models exposed to a row);
- the *reader's* (``reader_only=True``, :func:`reader_parent`): the checkpoints whose reader
  state a checkpoint's reader went on from, across branches whose reader ``"continued"``: the
  rows a checkpoint delivered (replayed from its reader parent's state) and exactly-once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc

from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.ledger.records import CheckpointRecord

__all__ = ["Branch", "branches_of", "lineage", "parent_of", "reader_parent"]

EVENT_BRANCH = "branch"  # the checkpoint package's name for it (restore_policy.EVENT_BRANCH)


@dataclass(frozen=True)
class Branch:
    """Where a branched run came from (its ``branch`` event)."""

    run_id: str
    parent_run: str
    parent_checkpoint_id: str
    parent_step: int
    continued: bool
    """Its reader went on from the parent's reader state."""


def branches_of(snapshot: Any) -> dict[str, Branch]:
    """Each branched run's branch (its newest ``branch`` event), from a ledger snapshot."""
    rows = snapshot.scan((pc.field(s.RECORD) == s.RECORD_EVENT)
                         & (pc.field(s.EVENT) == EVENT_BRANCH),
                         [s.RUN_ID, s.COMMITTED_AT, s.DETAIL])
    out: dict[str, Branch] = {}
    for row in rows.sort_by(s.COMMITTED_AT).to_pylist():
        d = json.loads(row[s.DETAIL])
        out[row[s.RUN_ID]] = Branch(row[s.RUN_ID], d["parent_run"], d["parent_checkpoint_id"],
                                    int(d["parent_step"]), d.get("reader") == "continued")
    return out


def lineage(records: list[CheckpointRecord], record: CheckpointRecord,
            branches: dict[str, Branch] | None = None, *,
            reader_only: bool = False) -> list[CheckpointRecord]:
    """``record``, its parent, grandparent... (newest first), within its run and through the
    branches given into the runs they came from (with ``reader_only``: only branches whose
    reader continued)."""
    by_id = {r.checkpoint_id: r for r in records}
    chain = [record]
    seen = {record.checkpoint_id}
    while (parent := parent_of(by_id, chain[-1], branches, reader_only=reader_only)) \
            is not None \
            and parent.checkpoint_id not in seen:
        chain.append(parent)
        seen.add(parent.checkpoint_id)
    return chain


def reader_parent(records: list[CheckpointRecord], record: CheckpointRecord,
                  branches: dict[str, Branch] | None = None) -> CheckpointRecord | None:
    """The checkpoint whose reader state ``record``'s reader went on from: its parent in its
    run, or for a branched run's first checkpoint the parent run's, if its reader continued."""
    return parent_of({r.checkpoint_id: r for r in records}, record, branches, reader_only=True)


def parent_of(by_id: dict[str, CheckpointRecord], record: CheckpointRecord,
              branches: dict[str, Branch] | None, *,
              reader_only: bool = False) -> CheckpointRecord | None:
    """``record``'s parent among ``by_id`` (checkpoint id -> record): in its run, or through
    its run's branch (with ``reader_only``: only a branch whose reader continued)."""
    if record.parent_id is not None:
        parent = by_id.get(record.parent_id)
        return parent if parent is not None and parent.run_id == record.run_id else None
    branch = (branches or {}).get(record.run_id)
    if branch is None or (reader_only and not branch.continued):
        return None
    return by_id.get(branch.parent_checkpoint_id)
