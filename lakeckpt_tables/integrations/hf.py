"""Hugging Face ``transformers.Trainer`` (on Accelerate): every ``checkpoint-N`` the Trainer saves
is committed to the ledger, and ``trainer.train(resume_from_checkpoint=...)`` resumes the reader
by a seek to the committed reader state, not by replaying the batches already trained.

NOTE [ the Hugging Face Trainer's checkpoints in the ledger ]
- The loader: the Trainer builds a ``DataLoader`` that batches the dataset's items and hands it
  to ``accelerator.prepare``, whose wrapper re-shards an iterable dataset over the processes
  (or dispatches rank 0's batches to all) and resumes by ``skip_first_batches`` (a replay).
  A ``LakeDataset`` makes its batches and shards its rows by rank itself, so
  :class:`LakeTrainer` (a ``Trainer`` whose ``get_train_dataloader`` returns
  ``StatefulDataLoader(train_dataset, batch_size=None)``, not prepared) is the loader's home;
  any other loader is refused by name (``LoaderStateLostError``) before a row trains.
- The replay: the callback sets ``args.ignore_data_skip = True`` when the Trainer is built
  (``on_init_end``), so the Trainer skips nothing; ``on_train_begin`` (every process, after the
  Trainer loaded ``checkpoint-N`` and before the loader is iterated) asks the ledger for the
  checkpoint of step N, takes the run over and loads its reader state into the loader; first,
  a process without the callback is named (NOTE [ a callback on every rank ]).
- The commit: ``on_save`` runs on every process after the Trainer wrote ``checkpoint-N`` (each
  process its own RNG file) and rotated old ones; :meth:`RunLedger.commit` is collective, so
  rank 0 checksums the directory once every process is in. ``save_total_limit=1`` would delete
  the ledger's newest committed checkpoint before the new one is committed: refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torchdata.stateful_dataloader import StatefulDataLoader
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from lakeckpt_tables.checkpoint import RunLedger
from lakeckpt_tables.errors import CheckpointError, CheckpointRestoreError, LoaderStateLostError
from lakeckpt_tables.integrations._every_rank import DEFAULT_PEER_TIMEOUT, require_every_rank
from lakeckpt_tables.io import Storage
from lakeckpt_tables.ledger import DEFAULT_LEDGER_DIR, CheckpointRecord, open_ledger
from lakeckpt_tables.mixture import Mixture
from lakeckpt_tables.reader import LakeDataset

__all__ = ["LakeTrainer", "LakeTrainerCallback"]

_CHECKPOINT = re.compile(r"checkpoint-(\d+)\Z")


class LakeTrainerCallback(TrainerCallback):
    """Commit every ``checkpoint-N`` the Trainer saves; resume the reader from the ledger.

    Use it through :class:`LakeTrainer` (which adds it and builds the loader), or add it to a
    ``Trainer`` whose ``get_train_dataloader`` returns a torchdata ``StatefulDataLoader``
    over a :class:`LakeDataset` with ``batch_size=None``, not prepared by Accelerate.

    Args:
        run_id: the run; a ledger holds many runs.
        ledger, config, storage_options, takeover: as for
            :class:`~lakeckpt_tables.checkpoint.RunLedger` (rooted at ``args.output_dir``).
        peer_timeout: seconds ``on_train_begin`` waits for this callback on every other rank
            before raising :class:`~lakeckpt_tables.errors.CallbackMissingError` naming the
            ranks without it (NOTE [ a callback on every rank ]).
    """

    def __init__(self, run_id: str, *, ledger: Any = None,
                 config: Mapping[str, Any] | None = None,
                 storage_options: Mapping[str, str] | None = None,
                 takeover: Any = "fence", peer_timeout: float = DEFAULT_PEER_TIMEOUT) -> None:
        self.run_id = run_id
        self.peer_timeout = peer_timeout
        self._options = {"ledger": ledger, "config": config,
                         "storage_options": storage_options, "takeover": takeover}
        self._run: RunLedger | None = None
        self.resumed: CheckpointRecord | None = None
        """The ledger's checkpoint this training resumed from (None: a fresh run)."""

    @property
    def run(self) -> RunLedger:
        """The run's :class:`RunLedger` (from ``on_train_begin`` on)."""
        if self._run is None:
            raise CheckpointError("LakeTrainerCallback is used before trainer.train began")
        return self._run

    def on_init_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        # the ledger's reader state seeks: the Trainer must not replay (skip_first_batches)
        args.ignore_data_skip = True
        if args.save_total_limit == 1:
            raise CheckpointError(
                "save_total_limit=1 makes the Trainer delete the previous checkpoint-N, the "
                "ledger's newest committed one, before the new one is committed: a crash "
                "between the two would leave no checkpoint to resume from. Use "
                "save_total_limit >= 2 (or None)")

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, train_dataloader: Any = None,
                       **kwargs: Any) -> None:
        loader = _checked(train_dataloader)
        if not args.ignore_data_skip:
            raise CheckpointError("args.ignore_data_skip was set back to False after the "
                                  "Trainer was built: the Trainer would replay the batches "
                                  "the ledger's reader state already skips")
        if self._run is None:
            # before RunLedger's first collective, which a rank without us never joins
            require_every_rank(f"LakeTrainerCallback({self.run_id!r}) to the Trainer's "
                               "callbacks (or use LakeTrainer)", self.run_id,
                               self.peer_timeout)
            self._run = RunLedger(str(args.output_dir), self.run_id, **self._options)
        run = self._run
        found = [n for n in run.storage.list("") if _CHECKPOINT.match(n)]
        if state.global_step > 0:  # the Trainer loaded checkpoint-<global_step>
            self.resumed = run.resume(dataloader=loader, found=found,
                                      location=f"checkpoint-{state.global_step}")
            return
        committed = run.checkpoints()
        if committed:
            newest = committed[-1]
            raise CheckpointRestoreError(
                f"run {self.run_id} has {len(committed)} committed checkpoint(s), the newest "
                f"step {newest.step} at {run.url(newest)}, but trainer.train was not asked to "
                "resume: training from scratch would train its rows again. Call "
                "trainer.train(resume_from_checkpoint=True), or use a new run_id")
        run.resume(dataloader=loader, found=found)  # a fresh run: this job owns it now

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        self.run.heartbeat(state.global_step)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                train_dataloader: Any = None, **kwargs: Any) -> None:
        if args.gradient_accumulation_steps != 1:
            raise CheckpointError(
                "gradient_accumulation_steps > 1: the Trainer fetches the batches of a step "
                "ahead of training them, so the loader's state at a save may count batches "
                "not trained yet; LakeTrainerCallback supports gradient_accumulation_steps=1")
        self.run.commit(state.global_step, f"checkpoint-{state.global_step}",
                        dataloader=_checked(train_dataloader))


