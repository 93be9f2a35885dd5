"""PyTorch Lightning 2.x: add ``LakeLedger(run_id)`` to the Trainer's callbacks, and every
checkpoint Lightning saves is committed to the ledger; ``Trainer.fit(..., ckpt_path=...)``
resumes the reader exactly where the committed checkpoint left it, on every rank.

NOTE [ Lightning's checkpoints in the ledger ]
Why a callback (that installs a thin ``CheckpointIO`` of its own), not a ``CheckpointIO``
plugin alone: Lightning calls ``CheckpointIO.save_checkpoint`` on rank 0 only, and the ledger
commit needs every rank's reader state and consumption, which only hooks that run on every rank
can gather; callbacks are also what Lightning users add for everything else, and the
``CheckpointIO`` slot stays free for the user's own plugin (wrapped, not replaced). The parts:
- ``setup`` (every rank, after Lightning's ``pre_setup`` barrier): a rank without the callback
  is named before the first collective (NOTE [ a callback on every rank ]).
- ``on_save_checkpoint`` (every rank, inside ``Trainer.save_checkpoint``, before the file is
  written): one checkpoint id per step, broadcast by rank 0, goes into the checkpoint under
  ``"lakeckpt"`` with rank 0's loader state as of the batches TRAINED (see below).
- The wrapped ``CheckpointIO`` (rank 0) notes the path each id was written to, and defers
  deleting the file of the ledger's newest committed checkpoint (``ModelCheckpoint``'s
  ``save_top_k`` rotation deletes the previous file right after writing the new one, before
  the commit names the new one) until a newer commit has landed.
- The commit runs in this callback's hooks after ``ModelCheckpoint``'s (``setup`` moves the
  callback last): ``on_train_batch_end``, ``on_train_epoch_end``, ``on_validation_end``,
  ``on_fit_end``, on every rank, once ``Trainer.save_checkpoint`` returned (its barrier
  passed: the file is written). A crash between the write and the commit leaves a file the
  ledger does not name: resuming from it is refused (``UncommittedCheckpointError``).
- Resume: ``on_load_checkpoint`` (every rank) asks the ledger for the checkpoint id the file
  carries, takes the run over, and puts the ledger's merged reader state (every rank and
  worker) into the loader state Lightning restores, so each rank resumes its own slices.
  Lightning alone saves rank 0's loader state and loads it into every rank.
- Batches trained, not fetched: Lightning's fetcher fetches one batch ahead of the one being
  trained, so at a save the loader's state counts a batch not trained yet (restoring it would
  skip that batch). The state committed is the loader's state as of the previous batch end
  whenever a batch is held ahead.
"""

from __future__ import annotations

import copy
import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import CheckpointIO

from lakeckpt_tables.checkpoint import RunLedger
from lakeckpt_tables.errors import (
    CheckpointError,
    CheckpointRestoreError,
    LoaderStateLostError,
    UncommittedCheckpointError,
)
from lakeckpt_tables.integrations._every_rank import DEFAULT_PEER_TIMEOUT, require_every_rank
from lakeckpt_tables.ledger import CheckpointRecord
from lakeckpt_tables.mixture import Mixture
from lakeckpt_tables.reader import LakeDataset, decode_state

__all__ = ["CHECKPOINT_KEY", "LakeLedger"]

log = logging.getLogger(__name__)

CHECKPOINT_KEY = "lakeckpt"
"""Key of a Lightning checkpoint holding ``{"run_id", "checkpoint_id", "step", "loader"}``."""

_SNAPSHOT, _WORKERS, _DATASET, _FINISHED = (
    "_snapshot", "_worker_snapshots", "dataset_state", "_iterator_finished")


@dataclass
class _Pending:
    """A save of this step, written or being written, not committed yet."""

    step: int
    checkpoint_id: str
    state: dict[str, Any]  # this rank's loader state as of the batches trained


