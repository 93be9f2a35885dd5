"""Which model files a run keeps, their removal, and the ledger's periodic compaction (rank 0).

Retention keeps the newest ``keep_last`` untagged checkpoints and every tagged one (all of
them with ``keep_last=None``: a trainer that wrote the files deletes its own). The
checkpoints a commit pushes out are named by ``removed`` events in that same commit, and their
files are deleted once it landed: the ledger says which committed checkpoints are no longer
restorable (``lakeckpt checkpoints`` shows them as removed) without a commit of its own.
"""

from __future__ import annotations

import logging

from lakeckpt_tables.checkpoint._failures import describe_failure
from lakeckpt_tables.errors import RunFencedError
from lakeckpt_tables.io.checkpoint_storage import CheckpointStorage
from lakeckpt_tables.ledger import CheckpointRecord, Ledger, LedgerEvent

__all__ = ["EVENT_REMOVED", "Retention"]

log = logging.getLogger(__name__)

EVENT_REMOVED = "removed"
"""Event naming a committed checkpoint whose model files were deleted:
``{"checkpoint_id", "step", "location", "reason": "retention" | "gc"}``."""


class Retention:
    """The run's committed checkpoints as rank 0 knows them, and what to delete."""

    def __init__(self, ledger: Ledger, storage: CheckpointStorage, run_id: str, *,
                 keep_last: int | None, compact_every: int) -> None:
        self.ledger = ledger
        self.storage = storage
        self.run_id = run_id
        self.keep_last = keep_last
        self.compact_every = compact_every
        self._records: list[CheckpointRecord] | None = None
        self._gone: set[str] = set()  # checkpoints whose files are known to be deleted
        self._commits = 0

    def forget(self) -> None:
        """Read the ledger afresh next time (after a restore, or for gc)."""
        self._records = None

    def records(self) -> list[CheckpointRecord]:
        """The run's committed checkpoints, read once, then kept up to date by
        :meth:`committed` (re-reading the ledger after every commit grows with its size)."""
        if self._records is None:
            self._records = list(self.ledger.checkpoints(self.run_id))
        return self._records

    def pushed_out(self, new: CheckpointRecord | None = None) -> list[CheckpointRecord]:
        """The committed checkpoints beyond ``keep_last`` once ``new`` is committed, tagged
        ones spared (``lakeckpt tag`` may have tagged one since the records were read); none
        when ``keep_last`` is None (a trainer's checkpoints: the trainer deletes its own)."""
        if self.keep_last is None:
            return []
        records = self.records()
        if new is not None and not any(r.checkpoint_id == new.checkpoint_id for r in records):
            records = [*records, new]
        untagged = [r for r in records if not r.tags]
        old = untagged[: max(len(untagged) - self.keep_last, 0)]
        old = [r for r in old if r.checkpoint_id not in self._gone]
        if old:  # one listing, not a request per checkpoint (the first save of a long run)
            present = {f"{self.run_id}/{name}" for name in self.storage.list(self.run_id)}
            self._gone.update(r.checkpoint_id for r in old if r.model_location not in present)
            old = [r for r in old if r.checkpoint_id not in self._gone]
        if old:
            tagged = self.ledger.tags(self.run_id)
            old = [r for r in old if r.checkpoint_id not in tagged]
        return old

    def committed(self, record: CheckpointRecord, pushed_out: list[CheckpointRecord]) -> None:
        """After a commit: remember it, delete the files it pushed out, compact now and then."""
        records = self.records()
        if not any(r.checkpoint_id == record.checkpoint_id for r in records):
            records.append(record)
        for old in pushed_out:
            self.storage.delete(old.model_location)
            self._gone.add(old.checkpoint_id)
        self._commits += 1
        if self._commits % self.compact_every == 0:
            self._compact()

    def gc(self, owner: str) -> list[str]:
        """Delete what no retained checkpoint needs: files retention pushed out (recorded as
        ``removed`` events) and directories no committed checkpoint names (aborted attempts).

        Raises:
            RunFencedError: another job owns the run; nothing was removed.
        """
        current = self.ledger.owner(self.run_id)
        if current is not None and current != owner:
            raise RunFencedError(
                f"run {self.run_id} under {self.storage.root} is owned by job {current}, not "
                f"this job {owner}: gc removes nothing (an attempt of the owner may be in "
                "flight); run it from the owning job, or restore first")
        self.forget()
        old = self.pushed_out()
        if old:
            self.ledger.record_events(self.run_id, removed_events(old, "gc"))
            for record in old:
                self.storage.delete(record.model_location)
                self._gone.add(record.checkpoint_id)
        keep = {r.model_location for r in self.records()}
        removed = []
        for name in self.storage.list(self.run_id):
            location = f"{self.run_id}/{name}"
            if location not in keep:
                self.storage.delete(location)
                removed.append(location)
        return removed

    def _compact(self) -> None:
        """Compact the ledger; the checkpoint is committed, so a failure here is an event
        (``compaction_failed``), never a failed save."""
        try:
            self.ledger.compact()
        except Exception as exc:
            log.warning("run %s: ledger compaction failed (the checkpoint is committed): %s",
                        self.run_id, describe_failure(exc))
            try:
                self.ledger.record_events(self.run_id, [LedgerEvent(
                    "compaction_failed", {"error": describe_failure(exc)})])
            except Exception as again:
                log.warning("run %s: the compaction_failed event was not recorded: %s",
                            self.run_id, describe_failure(again))


def removed_events(records: list[CheckpointRecord], reason: str) -> list[LedgerEvent]:
    """``removed`` events for committed checkpoints whose files are deleted."""
    return [LedgerEvent(EVENT_REMOVED, {"checkpoint_id": r.checkpoint_id, "step": r.step,
                                        "location": r.model_location, "reason": reason})
            for r in records]
