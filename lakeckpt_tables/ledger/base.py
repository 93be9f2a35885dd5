"""The contract every ledger backend implements, and the logic the backends share.

NOTE [ ledger commit protocol ]
A checkpoint commit is check-then-commit, and both halves must refer to the same table
snapshot, or two committers of one run could both pass the check:

1. Refresh to the newest snapshot S and *settle* the checkpoint against the run's committed
   checkpoints in S: a retry of a committed (run, step, checkpoint id) returns the stored
   record; another checkpoint id at that step, or a step not after the run's last one, is a
   :class:`CommitConflictError`; otherwise the commit may proceed.
2. Commit the rows with a condition that fails if anything of the same run was committed after
   S (Delta: an app transaction ``lakeckpt:<run>``, which delta-rs's conflict checker refuses
   to rebase over a concurrent commit of the same app id; Iceberg: a table requirement checked
   by the catalog under its compare-and-swap). Concurrent commits of *other* runs or events are
   rebased by the table format and both land.
3. If the commit lost a race it certainly did not land: go back to 1, which now sees the
   winner and settles against it.

An error that leaves the outcome unknown becomes :class:`CommitStateUnknownError`; since
commits are idempotent, retrying the same commit is the way to find out.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc

from lakeckpt_tables.errors import CommitConflictError
from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.ledger.records import (
    CheckpointRecord,
    ConsumptionRecord,
    LedgerEvent,
    checkpoints_from_arrow,
)

__all__ = ["COMMIT_ATTEMPTS", "Ledger", "LedgerBase", "now_utc", "settle"]

COMMIT_ATTEMPTS = 5
"""How many times a commit that lost a race is settled and tried again before giving up."""


@runtime_checkable
class Ledger(Protocol):
    """A sidecar table of checkpoints, consumption and events, committed atomically."""

    def commit(
        self,
        checkpoint: CheckpointRecord,
        consumption: Sequence[ConsumptionRecord] = (),
        events: Sequence[LedgerEvent] = (),
    ) -> CheckpointRecord:
        """Commit a checkpoint with its consumption and events in one atomic commit.

        Args:
            checkpoint: the checkpoint; its ``committed_at`` is ignored and set by the ledger.
            consumption: rows consumed since the run's previous checkpoint.
            events: events to keep with the checkpoint.

        Returns:
            The committed record, with ``committed_at`` set. For a retry of a checkpoint
            already committed (same run, step and checkpoint id): the stored record, and
            nothing is written.

        Raises:
            CommitConflictError: the run already has another checkpoint at this step, or a
                later step, or a concurrent committer of the run won; nothing was written.
            CommitStateUnknownError: the commit may or may not have landed; retry it.
        """
        ...

    def checkpoints(self, run_id: str | None = None) -> list[CheckpointRecord]:
        """Committed checkpoints of one run, or of all runs, ordered by (run, step)."""
        ...

    def latest(self, run_id: str) -> CheckpointRecord | None:
        """The run's newest committed checkpoint, or None if it has none."""
        ...

    def record_events(self, run_id: str, events: Sequence[LedgerEvent]) -> None:
        """Commit events outside any checkpoint (checkpoint id ``""``, step -1)."""
        ...

    def to_arrow(self) -> pa.Table:
        """The whole ledger table, in :data:`LEDGER_SCHEMA`."""
        ...

    def consumption(
        self, run_id: str | None = None, checkpoint_id: str | None = None
    ) -> pa.Table:
        """Consumption rows, optionally of one run and/or checkpoint, in CONSUMPTION_COLUMNS."""
        ...

    def compact(self) -> None:
        """Maintenance: merge the small files that one commit per checkpoint leaves behind."""
        ...

    def describe(self) -> str:
        """Where the ledger lives, for error messages."""
        ...


class LedgerBase(abc.ABC):
    """Read side of a ledger, built on one backend primitive: a filtered read of the table.

    Also holds the lock that makes one ledger object safe to share between threads; separate
    objects (or processes) on the same table are kept apart by the table format's commits.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the ledger lives, for error messages."""

    @abc.abstractmethod
    def _scan(
        self,
        *,
        record: str | None = None,
        run_id: str | None = None,
        checkpoint_id: str | None = None,
    ) -> pa.Table:
        """Rows of the newest snapshot matching every filter given, in LEDGER_SCHEMA."""

    def checkpoints(self, run_id: str | None = None) -> list[CheckpointRecord]:
        """Committed checkpoints of one run, or of all runs, ordered by (run, step)."""
        with self._lock:
            rows = self._scan(record=s.RECORD_CHECKPOINT, run_id=run_id)
        return checkpoints_from_arrow(rows)

    def latest(self, run_id: str) -> CheckpointRecord | None:
        """The run's newest committed checkpoint, or None if it has none."""
        committed = self.checkpoints(run_id)
        return committed[-1] if committed else None

    def to_arrow(self) -> pa.Table:
        """The whole ledger table, in :data:`LEDGER_SCHEMA`."""
        with self._lock:
            return self._scan()

    def consumption(
        self, run_id: str | None = None, checkpoint_id: str | None = None
    ) -> pa.Table:
        """Consumption rows, optionally of one run and/or checkpoint, in CONSUMPTION_COLUMNS.

        Ordered by run, step, rank, worker, then reading position, so that contiguous ranges
        of one worker come out next to each other.
        """
        with self._lock:
            rows = self._scan(
                record=s.RECORD_CONSUMPTION, run_id=run_id, checkpoint_id=checkpoint_id
            )
        order = (s.RUN_ID, s.STEP, s.RANK, s.WORKER, s.SEGMENT, s.FILE, s.ROW_GROUP, s.ROW_START)
        return rows.select(list(s.CONSUMPTION_COLUMNS)).sort_by([(c, "ascending") for c in order])


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


def gave_up(location: str, new: CheckpointRecord) -> CommitConflictError:
    """The error for a commit that kept losing races without ever conflicting outright."""
    return CommitConflictError(
        f"ledger {location}: run {new.run_id!r} step {new.step} (checkpoint "
        f"{new.checkpoint_id!r}) lost {COMMIT_ATTEMPTS} commit races in a row; nothing of it "
        "was written"
    )


def equal_to(column: str, value: str | None) -> pc.Expression | None:
    """An Arrow equality filter, or None when there is nothing to filter on."""
    return None if value is None else pc.field(column) == value


def now_utc() -> datetime:
    """The commit timestamp: timezone-aware, microsecond precision like the column."""
    return datetime.now(UTC)