class LakeTrainer(Trainer):
    """A ``transformers.Trainer`` training from a :class:`LakeDataset` (``train_dataset``) with
    exact resume: its loader is ``StatefulDataLoader(train_dataset, batch_size=None,
    num_workers=args.dataloader_num_workers)`` (not prepared by Accelerate: the dataset shards
    its rows by rank), and a :class:`LakeTrainerCallback` for ``run_id`` is added.

    Args:
        run_id: the run (see :class:`LakeTrainerCallback`).
        *args, **kwargs: as for ``transformers.Trainer``; ``ledger=``, ``storage_options=``
            and ``peer_timeout=`` go to the callback.
    """

    def __init__(self, *args: Any, run_id: str, ledger: Any = None,
                 storage_options: Mapping[str, str] | None = None,
                 peer_timeout: float = DEFAULT_PEER_TIMEOUT, **kwargs: Any) -> None:
        callbacks = list(kwargs.pop("callbacks", None) or [])
        callbacks.append(LakeTrainerCallback(run_id, ledger=ledger,
                                             storage_options=storage_options,
                                             peer_timeout=peer_timeout))
        kwargs["callbacks"] = callbacks
        super().__init__(*args, **kwargs)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any,
              **kwargs: Any) -> Any:
        """``transformers.Trainer.train``; ``resume_from_checkpoint=True`` means the ledger's
        newest committed ``checkpoint-N`` (the Trainer's own choice, the newest directory, may
        be one the ledger never committed)."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = self._newest_committed()
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _newest_committed(self) -> str | None:
        """Read-only, on every process: the ledger's newest checkpoint of the run, or None."""
        callback = next(c for c in self.callback_handler.callbacks
                        if isinstance(c, LakeTrainerCallback))
        spec = callback._options["ledger"]
        root = str(self.args.output_dir)
        store = Storage(root, callback._options["storage_options"])
        if spec is None and not store.exists(DEFAULT_LEDGER_DIR):
            return None  # no commit yet (and no process creates the ledger here)
        ledger = open_ledger(spec, storage=store)
        records = list(ledger.checkpoints(callback.run_id))
        if not records:
            return None
        return store.url(records[-1].model_location)

    def get_train_dataloader(self) -> Any:
        return StatefulDataLoader(self.train_dataset, batch_size=None,
                                  num_workers=self.args.dataloader_num_workers)


def _checked(loader: Any) -> Any:
    """The train loader, if it keeps a LakeDataset's state (NOTE [ the Hugging Face Trainer's
    checkpoints in the ledger ]).

    Raises:
        LoaderStateLostError: Accelerate's wrapper, the Trainer's own DataLoader, or another
            dataset.
    """
    dataset = getattr(loader, "dataset", None)
    inner = getattr(dataset, "dataset", None)  # accelerate's IterableDatasetShard
    if isinstance(loader, StatefulDataLoader) and isinstance(dataset, LakeDataset | Mixture) \
            and loader.batch_size is None:
        return loader
    kind = f"{type(loader).__module__}.{type(loader).__name__}"
    if type(loader).__module__.startswith("accelerate") or \
            isinstance(inner, LakeDataset | Mixture):
        why = ("Accelerate's dataloader wrapper (accelerator.prepare) re-shards or dispatches "
               "the rows a LakeDataset already shards by rank, and resumes by replaying "
               "batches")
    elif isinstance(dataset, LakeDataset | Mixture):
        why = ("the Trainer's own DataLoader batches the dataset's batches again and keeps no "
               "reader state")
    else:
        why = "it does not read a LakeDataset or a Mixture"
    raise LoaderStateLostError(
        f"the Trainer's train dataloader is a {kind}: {why}, so the reader state would be lost. "
        "Use LakeTrainer (its loader is StatefulDataLoader(train_dataset, batch_size=None), "
        "not prepared by Accelerate), or return such a loader from get_train_dataloader")

