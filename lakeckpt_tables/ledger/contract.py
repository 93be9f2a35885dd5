"""What every ledger answers to: the :class:`Ledger` protocol, the run scan, event names.

See NOTE [ ledger commit protocol ] in :mod:`lakeckpt_tables.ledger.base` for how commits keep
their promises, and NOTE [ retired and damaged records ] for what a scan leaves out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from lakeckpt_tables.ledger.records import (
    CheckpointRecord,
    ConsumptionRecord,
    DamagedRecord,
    LedgerEvent,
)
from lakeckpt_tables.ledger.spec import LedgerSpec

__all__ = ["COMMIT_ATTEMPTS", "EVENT_RETIRED", "EVENT_TAG", "Ledger", "RunScan"]

EVENT_RETIRED = "retired"
"""Event retiring a checkpoint: ``{"checkpoint_id", "step", "reason"}``."""

EVENT_TAG = "tag"
"""Event tagging a committed checkpoint (``lakeckpt tag``): ``{"checkpoint_id", "step", "tag"}``.
Checkpoint rows are immutable, so tags given later live here; reads add them to the record's."""

COMMIT_ATTEMPTS = 5
"""How many times a commit that lost a race is settled and tried again before giving up."""


@dataclass(frozen=True)
class RunScan:
    """What the ledger holds of one run's checkpoints, read from one snapshot.

    Attributes:
        committed: intact checkpoints that are not retired, oldest first.
        retired: ids of retired checkpoints.
        damaged: checkpoint rows (and retirements) whose checksum fails.
    """

    committed: list[CheckpointRecord]
    retired: frozenset[str]
    damaged: list[DamagedRecord]


class Ledger(Protocol):
    """A sidecar table of checkpoints, consumption and events, committed atomically."""

    def commit(
        self,
        checkpoint: CheckpointRecord,
        consumption: Sequence[ConsumptionRecord] = (),
        events: Sequence[LedgerEvent] = (),
        *,
        owner: str | None = None,
    ) -> CheckpointRecord:
        """Commit a checkpoint with its consumption and events in one atomic commit.

        Args:
            checkpoint: the checkpoint; its ``committed_at`` is ignored and set by the ledger.
            consumption: rows consumed since the run's previous checkpoint.
            events: events to keep with the checkpoint.
            owner: the committing job's token: if given, the commit lands only if that job
                still owns the run and the checkpoint's parent is the run's newest
                (NOTE [ one writer per run ]).

        Returns:
            The committed record, with ``committed_at`` set. For a retry of a checkpoint
            already committed (same run, step and checkpoint id): the stored record, and
            nothing is written.

        Raises:
            CommitConflictError: the run already has another checkpoint at this step, or a
                later step, or a concurrent committer of the run won; nothing was written.
            RunFencedError: another job owns the run now; nothing was written.
            CommitStateUnknownError: the commit may or may not have landed; retry it.
        """
        ...

    def claim(
        self,
        run_id: str,
        owner: str,
        events: Sequence[LedgerEvent] = (),
        *,
        head: str | None = None,
        check_head: bool = True,
    ) -> None:
        """Make ``owner`` the run's one writer, recording ``events`` in the same commit; it
        lands only while ``head`` is the run's newest checkpoint (unless not ``check_head``)."""
        ...

    def scan(self, run_id: str) -> RunScan:
        """The run's committed, retired and damaged checkpoints, from the newest snapshot."""
        ...

    def tags(self, run_id: str) -> dict[str, tuple[str, ...]]:
        """Tags given to the run's checkpoints after their commit (``tag`` events), by
        checkpoint id, from the newest snapshot."""
        ...

    def owner(self, run_id: str) -> str | None:
        """The job that owns the run, or None if no job claimed it."""
        ...

    def checkpoints(self, run_id: str | None = None) -> list[CheckpointRecord]:
        """Committed (intact, not retired) checkpoints of one run or of all runs, ordered by
        (run, step)."""
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

    def consumption(self, run_id: str | None = None, checkpoint_id: str | None = None) -> pa.Table:
        """Consumption rows, optionally of one run and/or checkpoint, in CONSUMPTION_COLUMNS."""
        ...

    def compact(self) -> None:
        """Maintenance: merge the small files that one commit per checkpoint leaves behind."""
        ...

    def describe(self) -> str:
        """Where the ledger lives, for error messages."""
        ...

    @property
    def spec(self) -> LedgerSpec:
        """Where the ledger lives, as a value (what the run registry records)."""
        ...

    def repair_missing(self) -> list[str]:
        """Drop the data files that no longer exist from the table (their records are lost)
        and return them; the way out of a :class:`LedgerCorruptError` for a missing file."""
        ...
