"""``CheckpointManager``: model, optimizer, RNG and reader position, visible together or not.

NOTE [ two-phase commit ]
Phase 1, prepare (every rank): write the model/optimizer shard with torch.distributed.checkpoint
into a directory unique to this attempt, capture the reader state and the rows consumed since
the previous checkpoint, checksum the files written, and report success or failure.
Phase 2, commit (rank 0): only if every rank prepared, make ONE ledger commit holding the
checkpoint record (with the merged reader state of all ranks and workers) and all consumption
records; then tell every rank the outcome. A directory the ledger does not name is not a
checkpoint: a crash at any instant leaves the previous or the new checkpoint as the latest, and
``gc`` removes the orphans. With ``async_save=True`` the files are written in the background
and the commit happens at the next ``save`` (or ``wait``), so training overlaps the write.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import time
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from lakeckpt_tables import errors
from lakeckpt_tables.audit import registry
from lakeckpt_tables.checkpoint._failures import (
    WRITE_FAILURES,
    describe_failure,
    is_write_failure,
)
from lakeckpt_tables.checkpoint._world import World
from lakeckpt_tables.checkpoint.consumption import consumed_between, segment_events
from lakeckpt_tables.errors import CheckpointError, CheckpointWriteError
from lakeckpt_tables.hooks import reached as crash_point  # test seam: no hook in production
from lakeckpt_tables.io.checkpoint_storage import CheckpointStorage
from lakeckpt_tables.ledger import (
    CheckpointRecord,
    ConsumptionRecord,
    Ledger,
    LedgerEvent,
    open_ledger,
)
from lakeckpt_tables.ledger.base import EVENT_RETIRED, RunScan
from lakeckpt_tables.reader._torchdata import dataset_of, reader_state_of, restore_reader
from lakeckpt_tables.reader.state import (
    ReaderState,
    decode_state,
    encode_state,
    merge_states,
)

__all__ = ["CheckpointManager"]

log = logging.getLogger(__name__)

MODEL = "model"
OPTIMIZER = "optimizer"
LR_SCHEDULER = "lr_scheduler"
EXTRA = "extra"
_METADATA = ".metadata"
_UNKNOWN_OUTCOME_TRIES = 3
_CLAIM_TRIES = 3


@contextmanager
def _one_process() -> Iterator[None]:
    """DCP warns at every save and load without a process group that it assumes one process:
    a world of one is what the manager means there, so exactly that warning is silenced (the
    background writer of ``async_save`` still shows it: docs/limits.md)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, message=(
            "torch.distributed is disabled, unavailable or uninitialized"))
        yield


def _rank_key(rank: int) -> str:
    # DCP keeps ONE copy of a non-tensor value saved under the same key on every rank, so
    # per-rank values (RNG, reader state) live under rank-specific keys.
    return f"rank{rank}"


class _Writer(FsspecWriter):
    """DCP's file writer with a crash point after a rank's data files, before ``.metadata``."""

    def __init__(self, path: str, rank: int, **storage_options: Any) -> None:
        super().__init__(path, **storage_options)
        self._rank = rank

    def write_data(self, plan: Any, planner: Any) -> Any:
        future = super().write_data(plan, planner)
        future.wait()  # the data files of this rank are on disk; .metadata comes later
        crash_point("prepare:mid_write", self._rank)
        return future


@dataclass
class _Prepared:
    """One rank's outcome of phase 1."""

    ok: bool
    error: str = ""
    write: bool = False  # the failure is the storage's (disk full...)
    manifest: dict[str, Any] = field(default_factory=dict)
    reader: dict[str, Any] | None = None
    consumed: list[ConsumptionRecord] = field(default_factory=list)
    events: list[LedgerEvent] = field(default_factory=list)


@dataclass
class _Attempt:
    step: int
    checkpoint_id: str
    location: str
    tags: tuple[str, ...]
    prepared: _Prepared
    future: Future[Any] | None = None