class LakeLedger(Callback):
    """Commit every checkpoint Lightning saves to the ledger; resume the reader from it exactly.

    Add it to ``Trainer(callbacks=[...])`` beside ``ModelCheckpoint``; the train dataloader must
    be a torchdata ``StatefulDataLoader(dataset, batch_size=None)`` over a :class:`LakeDataset`
    or a :class:`Mixture`. Then ``trainer.fit(model, ckpt_path=...)`` (a path, or ``"last"``)
    resumes exactly (NOTE [ Lightning's checkpoints in the ledger ]).

    Args:
        run_id: the run; a ledger holds many runs.
        root: where the checkpoints are written (default: the ``dirpath`` of the Trainer's
            ``ModelCheckpoint``, which must then be given).
        ledger, config, storage_options, takeover: as for
            :class:`~lakeckpt_tables.checkpoint.RunLedger`.
        peer_timeout: seconds ``setup`` waits for this callback on every other rank before
            raising :class:`~lakeckpt_tables.errors.CallbackMissingError` naming the ranks
            without it (NOTE [ a callback on every rank ]).
    """

    def __init__(self, run_id: str, *, root: str | os.PathLike[str] | None = None,
                 ledger: Any = None, config: Mapping[str, Any] | None = None,
                 storage_options: Mapping[str, str] | None = None,
                 takeover: Any = "fence", peer_timeout: float = DEFAULT_PEER_TIMEOUT) -> None:
        self.run_id = run_id
        self.peer_timeout = peer_timeout
        self.root = os.fspath(root) if root is not None else None
        self._options = {"ledger": ledger, "config": config,
                         "storage_options": storage_options, "takeover": takeover}
        self._run: RunLedger | None = None
        self._io: _LedgerIO | None = None
        self._pending: _Pending | None = None
        self._prev: dict[str, Any] | None = None
        self.resumed: CheckpointRecord | None = None
        """The ledger's checkpoint this fit resumed from (None: a fresh run)."""

    @property
    def run(self) -> RunLedger:
        """The run's :class:`RunLedger` (from ``setup`` on)."""
        if self._run is None:
            raise CheckpointError("LakeLedger is used before Trainer.fit set it up")
        return self._run

    @property
    def state_key(self) -> str:
        return f"LakeLedger{{run_id={self.run_id}}}"

    # --------------------------------------------------------------------- set up

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if self._run is None:
            root = self.root or _dirpath(trainer)
            # before RunLedger's first collective, which a rank without us never joins
            require_every_rank(f"LakeLedger(run_id={self.run_id!r}) to the Trainer's callbacks",
                               self.run_id, self.peer_timeout)
            self._run = RunLedger(root, self.run_id, **self._options)
        # after every ModelCheckpoint, so that our hooks commit what its hooks saved
        callbacks: list[Any] = trainer.callbacks  # type: ignore[attr-defined]
        if callbacks[-1] is not self:
            callbacks.remove(self)
            callbacks.append(self)
        io = trainer.strategy.checkpoint_io
        if not isinstance(io, _LedgerIO):
            io = _LedgerIO(io, self)
            trainer.strategy.checkpoint_io = io
        self._io = io

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        mark = checkpoint.get(CHECKPOINT_KEY)
        path = trainer.ckpt_path
        if not isinstance(mark, Mapping) or mark.get("run_id") != self.run_id:
            raise UncommittedCheckpointError(
                f"run {self.run_id}: the Lightning checkpoint {path} was not saved by "
                f"LakeLedger(run_id={self.run_id!r}) (saved without the callback, or by "
                "another run), so the ledger never committed it and holds no reader state "
                "for it: resume from a checkpoint this run's LakeLedger saved, or start a "
                "new run_id. Nothing was changed")
        record = self.run.resume(checkpoint_id=str(mark["checkpoint_id"]),
                                 found=self._found())
        assert record is not None
        skeleton = mark.get("loader")
        if not isinstance(skeleton, Mapping) or not record.reader_state:
            raise LoaderStateLostError(
                f"run {self.run_id}: checkpoint {path} (step {record.step}) holds no "
                "loader state: it was saved while the train dataloader was not a "
                "StatefulDataLoader over a LakeDataset. Nothing was loaded")
        loops = checkpoint["loops"]["fit_loop"]["state_dict"]
        loops["combined_loader"] = [_with_reader_state(skeleton,
                                                       decode_state(record.reader_state))]
        self.resumed = record

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.resumed is not None:
            return
        committed = self.run.checkpoints()
        if committed:
            newest = committed[-1]
            raise CheckpointRestoreError(
                f"run {self.run_id} has {len(committed)} committed checkpoint(s), the newest "
                f"step {newest.step} at {self.run.url(newest)}, but Trainer.fit was given no "
                "ckpt_path: training it from scratch would train its rows again. Pass "
                f"ckpt_path={self.run.url(newest)!r} (or 'last'), or use a new run_id")
        self.run.resume()  # a fresh run: this job owns it from now on

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._prev = _loader(trainer).state_dict()

    # ----------------------------------------------------------------------- save

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        step = trainer.global_step
        if self._pending is None or self._pending.step != step:
            # one id per step: a save_last copy of the same step carries the same id
            checkpoint_id = self.run.world.broadcast(uuid.uuid4().hex)
            self._pending = _Pending(step, checkpoint_id, self._trained_state(trainer))
        checkpoint[CHECKPOINT_KEY] = {"run_id": self.run_id, "step": step,
                                      "checkpoint_id": self._pending.checkpoint_id,
                                      "loader": self._pending.state}

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        self._commit(trainer)
        self._prev = _loader(trainer).state_dict()
        self.run.heartbeat(trainer.global_step)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._commit(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._commit(trainer)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._commit(trainer)

    def _commit(self, trainer: Trainer) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        assert self._io is not None
        where = self._io.saved.get(pending.checkpoint_id, "")
        if self.run.world.rank == 0 and not where:
            raise CheckpointError(
                f"run {self.run_id}: Lightning saved step {pending.step} without writing a "
                "file through the trainer's checkpoint_io: nothing to commit (a strategy "
                "that writes checkpoints itself is not supported)")
        loader = _loader(trainer)
        record = self.run.commit(pending.step, where, checkpoint_id=pending.checkpoint_id,
                                 dataloader=_Frozen(loader, pending.state))
        self._io.committed(record)

    def _trained_state(self, trainer: Trainer) -> dict[str, Any]:
        """This rank's loader state as of the batches trained (NOTE [ Lightning's checkpoints
        in the ledger ]: the fetcher may hold one batch fetched ahead)."""
        live: dict[str, Any] = _loader(trainer).state_dict()
        fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
        ahead = len(getattr(fetcher, "batches", ()) or ())
        if ahead == 0:
            return live
        if ahead == 1 and self._prev is not None:
            return self._prev
        raise LoaderStateLostError(
            f"run {self.run_id}: Lightning's fetcher holds {ahead} batches fetched ahead of "
            "training; LakeLedger knows the loader's state one batch back only. Keep "
            "Lightning's default prefetch of one batch")

    def _found(self) -> list[str]:
        """The trainer's checkpoint files under the root (``last*`` copies aside)."""
        return [n for n in self.run.storage.list("")
                if n.endswith(".ckpt") and not n.startswith("last")]


class _LedgerIO(CheckpointIO):
    """The trainer's ``CheckpointIO``, wrapped: notes where each checkpoint id was written, and
    keeps the ledger's newest committed checkpoint from ``ModelCheckpoint``'s rotation until a
    newer one is committed."""

    def __init__(self, inner: CheckpointIO, callback: LakeLedger) -> None:
        self.inner = inner
        self.callback = callback
        self.saved: dict[str, str] = {}
        self._deferred: list[str] = []

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any = None) -> None:
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
        mark = checkpoint.get(CHECKPOINT_KEY)
        if isinstance(mark, Mapping):
            self.saved.setdefault(str(mark["checkpoint_id"]), os.fspath(path))

    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        loaded: dict[str, Any] = self.inner.load_checkpoint(path, *args, **kwargs)
        return loaded

    def remove_checkpoint(self, path: Any) -> None:
        head = self.callback.run.head
        run = self.callback.run
        if head is not None and run.location_of(os.fspath(path)) == head.model_location:
            log.info("run %s: %s is the ledger's newest committed checkpoint: removed once a "
                     "newer one is committed", run.run_id, path)
            self._deferred.append(os.fspath(path))
            return
        self.inner.remove_checkpoint(path)

    def committed(self, record: CheckpointRecord) -> None:
        """A newer checkpoint is committed: the removals deferred for the previous one run."""
        run = self.callback.run
        deferred, self._deferred = self._deferred, []
        for path in deferred:
            if run.location_of(path) != record.model_location:
                self.inner.remove_checkpoint(path)
        self.saved = {k: v for k, v in self.saved.items() if k == record.checkpoint_id}

    def teardown(self) -> None:
        self.inner.teardown()


