"""``RunLedger``: the one ledger commit that makes a checkpoint exist, whoever wrote its files.

NOTE [ someone else's checkpoint ]
The two-phase commit needs only two things of a checkpoint's files: that they are durable
before the ledger commit that names them, and that a resume starts from the newest checkpoint
the ledger committed. So the commit is a step of its own. Once a trainer (Lightning, the
Hugging Face Trainer, Ray Train, or :class:`~lakeckpt_tables.checkpoint.CheckpointManager`'s
own DCP writer) has finished writing a checkpoint at a location under the root, every rank
captures its reader state and the rows it consumed since the previous checkpoint; rank 0
checksums the files it can read at the location and makes ONE ledger commit holding the
checkpoint record (step, location, checksums, the merged reader state of every rank and
worker) and every rank's consumption; every rank learns the outcome. A location the ledger does
not name is not a checkpoint: a resume asks the ledger (:meth:`RunLedger.resume`), never the
trainer's directory. A trainer checkpoint newer than the last commit (a crash between the
trainer's save and the commit) is reported (:class:`~lakeckpt_tables.errors.
UncommittedCheckpointWarning`) and, asked for by name, refused
(:class:`~lakeckpt_tables.errors.UncommittedCheckpointError`).

The files stay the trainer's: with ``keep_last=None`` (the default here) the ledger deletes
none, and the trainer's own rotation must keep the newest committed checkpoint (each
integration makes sure: docs/integrations.md). Fencing, audits, ``verify``, progress and steps
lost hold as for the manager: they read the same records.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

from lakeckpt_tables import errors
from lakeckpt_tables.checkpoint import readers, registration
from lakeckpt_tables.checkpoint._world import World
from lakeckpt_tables.checkpoint.commit import Attempt, Committer, Prepared, failed, sealed
from lakeckpt_tables.checkpoint.progress import Progress
from lakeckpt_tables.checkpoint.restore_policy import Choice, RestorePolicy, Takeover
from lakeckpt_tables.checkpoint.retention import Retention
from lakeckpt_tables.errors import (
    CheckpointError,
    SharedRendezvousStoreWarning,
    UncommittedCheckpointError,
    UncommittedCheckpointWarning,
)
from lakeckpt_tables.io.checkpoint_storage import CheckpointStorage
from lakeckpt_tables.ledger import CheckpointRecord, open_ledger
from lakeckpt_tables.ledger.settling import now_utc
from lakeckpt_tables.reader import decode_state

__all__ = ["RunLedger"]

log = logging.getLogger(__name__)


class RunLedger:
    """A run's checkpoints as the ledger knows them: commit one a trainer wrote, resume from one.

    Every method but :meth:`heartbeat` and :meth:`location_of` is collective: call it on all
    ranks (a process without torch.distributed is a world of one).

    Args:
        root: the directory (or URI) the trainer writes its checkpoints under, seen by every
            rank; locations are relative to it.
        run_id: the run; a ledger holds many runs.
        ledger: a :class:`~lakeckpt_tables.ledger.Ledger`, a spec for
            :func:`~lakeckpt_tables.ledger.open_ledger`, or None for a Delta ledger at
            ``<root>/_ledger``.
        keep_last: None (the default): the trainer deletes its own checkpoints and the ledger
            none. A number: committed checkpoints beyond it lose their files at the next
            commit (tagged ones never), as with :class:`CheckpointManager`.
        compact_every, config, storage_options, takeover, live_for: as for
            :class:`~lakeckpt_tables.checkpoint.CheckpointManager`.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        run_id: str,
        *,
        ledger: Any = None,
        keep_last: int | None = None,
        compact_every: int = 100,
        config: Mapping[str, Any] | None = None,
        storage_options: Mapping[str, str] | None = None,
        takeover: Takeover = "fence",
        live_for: float | None = None,
    ) -> None:
        if not run_id or "/" in run_id:
            raise ValueError(f"run_id must be a non-empty name without '/', got {run_id!r}")
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
        if takeover not in ("fence", "refuse"):
            raise ValueError(f"takeover must be 'fence' or 'refuse', got {takeover!r}")
        self.root = os.fspath(root)
        self.storage = CheckpointStorage(self.root, storage_options)
        self.run_id = run_id
        self.keep_last = keep_last
        self.world = World()
        self.ledger = open_ledger(ledger, storage=self.storage.store
                                  ) if self.world.rank == 0 else None
        self.config_hash = _config_hash(config or {})
        # This job's token as the run's one writer (NOTE [ one writer per run ] in
        # ledger/base.py); 62 bits, so that Delta can keep it as an app transaction version.
        self.owner = self.world.broadcast(str(uuid.uuid4().int >> 66))
        self._progress, self.policy, self._committer, self._register = _rank0_parts(
            self, takeover, live_for, compact_every, config)
        # the run's registry entry, made when this job first writes the run (a claim or a
        # commit): a job that only reads it leaves the entry alone
        self._registration: registration.RunRegistration | None = None
        self.baseline: dict[str, Any] | None = None
        """The merged reader state of the last checkpoint committed or resumed: what the next
        commit's consumption is counted from."""
        self.head: CheckpointRecord | None = None
        """The checkpoint this job committed or resumed last."""
        # NOTE [ one root for all ranks ]: refused now, before any training step
        self.storage.prove_shared(self.world, self.run_id)
        if self.world.rank == 0:
            _warn_if_shared_rendezvous_store()

    # ------------------------------------------------------------------------- commit

    def commit(
        self,
        step: int,
        location: str,
        *,
        dataloader: Any = None,
        tags: Sequence[str] = (),
        checkpoint_id: str | None = None,
    ) -> CheckpointRecord:
        """Commit the checkpoint the trainer finished writing at ``location`` (collective).

        Call it on every rank once the trainer's save returned on every rank (its files are
        durable): the reader state of every rank and worker, the rows each consumed since the
        previous checkpoint, ``step``, ``location`` and the checksums of its files go into
        one ledger commit. Nothing is written to ``location``.

        Args:
            step: the trainer's step; strictly increasing within the run.
            location: the checkpoint's directory or file, relative to the root or a path/URI
                under it (rank 0's value counts).
            dataloader: a torchdata ``StatefulDataLoader`` over a :class:`LakeDataset` or a
                :class:`Mixture`, exactly as training iterates it (None: no reader state).
            tags: labels kept with the checkpoint.
            checkpoint_id: the id to commit under (rank 0's value counts); a fresh one by
                default. An integration that writes the id into the trainer's checkpoint
                before the commit passes it here.

        Returns:
            The committed record.

        Raises:
            CheckpointError: some rank failed to capture its reader state, or nothing is at
                ``location``; nothing was committed.
            RunFencedError, CommitConflictError, CommitStateUnknownError: as for
                :meth:`CheckpointManager.save`.
        """
        where = self.world.decide(lambda: self.location_of(location))  # rank 0's counts
        checkpoint_id = self.world.broadcast(checkpoint_id or uuid.uuid4().hex)
        attempt = Attempt(step, checkpoint_id, where, tuple(tags),
                          self._prepare(where, dataloader))
        return self.commit_attempt(attempt)

    def commit_attempt(self, attempt: Attempt) -> CheckpointRecord:
        """Phase 2 of every checkpoint, the manager's included: ranks seal (NOTE [ consumption
        sealed where made ]), rank 0 decides and commits, every rank hears the outcome."""
        attempt.committed_at = self.world.broadcast(now_utc())
        reports = self.world.gather_to_root(sealed(attempt, self.run_id, self.owner))
        outcome: CheckpointRecord | errors.LakeckptError = CheckpointError("no outcome")
        if self._committer is not None and reports is not None:
            outcome = self._committer.decide(attempt, reports, self.head, self.world.size)
        outcome = self.world.broadcast(outcome)
        if isinstance(outcome, errors.LakeckptError):
            raise outcome
        record = outcome
        self.baseline = decode_state(record.reader_state) \
            if record.reader_state else self.baseline
        self.head = record
        if self._committer is not None:
            registered = self.registered()
            if registered is not None:
                registered.committed(record)
            self._committer.committed(record)
        return record

    def registered(self) -> registration.RunRegistration | None:
        """This run's registry entry (rank 0, unless registration is off), made at first
        use."""
        if self._registration is None and self._register is not None:
            self._registration = self._register()
        return self._registration

    def _prepare(self, location: str, dataloader: Any) -> Prepared:
        """Phase 1 of a checkpoint whose files are written: this rank's reader state and
        consumption, and on rank 0 the checksums of the files at ``location``. A failure is
        a value, reported to every rank by the commit (no rank waits for a rank that raised)."""
        try:
            reader, consumed, events = readers.capture(dataloader, self.baseline)
            manifest: dict[str, Any] = {}
            if self.world.rank == 0:
                names = self.storage.files(location)
                if not names:
                    return Prepared(False, error=(
                        f"nothing is at {self.storage.url(location)}: commit once the "
                        "trainer's save has finished, with the location it wrote"))
                manifest = self.storage.checksums(location, names)
            return Prepared(True, manifest=manifest, reader=reader, consumed=consumed,
                            events=events)
        except Exception as exc:
            log.error("rank %d could not prepare the commit of %s: %s", self.world.rank,
                      location, exc)
            return failed(exc)

    # ------------------------------------------------------------------------- resume

    def resume(
        self,
        *,
        dataloader: Any = None,
        location: str | None = None,
        checkpoint_id: str | None = None,
        found: Iterable[str] = (),
        require: bool = False,
    ) -> CheckpointRecord | None:
        """Ask the ledger which checkpoint to resume from, take the run over, and load the
        checkpoint's reader state into ``dataloader`` (collective; before iterating it).

        The trainer then loads its own files from ``location_url(record)``. Without
        ``location``/``checkpoint_id`` this is the run's newest checkpoint whose files verify
        (NOTE [ what restore skips ]).

        Args:
            dataloader: the ``StatefulDataLoader`` the reader state is loaded into (None:
                the caller loads ``decode_state(record.reader_state)`` itself).
            location: resume exactly the checkpoint the trainer was asked to resume from (a
                path under the root or relative to it).
            checkpoint_id: resume exactly this committed checkpoint.
            found: the trainer's checkpoint locations present now; those the ledger never
                committed are reported with :class:`UncommittedCheckpointWarning`.
            require: refuse to start fresh when the run has no checkpoint.

        Returns:
            The checkpoint resumed, or None for a fresh run.

        Raises:
            UncommittedCheckpointError: ``location``/``checkpoint_id`` names no committed
                checkpoint of the run (a trainer save the ledger never committed).
            CheckpointRestoreError, RunInUseError: as for :meth:`CheckpointManager.restore`.
        """
        asked = self.location_of(location) if location is not None else None
        committed = self.world.decide(self._committed)
        self._report_uncommitted(committed, found)
        step = self._asked_step(committed, asked, checkpoint_id)
        choice: Choice = self.world.decide(lambda: self._policy().choose(
            step, None, require=require))
        self.world.decide(lambda: self._policy().claim(choice))
        self.registered()
        if self._committer is not None:
            self._committer.retention.forget()
        record = choice.record
        self.head = record
        if record is None:
            return None
        if record.reader_state:
            reader = decode_state(record.reader_state)
            if dataloader is not None:
                readers.restore(dataloader, reader)
            self.baseline = reader
        return record

    def _committed(self) -> list[tuple[int, str, str]]:
        ledger = self.ledger
        assert ledger is not None
        return [(r.step, r.checkpoint_id, r.model_location)
                for r in ledger.checkpoints(self.run_id)]

    def _policy(self) -> RestorePolicy:
        assert self.policy is not None
        return self.policy

    def _asked_step(self, committed: list[tuple[int, str, str]], location: str | None,
                    checkpoint_id: str | None) -> int | None:
        if location is None and checkpoint_id is None:
            return None
        for step, cid, where in committed:
            if (location is None or where == location) and \
                    (checkpoint_id is None or cid == checkpoint_id):
                return step
        newest = committed[-1] if committed else None
        asked = " ".join(x for x in (
            f"location {self.storage.url(location)}" if location is not None else "",
            f"checkpoint id {checkpoint_id}" if checkpoint_id is not None else "") if x)
        raise UncommittedCheckpointError(
            f"run {self.run_id}: the trainer checkpoint asked for ({asked}) was never "
            "committed to the ledger (the job stopped between the trainer's save and the "
            "ledger commit, or it was saved without the integration's callback), so the rows "
            "it trained are not on record and resuming from it would repeat or skip rows. "
            + (f"Resume from the newest committed checkpoint instead: step {newest[0]} at "
               f"{self.storage.url(newest[2])}" if newest is not None else
               "The run has no committed checkpoint: start it fresh")
            + ". Nothing was changed")

    def _report_uncommitted(self, committed: list[tuple[int, str, str]],
                            found: Iterable[str]) -> None:
        named = {where for _, _, where in committed}
        stray = sorted({self.location_of(f) for f in found} - named)
        if stray and self.world.rank == 0:
            warnings.warn(UncommittedCheckpointWarning(
                f"run {self.run_id}: trainer checkpoint(s) {stray} under {self.storage.root} "
                "were never committed to the ledger (a crash between the trainer's save and "
                "the ledger commit, or a save without the integration's callback): they are "
                "not resumed from" + (f"; resuming from step {committed[-1][0]} at "
                                      f"{committed[-1][2]}" if committed else "")
                + ". Remove them, or leave them for the trainer's rotation"), stacklevel=3)

    # -------------------------------------------------------------------------- other

    def checkpoints(self) -> list[CheckpointRecord]:
        """The run's committed checkpoints, oldest first (collective: rank 0 reads)."""
        return self.world.decide(lambda: list(self.ledger.checkpoints(self.run_id))
                                 if self.ledger is not None else [])

    def heartbeat(self, step: int) -> None:
        """Note that training reached ``step`` (not collective): see
        :meth:`CheckpointManager.heartbeat`."""
        if self._progress is not None:
            self._progress.beat(step)

    def location_of(self, path: str | os.PathLike[str]) -> str:
        """``path`` relative to the root (a path or URI under it, or already relative).

        Raises:
            CheckpointError: an absolute path or URI outside the root.
        """
        text = os.fspath(path)
        root = self.storage.root.rstrip("/")
        if "://" not in text and not os.path.isabs(text):
            return text.strip("/")
        if "://" not in root:
            text = os.path.abspath(text)
            root = os.path.abspath(root)
        if text.startswith(root + "/"):
            return text[len(root) + 1:].strip("/")
        raise CheckpointError(
            f"run {self.run_id}: the trainer checkpoint {text} is not under the ledger's root "
            f"{root}: build the RunLedger with the directory the trainer writes into")

    def url(self, record: CheckpointRecord) -> str:
        """Where the files of ``record`` are (a path or URI the trainer can load)."""
        return self.storage.url(record.model_location)