class CheckpointManager:
    """Saves and restores checkpoints of one run, committed through a ledger.

    Every method is collective: call it on all ranks (a process without torch.distributed is a
    world of one).

    Args:
        root: directory holding the run's checkpoints (``<root>/<run_id>/step-...``): a local
            path, ``s3://bucket/prefix`` or another fsspec URI, seen by every rank.
        run_id: the run; a ledger holds many runs.
        ledger: a :class:`~lakeckpt_tables.ledger.Ledger`, a spec for
            :func:`~lakeckpt_tables.ledger.open_ledger` (``"delta:<uri>"``,
            ``"iceberg:<namespace.table>"``), or None for a Delta ledger at ``<root>/_ledger``.
        keep_last: committed checkpoints whose model files are kept (tagged ones always are).
        async_save: write model files in the background; the checkpoint is committed at the
            next :meth:`save` or at :meth:`wait`.
        config: the run configuration; its hash is recorded with every checkpoint.
        compact_every: compact the ledger (fewer, larger files; a Delta log checkpoint) after
            this many of this manager's commits, so reading it stays fast.
        storage_options: for an object store root (and the default ledger under it): see
            :mod:`lakeckpt_tables.io.storage`; when given, ``AWS_*`` variables are not read.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        run_id: str,
        *,
        ledger: Ledger | str | None = None,
        keep_last: int = 3,
        async_save: bool = False,
        compact_every: int = 100,
        config: Mapping[str, Any] | None = None,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        if not run_id or "/" in run_id:
            raise ValueError(f"run_id must be a non-empty name without '/', got {run_id!r}")
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.root = os.fspath(root)
        self.storage = CheckpointStorage(self.root, storage_options)
        self._root_shared = False
        self.run_id = run_id
        self.keep_last = keep_last
        self.compact_every = compact_every
        self._run_cache: list[CheckpointRecord] | None = None  # rank 0: this run's records
        self._commits = 0
        self.async_save = async_save
        self.world = World()
        self.ledger = open_ledger(ledger, storage=self.storage.store
                                  ) if self.world.rank == 0 else None
        self.config_hash = _config_hash(config or {})
        self._registration = registry.for_manager(self, config) if self.ledger else None
        self._started = time.monotonic()
        self._baseline: ReaderState | None = None
        self._head: CheckpointRecord | None = None  # what this job committed or restored last
        self._pending: _Attempt | None = None
        # This job's token as the run's one writer (NOTE [ one writer per run ] in
        # ledger/base.py); 62 bits, so that Delta can keep it as an app transaction version.
        self.owner = self.world.broadcast(str(uuid.uuid4().int >> 66))
        # NOTE [ one root for all ranks ]: refused now, before any training step
        self.storage.prove_shared(self.world, self.run_id)
        self._root_shared = True

    # --------------------------------------------------------------------------- save

    def save(
        self,
        step: int,
        *,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: Any = None,
        dataloader: Any = None,
        extra: Mapping[str, Any] | None = None,
        tags: Sequence[str] = (),
    ) -> CheckpointRecord | None:
        """Checkpoint ``step`` on every rank; committed now, or at the next save when async.

        A second save at the step this job committed last, with the same content, returns that
        checkpoint (the "final save after the loop").

        Args:
            step: training step; strictly increasing within the run.
            model, optimizer, lr_scheduler: saved through torch.distributed.checkpoint.
            dataloader: a torchdata ``StatefulDataLoader`` over a :class:`LakeDataset`.
            extra: any other state (same on every rank).
            tags: labels kept with the checkpoint; tagged checkpoints survive retention.

        Returns:
            The committed record, or None when ``async_save`` defers the commit.

        Raises:
            CheckpointWriteError: writing the files failed (the cause named: ENOSPC...);
                nothing became visible.
            CheckpointError: some rank failed to prepare otherwise (e.g. an optimizer over
                parameters the model does not hold); nothing became visible.
            RunFencedError: another job restored the run since: this job must stop.
            CommitConflictError: the step is committed with other content, or the run moved
                on without this job.
            CommitStateUnknownError: the ledger never said whether the commit landed; the
                files stay, and the next restore or save finds out.
        """
        self.wait()
        if not self._root_shared:
            self.storage.prove_shared(self.world, self.run_id)
            self._root_shared = True
        checkpoint_id = self.world.broadcast(uuid.uuid4().hex)
        location = f"{self.run_id}/step-{step:09d}-{checkpoint_id[:8]}"
        prepared, future = self._prepare(location, model, optimizer, lr_scheduler,
                                         dataloader, extra)
        attempt = _Attempt(step, checkpoint_id, location, tuple(tags), prepared, future)
        if future is not None:
            self._pending = attempt
            return None
        return self._commit(attempt)

    def wait(self) -> CheckpointRecord | None:
        """Finish and commit a pending async save (collective); None if there is none."""
        attempt, self._pending = self._pending, None
        if attempt is None:
            return None
        if attempt.future is not None and attempt.prepared.ok:
            try:
                attempt.future.result()
                attempt.prepared.manifest = self._checksums(attempt.location)
            except WRITE_FAILURES as exc:  # reported to every rank by the commit phase
                attempt.prepared = _failed(exc)
        return self._commit(attempt)

    def _prepare(self, location: str, model: Any, optimizer: Any, lr_scheduler: Any,
                 dataloader: Any, extra: Any) -> tuple[_Prepared, Future[Any] | None]:
        rank = self.world.rank
        try:
            crash_point("prepare:before_write", rank)
            reader, consumed, events = self._capture_reader(dataloader)
            state = self._state_dict(model, optimizer, lr_scheduler, extra, reader)
            writer = self.storage.writer(location, _Writer, rank)
            if self.async_save:
                response = dcp_async_save(state, storage_writer=writer,
                                          process_group=self.world.group,
                                          no_dist=not self.world.distributed)
                future = (response.upload_completion
                          if isinstance(response, AsyncSaveResponse) else response)
                return _Prepared(True, reader=reader, consumed=consumed, events=events), future
            with _one_process():
                dcp_save(state, storage_writer=writer, process_group=self.world.group,
                         no_dist=not self.world.distributed)
            manifest = self._checksums(location)
            crash_point("prepare:after_write", rank)
            return _Prepared(True, manifest=manifest, reader=reader, consumed=consumed,
                             events=events), None
        except WRITE_FAILURES as exc:  # DCP's CheckpointException is a BaseException
            log.error("rank %d failed to prepare checkpoint %s: %s", rank, location,
                      describe_failure(exc))
            return _failed(exc), None

    def _capture_reader(self, dataloader: Any) -> tuple[
            dict[str, Any] | None, list[ConsumptionRecord], list[LedgerEvent]]:
        if dataloader is None:
            return None, [], []
        dataset = dataset_of(dataloader)
        state = reader_state_of(dataloader)
        if state.plan is None:  # nothing iterated yet
            return state.to_dict(), [], []
        consumed = consumed_between(dataset, self._baseline, state)
        events = [LedgerEvent(name, detail)
                  for name, detail in segment_events(dataset, self._baseline, state)]
        return state.to_dict(), consumed, events

    def _state_dict(self, model: Any, optimizer: Any, lr_scheduler: Any, extra: Any,
                    reader: dict[str, Any] | None) -> dict[str, Any]:
        state: dict[str, Any] = {_rank_key(self.world.rank): {
            "rng": _rng_state(), "reader": json.dumps(reader)}}
        if model is not None:
            state[MODEL] = get_model_state_dict(model)
        if optimizer is not None:
            _check_optimizer(model, optimizer, self.run_id)
            state[OPTIMIZER] = get_optimizer_state_dict(model, optimizer)
        if lr_scheduler is not None:
            state[LR_SCHEDULER] = lr_scheduler.state_dict()
        if extra is not None:
            state[EXTRA] = dict(extra)
        return state

    def _checksums(self, location: str) -> dict[str, Any]:
        """This rank's files: its DCP data files, and ``.metadata`` on rank 0."""
        prefix = f"__{self.world.rank}_"
        names = [n for n in self.storage.list(location) if n.startswith(prefix)]
        if self.world.rank == 0:
            names.append(_METADATA)
        return self.storage.checksums(location, names)

    def _commit(self, attempt: _Attempt) -> CheckpointRecord:
        reports = self.world.gather(attempt.prepared)
        outcome: CheckpointRecord | errors.LakeckptError = CheckpointError("no outcome")
        if self.world.rank == 0:
            outcome = self._decide(attempt, reports)
        # errors cross ranks as typed values: every rank raises the same exception
        outcome = self.world.broadcast(outcome)
        if isinstance(outcome, errors.LakeckptError):
            raise outcome
        record = outcome
        self._baseline = ReaderState.from_dict(decode_state(record.reader_state)) \
            if record.reader_state else self._baseline
        self._head = record
        if self.world.rank == 0:
            self._committed(record)
        return record

    def _decide(self, attempt: _Attempt,
                reports: list[_Prepared]) -> CheckpointRecord | errors.LakeckptError:
        """Rank 0: commit if every rank prepared (the commit point), else abort."""
        failed = [(r, p) for r, p in enumerate(reports) if not p.ok]
        if failed:
            self._remove(attempt.location)
            detail = "; ".join(f"rank {r}: {p.error}" for r, p in failed)
            kind = CheckpointWriteError if any(p.write for _, p in failed) else CheckpointError
            return kind(f"checkpoint of run {self.run_id} at step {attempt.step} under "
                        f"{self.root} was not saved, nothing was committed: {detail}")
        try:
            record, consumption = self._records(attempt, reports)
            if self._head is not None and self._head.step == attempt.step:
                return self._same_step(attempt, record)
            crash_point("commit:before", 0)
            # rank 0's reader sees the same follow segments as every rank (they are derived
            # from the commit log alone), so its events speak for all
            committed = self._ledger_commit(record, consumption, reports[0].events)
            crash_point("commit:after", 0)
            return committed
        except errors.CommitStateUnknownError as exc:
            # a landed commit may name the files: they stay, gc decides later from the ledger
            return exc
        except errors.CommitConflictError as exc:
            self._remove(attempt.location)  # certainly not landed: nothing names the files
            return exc
        except errors.LakeckptError as exc:
            self._remove(attempt.location)
            return exc
        except Exception as exc:
            log.exception("ledger commit of run %s step %d failed", self.run_id, attempt.step)
            return CheckpointError(f"ledger commit of run {self.run_id} step {attempt.step} "
                                   f"failed: {describe_failure(exc)}")

    def _same_step(self, attempt: _Attempt,
                   record: CheckpointRecord) -> CheckpointRecord | errors.LakeckptError:
        """A second save at the step this job committed (or restored) last.

        The common "final save after the loop" at a step the loop already saved: the same
        content (model files byte for byte, reader state) is that checkpoint, returned as
        committed; other content at a committed step is a conflict.
        """
        head = self._head
        assert head is not None
        self._remove(attempt.location)
        if (head.reader_state == record.reader_state
                and _data_files(head.manifest) == _data_files(record.manifest)):
            log.info("run %s: step %d is already committed with the same content as "
                     "checkpoint %s", self.run_id, head.step, head.checkpoint_id)
            return head
        return errors.CommitConflictError(
            f"run {self.run_id} step {attempt.step} is already committed as checkpoint "
            f"{head.checkpoint_id} with other content (the model, optimizer or reader state "
            "changed since); save it under a later step")

    def _ledger_commit(self, record: CheckpointRecord, consumption: list[ConsumptionRecord],
                       events: list[LedgerEvent]) -> CheckpointRecord:
        """Commit, asking again after an unknown outcome: the ledger's settle step reads the
        log (the run's app transaction, the snapshot summaries) and returns the stored record
        if the first try landed."""
        assert self.ledger is not None
        for attempt in range(_UNKNOWN_OUTCOME_TRIES):
            try:
                return self.ledger.commit(record, consumption, events, owner=self.owner)
            except errors.CommitStateUnknownError as exc:
                if attempt + 1 == _UNKNOWN_OUTCOME_TRIES:
                    raise
                log.warning("run %s step %d: %s; asking the ledger again", self.run_id,
                            record.step, exc)
                time.sleep(0.2 * 2 ** attempt)
        raise AssertionError("unreachable")

    def _remove(self, location: str) -> None:
        """Delete a checkpoint directory (one nobody names, or one retention lets go)."""
        self.storage.delete(location)

    def _records(self, attempt: _Attempt,
                 reports: list[_Prepared]) -> tuple[CheckpointRecord, list[ConsumptionRecord]]:
        manifest: dict[str, Any] = {}
        for report in reports:
            manifest.update(report.manifest)
        readers = [r.reader for r in reports if r.reader is not None]
        reader = merge_states(readers) if readers else None
        if reader is not None and reader.plan is not None and not reader.complete:
            raise CheckpointError(f"run {self.run_id} step {attempt.step}: the ranks' reader "
                                  "states do not cover every rank and worker")
        consumption = [c for report in reports for c in report.consumed]
        record = CheckpointRecord(
            run_id=self.run_id, checkpoint_id=attempt.checkpoint_id, step=attempt.step,
            parent_id=self._head.checkpoint_id if self._head is not None else None,
            model_location=attempt.location, manifest=manifest,
            reader_state=encode_state(reader) if reader is not None else "",
            source=None if reader is None else reader.table,
            source_version=None if reader is None else reader.version,
            world_size=self.world.size, tags=attempt.tags, config_hash=self.config_hash,
            wall_time_s=time.monotonic() - self._started)
        return record, consumption

    # ------------------------------------------------------------------------ restore

    def restore(
        self,
        *,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: Any = None,
        dataloader: Any = None,
        extra: dict[str, Any] | None = None,
        step: int | None = None,
        tag: str | None = None,
    ) -> int | None:
        """Load the run's latest committed checkpoint that verifies (or the one asked for).

        A checkpoint whose files fail verification (or whose ledger record fails its checksum)
        is skipped for the newest earlier one that verifies, and retired, so its step can be
        saved again. One ledger commit records the retirements, the ``restore`` event and makes
        this job the run's one writer: a job still writing the run is fenced. Call before
        iterating the dataloader. ``extra``, if given, is filled in place.

        Returns:
            The restored step, or None for a fresh run.

        Raises:
            CheckpointError: ``step``/``tag`` names no committed checkpoint, or none verifies.
            StateMismatchError: the checkpoint's reader state is of another table or config.
            LedgerCorruptError: a ledger file is unreadable (the error names it and the way
                out).
        """
        self.wait()
        choice: Any = None
        if self.world.rank == 0:
            choice = self._choose_and_claim(step, tag)
        choice = self.world.broadcast(choice)
        if isinstance(choice, errors.LakeckptError):
            raise choice
        if isinstance(choice, tuple):
            raise CheckpointError(choice[1])
        if choice is None:
            return None
        record: CheckpointRecord = choice
        if record.config_hash != self.config_hash:
            log.warning("run %s: restoring step %d, saved under configuration %s, with "
                        "configuration %s; later checkpoints record the new one",
                        self.run_id, record.step, record.config_hash, self.config_hash)
        self.storage.check_visible(self.world, self.run_id, record.step, record.model_location,
                                   record.manifest)
        self._load_files(record, model, optimizer, lr_scheduler, extra)
        if dataloader is not None and record.reader_state:
            state = ReaderState.from_dict(decode_state(record.reader_state))
            restore_reader(dataloader, state)
            self._baseline = state
        self._head = record
        return record.step

    def _choose_and_claim(self, step: int | None, tag: str | None) -> Any:
        """Rank 0: :meth:`_choose`, again if another job committed to the run meanwhile."""
        for attempt in range(_CLAIM_TRIES):
            try:
                return self._choose(step, tag)
            except errors.RunFencedError as exc:
                return exc
            except errors.CommitConflictError as exc:
                if attempt + 1 == _CLAIM_TRIES:
                    return exc
                log.warning("run %s: %s", self.run_id, exc)
            except errors.LakeckptError as exc:
                return exc
        raise AssertionError("unreachable")

    def _choose(self, step: int | None,
                tag: str | None) -> CheckpointRecord | tuple[str, str] | None:
        """Rank 0: the checkpoint to restore, or ("error", message), or None (fresh run).

        Checkpoints that fail verification on the way down (and records that fail their
        checksum) are retired in the same ledger commit that makes this job the run's owner
        and records the restore (NOTE [ retired and damaged records ] in ledger/base.py).
        """
        assert self.ledger is not None
        self._run_cache = None
        scan = self.ledger.scan(self.run_id)
        records = [r for r in scan.committed
                   if (step is None or r.step == step) and (tag is None or tag in r.tags)]
        newest = max([r.step for r in scan.committed] + [d.step for d in scan.damaged],
                     default=None)
        if not records:
            if step is None and tag is None and not scan.damaged:
                # a fresh start still takes the run over: a job whose checkpoints are all
                # gone (repaired away) may have left its claim behind
                self.ledger.claim(self.run_id, self.owner, head=None)
                return None
            if step is None and tag is None:
                self._start_over([], scan)
                return None
            return "error", (f"run {self.run_id} has no committed checkpoint with step={step} "
                             f"tag={tag} in {self.ledger.describe()}")
        skipped: list[dict[str, Any]] = []
        removed = []
        for record in reversed(records):
            if not self.storage.exists(record.model_location):
                removed.append(record.step)  # model files removed by retention or gc
                continue
            problems = self.storage.verify(record.model_location, record.manifest)
            if not problems:
                self._claim(record, newest, skipped, scan,
                            explicit=step is not None or tag is not None)
                return record
            log.warning("checkpoint %s (step %d) of run %s fails verification: %s",
                        record.checkpoint_id, record.step, self.run_id, "; ".join(problems))
            skipped.append({"checkpoint_id": record.checkpoint_id, "step": record.step,
                            "problems": problems})
        if step is None and tag is None and not removed:
            self._start_over(skipped, scan)
            return None
        return "error", self._none_restorable(skipped, removed, scan)

    def _start_over(self, skipped: list[dict[str, Any]], scan: RunScan) -> None:
        """Rank 0: every checkpoint of the run is damaged. Retire them all and start the run
        from its beginning: a fresh model reads the data from the start, so no row trains a
        model twice and none is skipped; what the damaged checkpoints had trained is lost,
        and the ledger says so (``retired`` events and a ``restart`` event)."""
        assert self.ledger is not None
        events = _retired_events(skipped, scan)
        steps = sorted({int(e.detail["step"]) for e in events})
        log.warning("run %s: no checkpoint under %s can be restored (%s); they are retired and "
                    "the run starts over from its beginning", self.run_id, self.root,
                    self._none_restorable(skipped, [], scan))
        events.append(LedgerEvent("restart", {"retired_steps": steps, "owner": self.owner}))
        self.ledger.claim(self.run_id, self.owner, events, head=None, check_head=False)

    def _none_restorable(self, skipped: list[dict[str, Any]], removed: list[int],
                         scan: RunScan) -> str:
        detail = [f"step {s['step']}: {'; '.join(s['problems'])}" for s in skipped]
        if removed:
            detail.append(f"steps {sorted(removed)}: model files removed by retention "
                          f"(keep_last={self.keep_last}) or gc")
        if scan.damaged:
            detail.append(f"steps {sorted(d.step for d in scan.damaged)}: ledger records fail "
                          "their checksum")
        return (f"no checkpoint of run {self.run_id} under {self.root} can be restored: "
                f"{' | '.join(detail)}")

    def _claim(self, chosen: CheckpointRecord, newest: int | None,
               skipped: list[dict[str, Any]], scan: RunScan, *, explicit: bool) -> None:
        """Rank 0: one ledger commit that retires what restore skipped, records the restore
        and makes this job the run's one writer (the previous job is fenced)."""
        assert self.ledger is not None
        events = _retired_events(skipped, scan, after_step=chosen.step)
        if skipped or events:
            log.warning("run %s: restoring step %d (%s) instead of newer checkpoints that "
                        "cannot be used: %s", self.run_id, chosen.step, chosen.checkpoint_id,
                        [e.detail["step"] for e in events])
            events.append(LedgerEvent("restore_fallback", {
                "restored": chosen.checkpoint_id, "step": chosen.step, "skipped": skipped}))
        newest_step = chosen.step if newest is None else newest
        events.append(LedgerEvent("restore", {
            "checkpoint_id": chosen.checkpoint_id, "step": chosen.step,
            "newest_step": newest_step, "steps_lost": newest_step - chosen.step,
            "owner": self.owner}))
        self.ledger.claim(self.run_id, self.owner, events, head=chosen.checkpoint_id,
                          check_head=not explicit)

    def _load_files(self, record: CheckpointRecord, model: Any, optimizer: Any,
                    lr_scheduler: Any, extra: dict[str, Any] | None) -> None:
        rank = self.world.rank
        state: dict[str, Any] = {}
        own = rank < record.world_size
        if own:
            state[_rank_key(rank)] = {"rng": _rng_state(), "reader": ""}
        if model is not None:
            state[MODEL] = get_model_state_dict(model)
        if optimizer is not None:
            _check_optimizer(model, optimizer, self.run_id)
            state[OPTIMIZER] = get_optimizer_state_dict(model, optimizer)
        if lr_scheduler is not None:
            state[LR_SCHEDULER] = lr_scheduler.state_dict()
        if extra is not None:
            state[EXTRA] = extra
        with _one_process():
            dcp_load(state, storage_reader=self.storage.reader(record.model_location),
                     process_group=self.world.group, no_dist=not self.world.distributed)
        if model is not None:
            set_model_state_dict(model, state[MODEL])
        if optimizer is not None:
            set_optimizer_state_dict(model, optimizer, state[OPTIMIZER])
        if lr_scheduler is not None:
            lr_scheduler.load_state_dict(state[LR_SCHEDULER])
        if extra is not None:
            extra.update(state[EXTRA])
        if own:
            _set_rng_state(state[_rank_key(rank)]["rng"])

    # ---------------------------------------------------------------------- retention

    def checkpoints(self) -> list[CheckpointRecord]:
        """This run's committed checkpoints, oldest first (rank 0 reads the ledger)."""
        records = list(self.ledger.checkpoints(self.run_id)) if self.ledger is not None else []
        return self.world.broadcast(records)

    def _run_records(self) -> list[CheckpointRecord]:
        """Rank 0: the run's committed checkpoints, read once, then kept up to date by
        :meth:`_committed` (re-reading the ledger after every commit grows with its size)."""
        assert self.ledger is not None
        if self._run_cache is None:
            self._run_cache = list(self.ledger.checkpoints(self.run_id))
        return self._run_cache

    def _committed(self, record: CheckpointRecord) -> None:
        """Rank 0, after a commit: remember it, retire old model files, compact now and then."""
        if self._registration is not None:
            self._registration.committed(record)
        records = self._run_records()
        if not any(r.checkpoint_id == record.checkpoint_id for r in records):
            records.append(record)
        self._retire_old()
        self._commits += 1
        if self._commits % self.compact_every == 0:
            self._compact()

    def _compact(self) -> None:
        """Rank 0: compact the ledger; the checkpoint is committed, so a failure here is an
        event (``compaction_failed``), never a failed save."""
        assert self.ledger is not None
        try:
            self.ledger.compact()
        except Exception as exc:
            log.warning("run %s: ledger compaction failed (the checkpoint is committed): %s",
                        self.run_id, describe_failure(exc))
            try:
                self.ledger.record_events(self.run_id, [LedgerEvent(
                    "compaction_failed", {"error": describe_failure(exc)})])
            except Exception:
                log.exception("run %s: the compaction_failed event was not recorded",
                              self.run_id)

    def _retire_old(self) -> None:
        untagged = [r for r in self._run_records() if not r.tags]
        old = untagged[: max(len(untagged) - self.keep_last, 0)]
        if old:  # `lakeckpt tag` may have tagged one since the records were read
            assert self.ledger is not None
            tagged = self.ledger.tags(self.run_id)
            old = [r for r in old if r.checkpoint_id not in tagged]
        for record in old:
            self._remove(record.model_location)

    def gc(self) -> list[str]:
        """Remove model files no retained committed checkpoint needs (collective).

        Removes directories of aborted attempts (never committed) and of checkpoints beyond
        ``keep_last`` that carry no tag. Never touches a directory a retained checkpoint names,
        and runs only in the job that owns the run: another owner's attempt in flight is not
        provably unreferenced.

        Returns:
            The directories removed (on rank 0; empty elsewhere).

        Raises:
            RunFencedError: another job owns the run now; nothing was removed.
        """
        self.wait()
        removed: list[str] = []
        fenced: errors.RunFencedError | None = None
        if self.world.rank == 0:
            assert self.ledger is not None
            owner = self.ledger.owner(self.run_id)
            if owner is not None and owner != self.owner:
                fenced = errors.RunFencedError(
                    f"run {self.run_id} under {self.root} is owned by job {owner}, not this job "
                    f"{self.owner}: gc removes nothing (an attempt of the owner may be in "
                    "flight); run it from the owning job, or restore first")
        fenced = self.world.broadcast(fenced)
        if fenced is not None:
            raise fenced
        if self.world.rank == 0:
            assert self.ledger is not None
            self._run_cache = None  # gc is explicit: read the ledger afresh
            self._retire_old()
            keep = {r.model_location for r in self._run_records()}
            for name in self.storage.list(self.run_id):
                location = f"{self.run_id}/{name}"
                if location not in keep:
                    self._remove(location)
                    removed.append(location)
        self.world.barrier()
        return removed