class _Frozen:
    """A loader as it stood at a save: its dataset, and the state recorded then."""

    def __init__(self, loader: Any, state: dict[str, Any]) -> None:
        self.dataset = loader.dataset
        self.batch_size = loader.batch_size
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state


def _loader(trainer: Trainer) -> Any:
    """The train dataloader over the LakeDataset (or Mixture), checked to keep its state.

    Raises:
        LoaderStateLostError: no such loader, or one whose state Lightning cannot save.
    """
    combined = getattr(trainer.fit_loop, "_combined_loader", None)
    loaders = list(combined.flattened) if combined is not None else []
    ours = [dl for dl in loaders
            if isinstance(getattr(dl, "dataset", None), LakeDataset | Mixture)]
    if len(ours) != 1:
        raise LoaderStateLostError(
            f"LakeLedger needs exactly one train dataloader over a LakeDataset or a Mixture; "
            f"Lightning's train dataloaders are {[type(dl).__name__ for dl in loaders]}")
    loader = ours[0]
    if not callable(getattr(loader, "state_dict", None)) or \
            not callable(getattr(loader, "load_state_dict", None)):
        raise LoaderStateLostError(
            f"the train dataloader is a {type(loader).__module__}.{type(loader).__name__}: "
            "Lightning saves no state for it, so a resume would restart the data from its "
            "first row. Use torchdata's StatefulDataLoader(dataset, batch_size=None)")
    return loader


def _dirpath(trainer: Trainer) -> str:
    callback = trainer.checkpoint_callback
    dirpath = getattr(callback, "dirpath", None) if isinstance(callback, ModelCheckpoint) \
        else None
    if not dirpath:
        raise CheckpointError(
            "LakeLedger needs the directory checkpoints are written to: give "
            "ModelCheckpoint(dirpath=...) or LakeLedger(..., root=...)")
    return str(dirpath)


def _with_reader_state(skeleton: Mapping[str, Any], reader: dict[str, Any]) -> dict[str, Any]:
    """``skeleton`` (a StatefulDataLoader state) with every dataset state replaced by the
    ledger's merged reader state: each worker of each rank takes its own slices from it. The
    finished flag is cleared so that torchdata hands the state to the dataset (NOTE
    [ torchdata's end-of-pass trap ]): the dataset itself knows a finished pass."""
    state = copy.deepcopy(dict(skeleton))
    snapshot = state.get(_SNAPSHOT)
    if isinstance(snapshot, dict):
        for worker in snapshot.get(_WORKERS, {}).values():
            worker[_DATASET] = reader
    else:
        state[_DATASET] = reader
    state[_FINISHED] = False
    return state