def _rank0_parts(run: RunLedger, takeover: Takeover, live_for: float | None,
                 compact_every: int, config: Mapping[str, Any] | None) -> tuple[
        Progress | None, RestorePolicy | None, Committer | None,
        Callable[[], registration.RunRegistration | None] | None]:
    """Rank 0's deciders (None elsewhere): heartbeat, restore policy, committer, and how to
    register the run."""
    ledger, storage, run_id, owner = run.ledger, run.storage, run.run_id, run.owner
    if ledger is None:
        return None, None, None, None
    retention = Retention(ledger, storage, run_id, keep_last=run.keep_last,
                          compact_every=compact_every)
    progress = Progress(storage, run_id, owner)
    policy = RestorePolicy(ledger, storage, run_id, owner, keep_last=run.keep_last or 0,
                           takeover=takeover, live_for=live_for, progress=progress)
    committer = Committer(ledger, storage, retention, run_id=run_id, owner=owner,
                          config_hash=run.config_hash)
    register = partial(registration.for_run, run_id, ledger, root=run.root,
                       config_hash=run.config_hash, config=config)
    return progress, policy, committer, register


def _warn_if_shared_rendezvous_store() -> None:
    """NOTE [ elastic restarts in place ]: torchrun (torch 2.13) hands its workers the agent's
    rendezvous TCP store unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``; after an in-place
    restart (``--max-restarts``), the new gloo group then races for the dead worker's address
    ("connectFullMesh ... Connection refused", about one restart in two, pytorch#135712). The
    agent's environment is the user's, so the library cannot set it: it says so at start."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    restarts = os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")
    if not restarts.isdigit() or int(restarts) == 0:
        return
    warnings.warn(SharedRendezvousStoreWarning(
        f"torchrun restarts this job's workers in place (--max-restarts {restarts}) and shares "
        "its rendezvous store with them: with torch 2.13 the restarted process group can fail "
        "to connect (pytorch/pytorch#135712), and the restart is lost. Launch torchrun with "
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in its environment (docs/integrations.md)"),
        stacklevel=3)


def _config_hash(config: Mapping[str, Any]) -> str:
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