def _retired_events(skipped: list[dict[str, Any]], scan: RunScan,
                    after_step: int | None = None) -> list[LedgerEvent]:
    """``retired`` events for what restore skipped: checkpoints whose model files fail
    verification, and records failing their checksum (only those after ``after_step``)."""
    events = [LedgerEvent(EVENT_RETIRED, {
        "checkpoint_id": s["checkpoint_id"], "step": s["step"],
        "reason": "model files fail verification: " + "; ".join(s["problems"])})
        for s in skipped]
    events += [LedgerEvent(EVENT_RETIRED, {
        "checkpoint_id": d.checkpoint_id, "step": d.step,
        "reason": f"its ledger {d.record} record fails its checksum"})
        for d in scan.damaged
        if d.checkpoint_id and (after_step is None or d.step > after_step)]
    return events


def _failed(exc: BaseException) -> _Prepared:
    return _Prepared(False, error=describe_failure(exc), write=is_write_failure(exc))


def _data_files(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest without DCP's ``.metadata``, which holds a fresh save id every time."""
    return {name: digest for name, digest in manifest.items() if name != _METADATA}


def _check_optimizer(model: torch.nn.Module | None, optimizer: torch.optim.Optimizer,
                     run_id: str) -> None:
    """Refuse an optimizer over parameters the model does not hold, before anything is written.

    torch.distributed.checkpoint keys optimizer state by the model's parameter names; state of
    a parameter outside the model has no name and would fail deep inside torch (``KeyError``).
    """
    if model is None:
        raise CheckpointError(f"run {run_id}: saving or restoring an optimizer needs the model "
                              "whose parameters it updates (model=...)")
    owned = {id(p) for p in model.parameters()}
    foreign = [tuple(p.shape) for group in optimizer.param_groups for p in group["params"]
               if id(p) not in owned]
    if foreign:
        raise CheckpointError(
            f"run {run_id}: the optimizer updates {len(foreign)} parameter(s) that are not "
            f"parameters of the model given (shapes {foreign[:5]}); their state could not be "
            "named in the checkpoint. Pass a model that holds every parameter the optimizer "
            "updates (e.g. an nn.ModuleDict of all trained modules), or one optimizer per model")


def _config_hash(config: Mapping[str, Any]) -> str:
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state()}


def _set_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
