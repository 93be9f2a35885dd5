"""The read side every ledger backend shares: scans, checkpoints, tags, owner, consumption.

Each read refreshes to the newest snapshot once and reads that one snapshot, under the
ledger object's lock (NOTE [ retired and damaged records ] in
:mod:`lakeckpt_tables.ledger.base` says what a scan leaves out).
"""

from __future__ import annotations

import abc
import functools
import json
import operator
import threading
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from lakeckpt_tables.errors import LedgerCorruptError
from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.ledger.contract import RunScan
from lakeckpt_tables.ledger.records import (
    CheckpointRecord,
    LedgerEvent,
    checkpoints_from_arrow,
    intact_rows,
)
from lakeckpt_tables.ledger.settling import given_tags, log_damaged, retired_ids, tagged

__all__ = ["LedgerReads"]

class LedgerReads(abc.ABC):
    """The ledger contract's reads, on three backend primitives (refresh, read, owner)."""

    _lock: threading.RLock

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the ledger lives, for error messages."""

    @abc.abstractmethod
    def _refresh(self) -> None:
        """Move the table handle to the newest snapshot."""

    @abc.abstractmethod
    def _select(self, equal: Mapping[str, str]) -> pa.Table:
        """Rows of the handle's snapshot (no refresh) whose columns hold these values, in
        :data:`LEDGER_SCHEMA`.

        Raises:
            LedgerCorruptError: a data file of the ledger is missing or unreadable.
        """

    @abc.abstractmethod
    def _event_rows(self) -> pa.Table:
        """Every event row of the handle's snapshot (no refresh), reading only what was
        committed since the last call (NOTE [ event rows kept ] in ``ledger/delta_files.py``).

        Raises:
            LedgerCorruptError: a data file of the ledger is missing or unreadable.
        """

    def _read(self, *, record: str | None = None, run_id: str | None = None,
              checkpoint_id: str | None = None) -> pa.Table:
        """Rows of the handle's snapshot (no refresh) matching every filter given."""
        wanted = {s.RECORD: record, s.RUN_ID: run_id, s.CHECKPOINT_ID: checkpoint_id}
        equal = {name: v for name, v in wanted.items() if v is not None}
        if record == s.RECORD_EVENT:
            return self._event_rows().filter(functools.reduce(
                operator.and_, [pc.field(name) == v for name, v in equal.items()]))
        return self._select(equal)

    @abc.abstractmethod
    def _owner(self, run_id: str) -> str | None:
        """The run's owner in the handle's snapshot; None if no job claimed it."""

    # -- the contract's reads ------------------------------------------------------------

    def tags(self, run_id: str) -> dict[str, tuple[str, ...]]:
        """Tags given to the run's checkpoints after their commit (``tag`` events), by
        checkpoint id, from the newest snapshot: what retention must see even when another
        process (``lakeckpt tag``) gave them while this job runs."""
        with self._lock:
            self._refresh()
            events, _ = intact_rows(self._read(record=s.RECORD_EVENT, run_id=run_id))
        return {c: tuple(sorted(t)) for c, t in given_tags(events).items()}

    def events(self, run_id: str, event: str) -> list[LedgerEvent]:
        """The run's intact events of kind ``event``, oldest first, from the newest snapshot
        (e.g. its ``branch`` event: where the run came from)."""
        with self._lock:
            self._refresh()
            rows, _ = intact_rows(self._read(record=s.RECORD_EVENT, run_id=run_id))
        found = rows.filter(pc.field(s.EVENT) == event).sort_by(s.COMMITTED_AT)
        return [LedgerEvent(event, json.loads(d)) for d in found[s.DETAIL].to_pylist()]

    def owner(self, run_id: str) -> str | None:
        """The job that owns the run (NOTE [ one writer per run ]), None if none claimed it."""
        with self._lock:
            self._refresh()
            return self._owner(run_id)

    def scan(self, run_id: str) -> RunScan:
        """The run's committed, retired and damaged checkpoints, from the newest snapshot.

        Raises:
            LedgerCorruptError: a data file of the ledger is missing or unreadable.
        """
        with self._lock:
            self._refresh()
            return self._scan(run_id)

    def checkpoints(self, run_id: str | None = None) -> list[CheckpointRecord]:
        """Committed checkpoints of one run, or of all runs, ordered by (run, step).

        Retired checkpoints and damaged rows are left out (NOTE [ retired and damaged
        records ]); damaged rows are logged.
        """
        with self._lock:
            self._refresh()
            if run_id is not None:
                return self._scan(run_id).committed
            rows, damaged = intact_rows(self._read(record=s.RECORD_CHECKPOINT))
            events, _ = intact_rows(self._read(record=s.RECORD_EVENT))
        log_damaged(self.describe(), damaged)
        retired = retired_ids(events)
        return [c for c in tagged(checkpoints_from_arrow(rows), events)
                if c.checkpoint_id not in retired]

    def latest(self, run_id: str) -> CheckpointRecord | None:
        """The run's newest committed checkpoint, or None if it has none."""
        committed = self.checkpoints(run_id)
        return committed[-1] if committed else None

    def to_arrow(self) -> pa.Table:
        """The whole ledger table, in :data:`LEDGER_SCHEMA`."""
        with self._lock:
            self._refresh()
            return self._read()

    def consumption(self, run_id: str | None = None, checkpoint_id: str | None = None) -> pa.Table:
        """Consumption rows, optionally of one run and/or checkpoint, in CONSUMPTION_COLUMNS.

        Ordered by run, step, rank, worker, then reading position, so that contiguous ranges
        of one worker come out next to each other.

        Raises:
            LedgerCorruptError: a row fails its checksum, or a ledger file is unreadable.
        """
        with self._lock:
            self._refresh()
            rows = self._read(
                record=s.RECORD_CONSUMPTION, run_id=run_id, checkpoint_id=checkpoint_id
            )
        rows, damaged = intact_rows(rows)
        if damaged:
            first = damaged[0]
            raise LedgerCorruptError(
                f"ledger {self.describe()}: {len(damaged)} consumption record(s) fail their "
                f"checksum, the first of run {first.run_id!r} step {first.step} (checkpoint "
                f"{first.checkpoint_id!r}); the consumption of that checkpoint cannot be trusted"
            )
        order = (s.RUN_ID, s.STEP, s.RANK, s.WORKER, s.SEGMENT, s.FILE, s.ROW_GROUP, s.ROW_START)
        return rows.select(list(s.CONSUMPTION_COLUMNS)).sort_by([(c, "ascending") for c in order])

    # -- shared by the reads and the commit protocol ------------------------------------

    def _scan(self, run_id: str) -> RunScan:
        rows, damaged = intact_rows(self._read(record=s.RECORD_CHECKPOINT, run_id=run_id))
        events, damaged_events = intact_rows(self._read(record=s.RECORD_EVENT, run_id=run_id))
        retired = retired_ids(events)
        damaged += [d for d in damaged_events if d.checkpoint_id]
        log_damaged(self.describe(), damaged)
        committed = [c for c in tagged(checkpoints_from_arrow(rows), events)
                     if c.checkpoint_id not in retired]
        return RunScan(committed, retired, damaged)
