"""The decisions a ledger makes from what it read: may a checkpoint be committed, which
records are retired or tagged, and the error for a commit whose outcome is unknown."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from lakeckpt_tables.errors import CommitConflictError, CommitStateUnknownError
from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.ledger.contract import EVENT_RETIRED, EVENT_TAG
from lakeckpt_tables.ledger.records import CheckpointRecord, DamagedRecord

__all__ = ["check_parent", "given_tags", "log_damaged", "now_utc", "outcome_unknown",
           "retired_ids", "settle", "tagged"]

log = logging.getLogger("lakeckpt_tables.ledger.base")

def check_parent(
    location: str, new: CheckpointRecord, committed: Sequence[CheckpointRecord]
) -> None:
    newest = max(committed, key=lambda c: c.step, default=None)
    newest_id = newest.checkpoint_id if newest is not None else None
    if new.parent_id != newest_id:
        where = "none" if newest is None else f"{newest_id!r} (step {newest.step})"
        raise CommitConflictError(
            f"ledger {location}: run {new.run_id!r} step {new.step} builds on checkpoint "
            f"{new.parent_id!r}, but the run's newest checkpoint is {where}: the run moved on "
            "without this job; restore the newest checkpoint, or continue under a new run id"
        )


def tagged(records: list[CheckpointRecord], events: pa.Table) -> list[CheckpointRecord]:
    """The records with the tags given after their commit (``lakeckpt tag``: ``tag`` events)
    added to those they were committed with."""
    given = given_tags(events)
    return [replace(r, tags=tuple(sorted(set(r.tags) | given[r.checkpoint_id])))
            if r.checkpoint_id in given else r for r in records]


def given_tags(events: pa.Table) -> dict[str, set[str]]:
    given: dict[str, set[str]] = {}
    for detail in events.filter(pc.field(s.EVENT) == EVENT_TAG)[s.DETAIL].to_pylist():
        d = json.loads(detail)
        given.setdefault(str(d["checkpoint_id"]), set()).add(str(d["tag"]))
    return given


def retired_ids(events: pa.Table) -> frozenset[str]:
    retired = events.filter(pc.field(s.EVENT) == EVENT_RETIRED)
    return frozenset(json.loads(d)["checkpoint_id"] for d in retired[s.DETAIL].to_pylist())


def log_damaged(location: str, damaged: Sequence[DamagedRecord]) -> None:
    for d in damaged:
        log.warning("ledger %s: a %s record of run %r step %d (checkpoint %r) fails its "
                    "checksum and is ignored", location, d.record, d.run_id, d.step,
                    d.checkpoint_id)


def settle(
    location: str, new: CheckpointRecord, committed: Sequence[CheckpointRecord]
) -> CheckpointRecord | None:
    """Decide what committing ``new`` means, given the run's committed checkpoints.

    Args:
        location: the ledger, for messages.
        new: the checkpoint about to be committed.
        committed: the run's committed checkpoints, in any order.

    Returns:
        The stored record if ``new`` is a retry of it; None if ``new`` may be committed.

    Raises:
        CommitConflictError: ``new`` conflicts with what is committed.
    """
    for stored in committed:
        if stored.step == new.step:
            if stored.checkpoint_id == new.checkpoint_id:
                return stored
            raise CommitConflictError(
                f"ledger {location}: run {new.run_id!r} step {new.step} is already committed "
                f"as checkpoint {stored.checkpoint_id!r}; refusing checkpoint "
                f"{new.checkpoint_id!r}"
            )
    last = max(committed, key=lambda c: c.step, default=None)
    if last is not None and new.step <= last.step:
        raise CommitConflictError(
            f"ledger {location}: run {new.run_id!r} step {new.step} (checkpoint "
            f"{new.checkpoint_id!r}) is not after the run's last committed step {last.step} "
            f"(checkpoint {last.checkpoint_id!r})"
        )
    return None


def outcome_unknown(
    location: str, run_id: str, checkpoint: CheckpointRecord | None, cause: Exception
) -> CommitStateUnknownError:
    """The error for a commit whose outcome nobody knows, saying how to find out."""
    if checkpoint is None:
        return CommitStateUnknownError(
            f"ledger {location}: the commit of events of run {run_id!r} may or may not have "
            f"landed ({cause}); look for them before recording them again"
        )
    return CommitStateUnknownError(
        f"ledger {location}: the commit of run {run_id!r} step {checkpoint.step} (checkpoint "
        f"{checkpoint.checkpoint_id!r}) may or may not have landed ({cause}); commit the same "
        "checkpoint again to find out"
    )


def now_utc() -> datetime:
    """The commit timestamp: timezone-aware, microsecond precision like the column."""
    return datetime.now(UTC)
