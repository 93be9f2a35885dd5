"""Phase 2 of a checkpoint (rank 0): commit if every rank prepared, else abort.

See NOTE [ two-phase commit ] in :mod:`lakeckpt_tables.checkpoint.manager`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import KW_ONLY, dataclass, field, replace
from datetime import datetime
from typing import Any

from lakeckpt_tables import errors
from lakeckpt_tables.checkpoint._failures import describe_failure, is_write_failure
from lakeckpt_tables.checkpoint.eos_count import eos_events
from lakeckpt_tables.checkpoint.readers import merged, sources_of
from lakeckpt_tables.checkpoint.recipe import recipe_events
from lakeckpt_tables.checkpoint.restore_policy import DCP_METADATA
from lakeckpt_tables.checkpoint.retention import Retention, removed_events
from lakeckpt_tables.errors import CheckpointError, CheckpointWriteError
from lakeckpt_tables.hooks import reached as crash_point  # test seam: no hook in production
from lakeckpt_tables.io.checkpoint_storage import CheckpointStorage
from lakeckpt_tables.ledger import CheckpointRecord, ConsumptionRecord, Ledger, LedgerEvent
from lakeckpt_tables.ledger.records import SealedConsumption
from lakeckpt_tables.reader import encode_state

__all__ = ["Attempt", "Committer", "Prepared", "failed", "sealed"]

log = logging.getLogger(__name__)

_UNKNOWN_OUTCOME_TRIES = 3


@dataclass
class Prepared:
    """One rank's outcome of phase 1."""

    ok: bool
    error: str = ""
    write: bool = False  # the failure is the storage's (disk full...)
    manifest: dict[str, Any] = field(default_factory=dict)
    reader: dict[str, Any] | None = None
    consumed: list[ConsumptionRecord] = field(default_factory=list)
    events: list[LedgerEvent] = field(default_factory=list)
    sealed: SealedConsumption | None = None
    """``consumed`` as sealed ledger rows (:func:`sealed`): what travels to rank 0."""


@dataclass
class Attempt:
    """One save in flight."""

    step: int
    checkpoint_id: str
    location: str
    tags: tuple[str, ...]
    prepared: Prepared
    future: Future[Any] | None = None
    committed_at: datetime | None = None
    """The commit's timestamp, fixed by rank 0 as phase 2 begins (every rank seals with it)."""


def failed(exc: BaseException) -> Prepared:
    """A rank's failed phase 1, the cause said in words."""
    return Prepared(False, error=describe_failure(exc), write=is_write_failure(exc))


def sealed(attempt: Attempt, run_id: str, owner: str) -> Prepared:
    """This rank's report as it travels to rank 0: its consumption as sealed ledger rows
    instead of records, so that rank 0 neither unpickles nor checksums one object per record
    (NOTE [ consumption sealed where made ] in ``ledger/records.py``)."""
    prepared = attempt.prepared
    if not prepared.ok:
        return prepared
    if attempt.committed_at is None:
        raise ValueError(f"run {run_id} step {attempt.step}: the commit's timestamp must be "
                         "fixed (Attempt.committed_at) before the consumption is sealed")
    try:
        rows = SealedConsumption.of(prepared.consumed, run_id=run_id,
                                    checkpoint_id=attempt.checkpoint_id, step=attempt.step,
                                    committed_at=attempt.committed_at, owner=owner)
    except (ValueError, TypeError, OverflowError) as exc:  # Arrow's conversion errors: rank 0
        # reports them like any failed phase 1, and no rank waits in the gather for this one
        log.exception("run %s step %d: sealing this rank's consumption failed", run_id,
                      attempt.step)
        return Prepared(False, error="its consumption records do not fit the ledger's columns "
                        f"({describe_failure(exc)})")
    return replace(prepared, consumed=[], sealed=rows)


