"""``CheckpointManager``: model, optimizer, RNG and reader position, visible together or not.

NOTE [ two-phase commit ]
Phase 1, prepare (every rank): write the model/optimizer shard with torch.distributed.checkpoint
into a directory unique to this attempt, capture the reader state and the rows consumed since
the previous checkpoint, checksum the files written, and report success or failure.
Phase 2, commit (rank 0): only if every rank prepared, make ONE ledger commit holding the
checkpoint record (with the merged reader state of all ranks and workers) and all consumption
records; then tell every rank the outcome. The consumption rows travel sealed: each rank builds
and checksums its own with the commit timestamp rank 0 broadcasts as phase 2 begins
(NOTE [ consumption sealed where made ] in ``ledger/records.py``). A directory the ledger does
not name is not a checkpoint: a crash at any instant leaves the previous or the new checkpoint
as the latest, and ``gc`` removes the orphans. With ``async_save=True`` the files are written in
the background and the commit happens at the next ``save`` (or ``wait``), so training overlaps
the write.

NOTE [ a save at the restored step ]
A job that restores step N and saves step N again without training (a finished run relaunched:
its loop yields nothing, then "the final save after the loop") must find that checkpoint, not
a conflict. But iterating a DataLoader draws its base seed from torch's RNG, so the RNG saved
would differ from the checkpoint's and the files with it. Such a save therefore puts back the
RNG states the restore left (the checkpoint's): the files are then byte for byte those of the
checkpoint if, and only if, the model, optimizer and reader state are unchanged.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lakeckpt_tables.checkpoint import registration
from lakeckpt_tables.checkpoint.commit import Attempt
from lakeckpt_tables.checkpoint.load import Loader
from lakeckpt_tables.checkpoint.prepare import Preparer
from lakeckpt_tables.checkpoint.restore_policy import Takeover
from lakeckpt_tables.checkpoint.run_ledger import RunLedger
from lakeckpt_tables.checkpoint.state import Parts, rng_state, set_rng_state
from lakeckpt_tables.errors import CheckpointError
from lakeckpt_tables.ledger import CheckpointRecord

__all__ = ["CheckpointManager"]

log = logging.getLogger(__name__)

_CLAIM_TRIES = 3


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
        if keep_last < 1:  # run_id and takeover are checked by RunLedger, with the same words
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        # the ledger side (commit, fencing, progress, registration) is the one every trainer
        # integration uses too (NOTE [ someone else's checkpoint ] in run_ledger.py); it
        # proves the root is shared by every rank (NOTE [ one root for all ranks ])
        self._run = RunLedger(root, run_id, ledger=ledger, keep_last=keep_last,
                              compact_every=compact_every, config=config,
                              storage_options=storage_options, takeover=takeover,
                              live_for=live_for)
        run = self._run
        self.root, self.storage, self.run_id, self.world = run.root, run.storage, run_id, run.world
        self.ledger, self.config_hash, self.owner = run.ledger, run.config_hash, run.owner
        self.keep_last = keep_last
        self.async_save = async_save
        self._committer, self._progress = run._committer, run._progress
        self._preparer = Preparer(self.storage, self.world, run_id, async_save=async_save)
        self._loader = Loader(self.storage, self.world, run.policy, run_id=run_id,
                              config_hash=self.config_hash)
        self._resumed: CheckpointRecord | None = None  # what this job restored (a branch's too)
        self._pending: Attempt | None = None
        self._claimed = False  # a restore made this job the run's writer
        self._restored_rng: dict[str, Any] | None = None  # each RNG as the restore left it
        self._read_only = False  # only read-only restores so far: not the run's writer

    @property
    def _baseline(self) -> dict[str, Any] | None:
        """The last checkpoint's merged reader state (consumption is counted from it)."""
        return self._run.baseline

    @_baseline.setter
    def _baseline(self, value: dict[str, Any] | None) -> None:
        self._run.baseline = value

    @property
    def _head(self) -> CheckpointRecord | None:
        """What this job committed or restored last."""
        return self._run.head

    @_head.setter
    def _head(self, value: CheckpointRecord | None) -> None:
        self._run.head = value

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
            dataloader: a torchdata ``StatefulDataLoader`` over a :class:`LakeDataset` or a
                :class:`Mixture` (NOTE [ mixture accounting ] in ``checkpoint/readers.py``).
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
        if self._restored_rng is not None and self._head is not None \
                and step == self._head.step:
            set_rng_state(self._restored_rng)
        self._restored_rng = None
        if self._read_only:
            raise CheckpointError(
                f"run {self.run_id}: this manager restored it read-only (to evaluate or "
                "inspect), so it is not the run's writer and cannot save; restore without "
                "read_only=True to train the run on, or branch a new run from the checkpoint")
        checkpoint_id = self.world.broadcast(uuid.uuid4().hex)
        location = f"{self.run_id}/step-{step:09d}-{checkpoint_id[:8]}"
        parts = Parts(model, optimizer, lr_scheduler, extra)
        prepared, future = self._preparer.prepare(location, parts, dataloader, self._baseline)
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
        self._preparer.finish(attempt)
        return self._commit(attempt)

    def _commit(self, attempt: Attempt) -> CheckpointRecord:
        """Phase 2: the ledger commit every client makes (:meth:`RunLedger.commit_attempt`)."""
        return self._run.commit_attempt(attempt)

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
        read_only: bool = False,
        from_run: str | None = None,
    ) -> int | None:
        """Load the run's latest checkpoint that can be restored (or the one asked for).

        A checkpoint whose files are missing or fail verification (or whose ledger record
        fails its checksum) is skipped for the newest earlier one that verifies, and retired,
        so its step can be saved again (NOTE [ what restore skips ]). Once every rank loaded
        the model, optimizer, scheduler, ``extra`` and the reader state, one ledger commit
        records the retirements and the ``restore`` event and makes this job the run's one
        writer (see ``takeover``). A restore that raises has committed nothing, whatever
        failed (NOTE [ restore loads, then claims ]). Call before iterating the dataloader.
        ``extra``, if given, is filled in place.

        Args:
            step, tag: restore exactly this checkpoint (the run's newest otherwise).
            require: refuse to start fresh when the run has no checkpoint (a typo in
                ``run_id`` would otherwise train a second run from scratch).
            read_only: load the checkpoint to evaluate or inspect it: nothing is committed
                (no event, no retirement) and the run's owner is not changed, so a job
                training the run saves on undisturbed. A keyword of ``restore`` rather than
                a method of its own because it chooses, checks and loads exactly as a
                restore does; only the claim is left out. This manager cannot ``save``
                after it (it is not the run's writer).
            from_run: branch this run from run ``from_run``'s checkpoint (a run of the same
                ledger; its newest, or ``step``/``tag``): a warm start, a fine-tune, a recipe
                change, a rewind (NOTE [ branched runs ]). The checkpoint is loaded (into
                ``dataloader`` too: the reader goes on from the parent's position; without
                one this run's reader starts afresh), and the claim records the lineage in a
                ``branch`` event; audits follow it. ``from_run``'s run is left untouched.
                Relaunched after this run saved, the same call resumes this run's own newest
                checkpoint.

        Returns:
            The restored step, or None for a fresh run.

        Raises:
            CheckpointRestoreError: the model or optimizer does not fit the checkpoint (keys
                and shapes listed), or loading anything failed on some rank (named);
                ``step``/``tag`` names no restorable checkpoint (removed by retention,
                damaged), or, without ``read_only``, one older than the run's newest (a
                rewind: branch a new run from it); ``require`` and the run has no checkpoint;
                ``read_only`` and no checkpoint of the run verifies; ``from_run`` and this run
                has checkpoints without being its branch.
            RunInUseError: ``takeover="refuse"`` and a live job owns the run.
            StateMismatchError: the checkpoint's reader state is not of the dataloader's
                tables, plan or schedule.
            LedgerCorruptError: a ledger file is unreadable (the error names it and the way
                out).
        """
        self.wait()
        if read_only and from_run is not None:
            raise ValueError("restore(read_only=True) reads a run's own checkpoint; to read "
                             f"run {from_run!r}'s, make a manager of run {from_run!r}")
        parts = Parts(model, optimizer, lr_scheduler, extra)
        choice, reader = self._loader.restore(parts, dataloader, step, tag, require=require,
                                              read_only=read_only, from_run=from_run)
        record = choice.record
        if read_only:
            self._read_only = self._read_only or (not self._claimed and self._head is None)
            return None if record is None else record.step
        self._read_only, self._claimed = False, True
        registered = self._registered()
        if registered is not None and choice.branch:
            detail = choice.events[0].detail
            registered.branched(detail["parent_run"], detail["parent_step"])
        if self._committer is not None:
            self._committer.retention.forget()
            self._committer.pending = []  # skips not committed before are not this lineage's
        if record is None:
            return None
        if dataloader is not None and reader is not None:
            self._baseline = reader
        self._resumed = record  # a branch's too: what a recipe change is measured from
        if self._committer is not None:
            self._committer.resumed = record
        # a branch's first save has no parent in its own run; its rows are counted from the
        # parent's reader state when the reader went on from it
        self._head = None if choice.branch else record
        # NOTE [ a save at the restored step ]: the RNG as the checkpoint holds it
        self._restored_rng = None if choice.branch else rng_state()
        return record.step

    def skip(self, dataloader: Any, *, batches: int | None = None, steps: int | None = None,
             batches_per_step: int = 1, reason: str, by: str | None = None) -> int:
        """Consume the next batches of ``dataloader`` without training (collective: every rank
        skips the same ones), and record them in the ledger as skipped, with the next
        checkpoint (NOTE [ skipped batches ] in ``checkpoint/skip.py``). Call after
        :meth:`restore`, before iterating; the loader then goes on after them.

        Args:
            batches: how many batches to skip; or ``steps`` x ``batches_per_step``.
            reason: why (kept in the ledger), e.g. ``"loss spike at step 1400"``.
            by: who decided (default: the user name of the process).

        Returns:
            The batches skipped (fewer when the loader ran out).

        Raises:
            CheckpointError: neither or both of ``batches`` and ``steps``, a count that is not
                positive, no reason.
        """
        from lakeckpt_tables.checkpoint.skip import skip_batches

        if (batches is None) == (steps is None):
            raise CheckpointError("skip(): pass batches=N or steps=N (with batches_per_step)")
        count = batches if batches is not None else (steps or 0) * batches_per_step
        self.wait()
        head = self._head or self._resumed
        pending = self._committer.pending if self._committer is not None else []
        done, state, events = skip_batches(
            self.world, dataloader, self._baseline, batches=count, reason=reason, by=by,
            after_step=head.step if head is not None else None,
            resumed_from=head.checkpoint_id if head is not None else None,
            index=sum(e.event == "skipped" for e in pending))
        pending.extend(events)
        self._baseline = state
        return done

    def _registered(self) -> registration.RunRegistration | None:
        """This run's registry entry (rank 0, unless registration is off), made at first use."""
        return self._run.registered()

    def heartbeat(self, step: int) -> None:
        """Note that training reached ``step`` (not collective; call it every step): rank 0
        writes it at most every 10 s, so that after a crash the restore records how many
        steps were trained after the restored checkpoint and lost (``recoveries.steps_lost``).
        """
        self._run.heartbeat(step)

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
        removed = self.world.decide(lambda: self._committer.retention.gc(self.owner)
                              if self._committer is not None else [])
        self.world.barrier()
        return removed if self.world.rank == 0 else []
