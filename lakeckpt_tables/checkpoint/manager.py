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
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from lakeckpt_tables import errors
from lakeckpt_tables.checkpoint import registration
from lakeckpt_tables.checkpoint._failures import WRITE_FAILURES, describe_failure
from lakeckpt_tables.checkpoint._faults import crash_point
from lakeckpt_tables.checkpoint._world import World
from lakeckpt_tables.checkpoint.commit import Attempt, Committer, Prepared, failed
from lakeckpt_tables.checkpoint.consumption import consumed_between, segment_events
from lakeckpt_tables.checkpoint.restore_policy import (
    DCP_METADATA,
    Choice,
    RestorePolicy,
    Takeover,
)
from lakeckpt_tables.checkpoint.retention import Retention
from lakeckpt_tables.checkpoint.state import Parts, apply_state, build_state, check_fits
from lakeckpt_tables.errors import CheckpointError
from lakeckpt_tables.io.checkpoint_storage import CheckpointStorage
from lakeckpt_tables.ledger import CheckpointRecord, LedgerEvent, open_ledger
from lakeckpt_tables.reader import (
    ReaderState,
    dataset_of,
    decode_state,
    reader_state_of,
    restore_reader,
)

__all__ = ["CheckpointManager"]

log = logging.getLogger(__name__)

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