@dataclass
class Committer:
    """Rank 0's commit decision for one run."""

    ledger: Ledger
    storage: CheckpointStorage
    retention: Retention
    _: KW_ONLY
    run_id: str
    owner: str
    config_hash: str
    _started: float = field(init=False, default_factory=time.monotonic)
    _pushed_out: list[CheckpointRecord] = field(init=False, default_factory=list)
    """Checkpoints pushed out of retention by the commit in flight."""
    pending: list[LedgerEvent] = field(init=False, default_factory=list)
    """Events of this job to commit with its next checkpoint (NOTE [ skipped batches ])."""
    resumed: CheckpointRecord | None = field(init=False, default=None)
    """The checkpoint this job restored (a branch's parent too): recipe changes are measured
    from it until this job commits (NOTE [ recipe changes ])."""

    def decide(self, attempt: Attempt, reports: list[Prepared], head: CheckpointRecord | None,
               world_size: int) -> CheckpointRecord | errors.LakeckptError:
        """Commit if every rank prepared (the commit point), else abort; errors are returned
        as values, to be raised on every rank."""
        failures = [(r, p) for r, p in enumerate(reports) if not p.ok]
        if failures:
            self.storage.delete(attempt.location)
            detail = "; ".join(f"rank {r}: {p.error}" for r, p in failures)
            kind = CheckpointWriteError if any(p.write for _, p in failures) else CheckpointError
            return kind(f"checkpoint of run {self.run_id} at step {attempt.step} under "
                        f"{self.storage.root} was not saved, nothing was committed: {detail}")
        try:
            record, consumption, reader = self._records(attempt, reports, head, world_size)
            if head is not None and head.step == attempt.step:
                return self._same_step(attempt, record, head)
            pushed_out = self.retention.pushed_out(record)
            crash_point("commit:before", 0)
            # rank 0's reader sees the same follow segments as every rank (they are derived
            # from the commit log alone), so its events speak for all
            was = head if head is not None else self.resumed
            events = self.pending + recipe_events(was, reader) + reports[0].events \
                + eos_events(head, reader) + removed_events(pushed_out, "retention")
            committed = self._ledger_commit(record, consumption, events)
            self._pushed_out, self.pending = pushed_out, []
            crash_point("commit:after", 0)
            return committed
        except errors.CommitStateUnknownError as exc:
            # a landed commit may name the files: they stay, gc decides later from the ledger
            return exc
        except errors.LakeckptError as exc:  # certainly not landed: nothing names the files
            self.storage.delete(attempt.location)
            return exc
        except Exception as exc:
            log.exception("ledger commit of run %s step %d failed", self.run_id, attempt.step)
            return CheckpointError(f"ledger commit of run {self.run_id} step {attempt.step} "
                                   f"failed: {describe_failure(exc)}")

    def committed(self, record: CheckpointRecord) -> None:
        """After every rank heard of the commit: retention and compaction."""
        pushed_out, self._pushed_out = self._pushed_out, []
        self.retention.committed(record, pushed_out)

    def _same_step(self, attempt: Attempt, record: CheckpointRecord,
                   head: CheckpointRecord) -> CheckpointRecord | errors.LakeckptError:
        """A second save at the step this job committed (or restored) last.

        The common "final save after the loop" at a step the loop already saved: the same
        content (model files byte for byte, reader state) is that checkpoint, returned as
        committed; other content at a committed step is a conflict.
        """
        self.storage.delete(attempt.location)
        if (head.reader_state == record.reader_state
                and _data_files(head.manifest) == _data_files(record.manifest)):
            log.info("run %s: step %d is already committed with the same content as "
                     "checkpoint %s", self.run_id, head.step, head.checkpoint_id)
            return head
        return errors.CommitConflictError(
            f"run {self.run_id} step {attempt.step} is already committed as checkpoint "
            f"{head.checkpoint_id} with other content (the model, optimizer or reader state "
            "changed since); save it under a later step")

    def _ledger_commit(self, record: CheckpointRecord, consumption: SealedConsumption,
                       events: list[LedgerEvent]) -> CheckpointRecord:
        """Commit, asking again after an unknown outcome: the ledger's settle step reads the
        log (the run's app transaction, the snapshot summaries) and returns the stored record
        if the first try landed."""
        unknown: errors.CommitStateUnknownError | None = None
        for attempt in range(_UNKNOWN_OUTCOME_TRIES):
            try:
                return self.ledger.commit(record, consumption, events, owner=self.owner)
            except errors.CommitStateUnknownError as exc:
                if attempt + 1 == _UNKNOWN_OUTCOME_TRIES:
                    raise
                unknown = exc
                log.warning("run %s step %d: %s; asking the ledger again", self.run_id,
                            record.step, exc)
                time.sleep(0.2 * 2 ** attempt)
            except errors.LakeckptError as exc:
                if unknown is None:
                    raise
                # the first try may have landed and named the files: they must stay
                raise errors.CommitStateUnknownError(
                    f"{unknown}; asking again failed too ({exc})") from exc
        raise AssertionError("unreachable")

    def _records(self, attempt: Attempt, reports: list[Prepared], head: CheckpointRecord | None,
                 world_size: int) -> tuple[CheckpointRecord, SealedConsumption,
                                           dict[str, Any] | None]:
        """The checkpoint record, its sealed consumption and the merged reader state."""
        manifest: dict[str, Any] = {}
        for report in reports:
            manifest.update(report.manifest)
        reader, source, version = merged([r.reader for r in reports if r.reader is not None],
                                         f"run {self.run_id} step {attempt.step}")
        parts = [r.sealed for r in reports if r.sealed is not None]
        if len(parts) != len(reports):
            raise ValueError(f"run {self.run_id} step {attempt.step}: every rank's report must "
                             "be sealed (checkpoint.commit.sealed) before rank 0 decides")
        consumption = SealedConsumption.joined(parts)
        record = CheckpointRecord(
            run_id=self.run_id, checkpoint_id=attempt.checkpoint_id, step=attempt.step,
            parent_id=head.checkpoint_id if head is not None else None,
            model_location=attempt.location, manifest=manifest,
            reader_state=encode_state(reader) if reader is not None else "",
            source=source, source_version=version,
            world_size=world_size, tags=attempt.tags, config_hash=self.config_hash,
            wall_time_s=time.monotonic() - self._started, sources=sources_of(reader))
        return record, consumption, reader


def _data_files(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest without DCP's ``.metadata``, which holds a fresh save id every time."""
    return {name: digest for name, digest in manifest.items() if name != DCP_METADATA}
