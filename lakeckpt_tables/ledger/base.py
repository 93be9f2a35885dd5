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
   winner and settles against it, and commit the same prepared files again if still allowed.

NOTE [ one writer per run ]
A checkpoint committed with an ``owner`` (every CheckpointManager does) is also fenced: the
run's owner is the job that last claimed it (:meth:`LedgerBase.claim`, called by restore) or
first committed to it, and a commit lands only if the owner is still ours and the checkpoint's
parent is still the run's newest checkpoint. Claims and owned commits carry the same run-wide
condition as step 2, so a claim racing a commit of the old owner makes one of them lose, and
the loser settles against the winner: the old owner then gets :class:`RunFencedError`.

NOTE [ retired and damaged records ]
A checkpoint that restore skipped (its files fail verification) is *retired* by a ``retired``
event; a checkpoint row whose checksum fails is *damaged*. Neither counts as committed: they
are left out of :meth:`LedgerBase.checkpoints`, and their step can be committed again.

The data files written for a commit are deleted only when it certainly did not land (a
conflict, or a retry that found the checkpoint stored). An error that leaves the outcome
unknown becomes :class:`CommitStateUnknownError` and leaves the files, which a landed commit
may name; since commits are idempotent, committing the same checkpoint again finds out.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Generic, TypeVar

import pyarrow as pa

from lakeckpt_tables import hooks
from lakeckpt_tables.errors import CommitConflictError, RunFencedError
from lakeckpt_tables.ledger.contract import COMMIT_ATTEMPTS, EVENT_RETIRED, EVENT_TAG, RunScan
from lakeckpt_tables.ledger.reads import LedgerReads
from lakeckpt_tables.ledger.records import (
    CheckpointRecord,
    ConsumptionRecord,
    LedgerEvent,
    SealedConsumption,
    commit_rows,
    event_rows,
)
from lakeckpt_tables.ledger.settling import check_parent, now_utc, outcome_unknown, settle
from lakeckpt_tables.ledger.spec import LedgerSpec

__all__ = [
    "COMMIT_ATTEMPTS",
    "EVENT_RETIRED",
    "EVENT_TAG",
    "Ledger",
    "LedgerBase",
    "Prepared",
    "RunScan",
    "now_utc",
    "outcome_unknown",
    "settle",
]

Prepared = TypeVar("Prepared")
"""What a backend's phase 1 wrote (data files), handed to its phase 2 and to its cleanup."""