class CheckpointManager:
    """Saves and restores checkpoints of one run, committed through a ledger.

    Every method is collective: call it on all ranks (a process without torch.distributed is a
    world of one). Rank 0 decides with a :class:`~.restore_policy.RestorePolicy` (which
    checkpoint to restore), a :class:`~.commit.Committer` (commit or abort) and a
    :class:`~.retention.Retention` (which model files to keep).

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
        takeover: what :meth:`restore` does when another job owns the run. ``"fence"`` (the
            default) takes the run over: the restart after a crash must not wait for the dead
            job, so the newest restore wins and a job still writing the run fails at its next
            save with ``RunFencedError``. ``"refuse"`` keeps a live owner: restore raises
            ``RunInUseError`` naming it while it committed within ``live_for`` seconds (a
            dead owner's run is still taken over).
        live_for: see ``takeover``; None for three of the run's recent save intervals (at
            least a minute; ten minutes before its second checkpoint).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        run_id: str,
        *,
        ledger: Any = None,
        keep_last: int = 3,
        async_save: bool = False,
        compact_every: int = 100,
        config: Mapping[str, Any] | None = None,
        storage_options: Mapping[str, str] | None = None,
        takeover: Takeover = "fence",
        live_for: float | None = None,
    ) -> None:
        if not run_id or "/" in run_id:
            raise ValueError(f"run_id must be a non-empty name without '/', got {run_id!r}")
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        if takeover not in ("fence", "refuse"):
            raise ValueError(f"takeover must be 'fence' or 'refuse', got {takeover!r}")
        self.root = os.fspath(root)
        self.storage = CheckpointStorage(self.root, storage_options)
        self._root_shared = False
        self.run_id = run_id
        self.keep_last = keep_last
        self.async_save = async_save
        self.world = World()
        self.ledger = open_ledger(ledger, root=self.root,
                                  storage_options=self.storage.ledger_options()
                                  ) if self.world.rank == 0 else None
        self.config_hash = _config_hash(config or {})
        # This job's token as the run's one writer (NOTE [ one writer per run ] in
        # ledger/base.py); 62 bits, so that Delta can keep it as an app transaction version.
        self.owner = self.world.broadcast(str(uuid.uuid4().int >> 66))
        self._registration = None
        self._policy: RestorePolicy | None = None
        self._committer: Committer | None = None
        if self.ledger is not None:
            retention = Retention(self.ledger, self.storage, run_id, keep_last=keep_last,
                                  compact_every=compact_every)
            self._policy = RestorePolicy(self.ledger, self.storage, run_id, self.owner,
                                         keep_last=keep_last, takeover=takeover,
                                         live_for=live_for)
            self._committer = Committer(self.ledger, self.storage, retention, run_id=run_id,
                                        owner=self.owner, config_hash=self.config_hash)
            self._registration = registration.for_run(run_id, self.ledger, root=self.root,
                                                      config_hash=self.config_hash,
                                                      config=config)
        self._baseline: ReaderState | None = None
        self._head: CheckpointRecord | None = None  # what this job committed or restored last
        self._pending: Attempt | None = None

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
        parts = Parts(model, optimizer, lr_scheduler, extra)
        prepared, future = self._prepare(location, parts, dataloader)
        attempt = Attempt(step, checkpoint_id, location, tuple(tags), prepared, future)
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
                attempt.prepared = failed(exc)
        return self._commit(attempt)

    def _prepare(self, location: str, parts: Parts,
                 dataloader: Any) -> tuple[Prepared, Future[Any] | None]:
        """Phase 1 on this rank: write the shard, capture reader state and consumption."""
        rank = self.world.rank
        try:
            crash_point("prepare:before_write", rank)
            reader, consumed, events = self._capture_reader(dataloader)
            state = build_state(parts, rank, reader=json.dumps(reader), run_id=self.run_id)
            writer = _Writer(self.storage.url(location), rank, **self.storage.fsspec_options())
            if self.async_save:
                response = dcp_async_save(state, storage_writer=writer,
                                          process_group=self.world.group,
                                          no_dist=not self.world.distributed)
                future = (response.upload_completion
                          if isinstance(response, AsyncSaveResponse) else response)
                return Prepared(True, reader=reader, consumed=consumed, events=events), future
            with _one_process():
                dcp_save(state, storage_writer=writer, process_group=self.world.group,
                         no_dist=not self.world.distributed)
            manifest = self._checksums(location)
            crash_point("prepare:after_write", rank)
            return Prepared(True, manifest=manifest, reader=reader, consumed=consumed,
                            events=events), None
        except WRITE_FAILURES as exc:  # DCP's CheckpointException is a BaseException
            log.error("rank %d failed to prepare checkpoint %s: %s", rank, location,
                      describe_failure(exc))
            return failed(exc), None

    def _capture_reader(self, dataloader: Any) -> tuple[
            dict[str, Any] | None, list[Any], list[LedgerEvent]]:
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

    def _checksums(self, location: str) -> dict[str, Any]:
        """This rank's files: its DCP data files, and ``.metadata`` on rank 0."""
        prefix = f"__{self.world.rank}_"
        names = [n for n in self.storage.list(location) if n.startswith(prefix)]
        if self.world.rank == 0:
            names.append(DCP_METADATA)
        return self.storage.checksums(location, names)

    def _commit(self, attempt: Attempt) -> CheckpointRecord:
        """Phase 2: rank 0 decides; every rank raises the same error or gets the record."""
        reports = self.world.gather(attempt.prepared)
        outcome: CheckpointRecord | errors.LakeckptError = CheckpointError("no outcome")
        if self._committer is not None:
            outcome = self._committer.decide(attempt, reports, self._head, self.world.size)
        outcome = self.world.broadcast(outcome)
        if isinstance(outcome, errors.LakeckptError):
            raise outcome
        record = outcome
        self._baseline = ReaderState.from_dict(decode_state(record.reader_state)) \
            if record.reader_state else self._baseline
        self._head = record
        if self._committer is not None:
            if self._registration is not None:
                self._registration.committed(record)
            self._committer.committed(record)
        return record

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
        require: bool = False,
    ) -> int | None:
        """Load the run's latest checkpoint that can be restored (or the one asked for).

        A checkpoint whose files are missing or fail verification (or whose ledger record
        fails its checksum) is skipped for the newest earlier one that verifies, and retired,
        so its step can be saved again (NOTE [ what restore skips ]). Once every rank checked
        that the model and optimizer fit, one ledger commit records the retirements and the
        ``restore`` event and makes this job the run's one writer (see ``takeover``). A
        restore that raises has committed nothing. Call before iterating the dataloader.
        ``extra``, if given, is filled in place.

        Args:
            step, tag: restore exactly this checkpoint (the run's newest otherwise).
            require: refuse to start fresh when the run has no checkpoint (a typo in
                ``run_id`` would otherwise train a second run from scratch).

        Returns:
            The restored step, or None for a fresh run.

        Raises:
            CheckpointRestoreError: the model or optimizer does not fit the checkpoint (keys
                and shapes listed); ``step``/``tag`` names no restorable checkpoint (removed
                by retention, damaged); ``require`` and the run has no checkpoint.
            RunInUseError: ``takeover="refuse"`` and a live job owns the run.
            StateMismatchError: the checkpoint's reader state is of another table or config.
            LedgerCorruptError: a ledger file is unreadable (the error names it and the way
                out).
        """
        self.wait()
        parts = Parts(model, optimizer, lr_scheduler, extra)
        for attempt in range(_CLAIM_TRIES):
            choice: Choice = self._rank0(partial(self._policy_choose, step, tag, require))
            record = choice.record
            own = record is not None and self.world.rank < record.world_size
            state = {} if record is None else build_state(
                parts, self.world.rank, reader="" if own else None, run_id=self.run_id)
            if record is not None:
                self._check_restorable(record, state)
            try:
                self._rank0(partial(self._policy_claim, choice))
                break
            except errors.RunFencedError:
                raise
            except errors.CommitConflictError as exc:  # another job committed: choose again
                if attempt + 1 == _CLAIM_TRIES:
                    raise
                log.warning("run %s: %s", self.run_id, exc)
        if self._committer is not None:
            self._committer.retention.forget()
        if record is None:
            return None
        with _one_process():
            dcp_load(state, storage_reader=self.storage.reader(record.model_location),
                     process_group=self.world.group, no_dist=not self.world.distributed)
        apply_state(parts, state, self.world.rank)
        if dataloader is not None and record.reader_state:
            reader = ReaderState.from_dict(decode_state(record.reader_state))
            restore_reader(dataloader, reader)
            self._baseline = reader
        self._head = record
        return record.step

    def _policy_choose(self, step: int | None, tag: str | None, require: bool) -> Choice:
        assert self._policy is not None
        return self._policy.choose(step, tag, require=require)

    def _policy_claim(self, choice: Choice) -> None:
        assert self._policy is not None
        self._policy.claim(choice)

    def _check_restorable(self, record: CheckpointRecord, state: dict[str, Any]) -> None:
        """Collective, before the claim: every rank sees the files and its state fits."""
        if record.config_hash != self.config_hash:
            log.warning("run %s: restoring step %d, saved under configuration %s, with "
                        "configuration %s; later checkpoints record the new one",
                        self.run_id, record.step, record.config_hash, self.config_hash)
        self.storage.check_visible(self.world, self.run_id, record.step, record.model_location,
                                   record.manifest)
        problem: errors.LakeckptError | None = None
        try:
            metadata = self.storage.reader(record.model_location).read_metadata()
            check_fits(state, metadata, run_id=self.run_id, step=record.step)
        except errors.LakeckptError as exc:
            problem = exc
        problems = [p for p in self.world.gather(problem) if p is not None]
        if problems:
            raise problems[0]

    def _rank0(self, decide: Any) -> Any:
        """Rank 0 runs ``decide``; every rank gets its value or raises its error."""
        outcome: Any = None
        if self.world.rank == 0:
            try:
                outcome = decide()
            except errors.LakeckptError as exc:
                outcome = exc
        outcome = self.world.broadcast(outcome)
        if isinstance(outcome, errors.LakeckptError):
            raise outcome
        return outcome

    # ---------------------------------------------------------------------- retention

    def checkpoints(self) -> list[CheckpointRecord]:
        """This run's committed checkpoints, oldest first (rank 0 reads the ledger)."""
        records = list(self.ledger.checkpoints(self.run_id)) if self.ledger is not None else []
        return self.world.broadcast(records)

    def gc(self) -> list[str]:
        """Remove model files no retained committed checkpoint needs (collective).

        Removes directories of aborted attempts (never committed) and of checkpoints beyond
        ``keep_last`` that carry no tag (recorded as ``removed`` events). Never touches a
        directory a retained checkpoint names, and runs only in the job that owns the run:
        another owner's attempt in flight is not provably unreferenced.

        Returns:
            The directories of aborted attempts removed (on rank 0; empty elsewhere).

        Raises:
            RunFencedError: another job owns the run now; nothing was removed.
        """
        self.wait()
        removed = self._rank0(lambda: self._committer.retention.gc(self.owner)
                              if self._committer is not None else [])
        self.world.barrier()
        return removed if self.world.rank == 0 else []


def _config_hash(config: Mapping[str, Any]) -> str:
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