class LedgerBase(LedgerReads, Generic[Prepared]):
    """A sidecar table of checkpoints, consumption and events, committed atomically: the
    ledger contract, implemented once on a few backend primitives.

    A backend says how to refresh its table handle, read rows, find a run's last step and
    owner cheaply, write data files (phase 1, invisible: the :data:`Prepared` value names
    them), commit them (phase 2) and discard them; the commit protocol of
    NOTE [ ledger commit protocol ] lives here. The lock makes one ledger object safe to share
    between threads; separate objects (or processes) on one table are kept apart by the table
    format's commits.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        # run -> the checkpoint this object last committed or claimed for it as its owner:
        # an owned commit building on it needs no data read (see _settle)
        self._heads: dict[str, str | None] = {}

    @abc.abstractmethod
    def compact(self) -> None:
        """Maintenance: merge the small files that one commit per checkpoint leaves behind."""

    @property
    @abc.abstractmethod
    def spec(self) -> LedgerSpec:
        """Where the ledger lives, as a value (what the run registry records)."""

    @abc.abstractmethod
    def repair_missing(self) -> list[str]:
        """Drop the data files that no longer exist (their records are lost); return them."""

    # -- backend primitives ----------------------------------------------------------------

    @abc.abstractmethod
    def _last_step(self, run_id: str) -> int | None:
        """The run's last committed step in the handle's snapshot; None if it has none."""

    @abc.abstractmethod
    def _prepare(self, rows: pa.Table) -> Prepared:
        """Phase 1: write the rows as data files that no snapshot names yet."""

    @abc.abstractmethod
    def _publish(
        self,
        prepared: Prepared,
        *,
        run_id: str,
        checkpoint: CheckpointRecord | None,
        owner: str | None = None,
    ) -> bool:
        """Phase 2: one commit adding the prepared files, based on the handle's snapshot.

        A checkpoint commit must fail if anything of its run was committed after that
        snapshot; an events commit (``checkpoint`` None) is rebased like any append, unless
        it carries an ``owner`` (a claim), which conflicts like a checkpoint commit. A
        commit with an ``owner`` makes it the run's owner.

        Returns:
            True if the commit landed, False if it certainly did not (it lost a race).

        Raises:
            CommitStateUnknownError: nobody knows whether it landed.
        """

    @abc.abstractmethod
    def _discard(self, prepared: Prepared) -> None:
        """Delete prepared files that certainly no commit names."""

    # -- the contract ----------------------------------------------------------------------

    def commit(
        self,
        checkpoint: CheckpointRecord,
        consumption: Sequence[ConsumptionRecord] | SealedConsumption = (),
        events: Sequence[LedgerEvent] = (),
        *,
        owner: str | None = None,
    ) -> CheckpointRecord:
        """Commit a checkpoint with its consumption and events in one atomic commit
        (NOTE [ ledger commit protocol ]).

        Args:
            checkpoint: the checkpoint; its ``committed_at`` is set by the ledger (to the
                sealed consumption's, when given sealed).
            consumption: rows consumed since the run's previous checkpoint, as records or
                sealed by the ranks (NOTE [ consumption sealed where made ] in records.py).
            events: events to keep with the checkpoint.
            owner: the committing job's token: the commit lands only if that job still owns
                the run and the parent is the run's newest (NOTE [ one writer per run ]).

        Returns:
            The committed record; for a retry of a committed checkpoint (same run, step and
            id), the stored one, and nothing is written.

        Raises:
            CommitConflictError: the run already has another checkpoint at this step, or a
                later step, or a concurrent committer of the run won; nothing was written.
            RunFencedError: another job owns the run now; nothing was written.
            CommitStateUnknownError: the commit may or may not have landed; retry it.
        """
        with self._lock:
            self._refresh()
            stored = self._settle(checkpoint, owner)
            if stored is not None:
                if owner is not None:
                    self._heads[stored.run_id] = stored.checkpoint_id
                return stored
            record = replace(checkpoint, committed_at=consumption.committed_at
                             if isinstance(consumption, SealedConsumption) else now_utc())
            prepared = self._prepare(commit_rows(record, consumption, events, owner=owner))
            hooks.reached("ledger:prepared", 0)
            try:
                stored = self._publish_settled(record, prepared, owner)
            except CommitConflictError:
                self._discard(prepared)
                raise
            if stored is not None:
                if stored.committed_at != record.committed_at:
                    self._discard(prepared)  # another coordinator's commit of it landed
                # else our own first try landed, its response lost: the store retried the
                # write and reported a conflict with ourselves (S3's conditional PUT); the
                # file is named by the log and stays
                record = stored
            if owner is not None:
                self._heads[record.run_id] = record.checkpoint_id
            return record

    def claim(self, run_id: str, owner: str, events: Sequence[LedgerEvent] = (), *,
              head: str | None = None, check_head: bool = True) -> None:
        """Make ``owner`` the run's one writer (fencing every other job), with ``events``.

        Args:
            run_id: the run.
            owner: the claiming job's token.
            events: recorded in the same commit (the restore, retirements...).
            head: the checkpoint the claimer restores; the claim lands only while it is the
                run's newest (after the retirements in ``events``).
            check_head: False when restoring an older checkpoint on purpose (by step or tag):
                the claim lands anyway, and commits building on it are refused.

        Raises:
            CommitConflictError: the run's newest checkpoint is not ``head`` any more (another
                job committed meanwhile: choose again), or the claim kept losing races.
            CommitStateUnknownError: the claim may or may not have landed.
        """
        retiring = {e.detail["checkpoint_id"] for e in events if e.event == EVENT_RETIRED}
        events = list(events) or [LedgerEvent("claim", {"owner": owner, "head": head})]
        with self._lock:
            prepared = self._prepare(event_rows(run_id, events, now_utc(), owner=owner))
            for _ in range(COMMIT_ATTEMPTS):
                self._refresh()
                committed = [c for c in self._scan(run_id).committed
                             if c.checkpoint_id not in retiring]
                newest = committed[-1].checkpoint_id if committed else None
                if check_head and newest != head:
                    self._discard(prepared)
                    raise CommitConflictError(
                        f"ledger {self.describe()}: run {run_id!r} moved on while job {owner} "
                        f"was restoring checkpoint {head!r} (its newest is now {newest!r}); "
                        "restore again"
                    )
                if self._publish(prepared, run_id=run_id, checkpoint=None, owner=owner):
                    self._heads[run_id] = head
                    return
            self._discard(prepared)
            raise CommitConflictError(
                f"ledger {self.describe()}: job {owner} could not take over run {run_id!r}: "
                f"its claim lost {COMMIT_ATTEMPTS} commit races in a row; restore again"
            )

    def record_events(self, run_id: str, events: Sequence[LedgerEvent]) -> None:
        """Commit events outside any checkpoint (checkpoint id ``""``, step -1).

        Raises:
            CommitConflictError: the commit kept losing to concurrent commits.
            CommitStateUnknownError: the commit may or may not have landed.
        """
        if not events:
            return
        with self._lock:
            prepared = self._prepare(event_rows(run_id, events, now_utc()))
            for _ in range(COMMIT_ATTEMPTS):
                self._refresh()
                if self._publish(prepared, run_id=run_id, checkpoint=None):
                    return
            self._discard(prepared)
            raise CommitConflictError(
                f"ledger {self.describe()}: events of run {run_id!r} were not recorded: the "
                f"commit lost {COMMIT_ATTEMPTS} races to concurrent commits; record them again"
            )

    # -- the protocol's steps --------------------------------------------------------------

    def _settle(self, checkpoint: CheckpointRecord, owner: str | None) -> CheckpointRecord | None:
        """Step 1 against the handle's snapshot: see :func:`settle` and NOTE [ one writer per
        run ].

        A step after the run's last one, by the run's owner, building on what this object last
        committed or claimed for it, the common case, needs no data read: only the owner
        commits, so that parent is the newest.
        """
        run_id = checkpoint.run_id
        if owner is not None:
            current = self._owner(run_id)
            if current is not None and current != owner:
                raise RunFencedError(
                    f"ledger {self.describe()}: run {run_id!r} is owned by job {current} now "
                    f"(it restored the run after this job {owner} did); step {checkpoint.step} "
                    "was not committed. Stop this job: two jobs writing one run would train "
                    "rows twice"
                )
            fast = (current == owner and run_id in self._heads
                    and self._heads[run_id] == checkpoint.parent_id)
        else:
            fast = True
        last_step = self._last_step(run_id)
        if last_step is None and checkpoint.parent_id is None:
            return None
        if fast and last_step is not None and checkpoint.step > last_step:
            return None
        committed = self._scan(run_id).committed
        stored = settle(self.describe(), checkpoint, committed)
        if stored is None and owner is not None:
            check_parent(self.describe(), checkpoint, committed)
        return stored

    def _publish_settled(
        self, record: CheckpointRecord, prepared: Prepared, owner: str | None
    ) -> CheckpointRecord | None:
        """Steps 2 and 3: commit; after a lost race, settle against the winner and retry.

        Returns:
            None when our commit landed; the stored record when a commit of the same
            checkpoint landed instead: a retrying coordinator's, or our own first try whose
            response was lost (its ``committed_at`` is ours).
        """
        for _ in range(COMMIT_ATTEMPTS):
            if self._publish(prepared, run_id=record.run_id, checkpoint=record, owner=owner):
                return None
            self._refresh()
            stored = self._settle(record, owner)
            if stored is not None:
                return stored
        raise CommitConflictError(
            f"ledger {self.describe()}: run {record.run_id!r} step {record.step} (checkpoint "
            f"{record.checkpoint_id!r}) lost {COMMIT_ATTEMPTS} commit races in a row; nothing "
            "of it was written"
        )


Ledger = LedgerBase
"""The ledger contract: every backend is a :class:`LedgerBase` (the name to annotate with)."""
