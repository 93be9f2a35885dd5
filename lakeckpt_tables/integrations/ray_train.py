"""Ray Train (``TorchTrainer``): each ``ray.train.report(checkpoint=...)`` is committed to the
ledger, and a worker group Ray restarts (``FailureConfig(max_failures=...)``) resumes from the
checkpoint the ledger committed, its reader exactly where that checkpoint left it.

NOTE [ Ray's checkpoints in the ledger ]
Ray persists a reported checkpoint while ``report`` runs on every worker, and registers it as
the run's latest later, in its controller: a worker killed right after a report is restarted
with ``ray.train.get_checkpoint()`` one checkpoint behind the last report, and a checkpoint
reported but never committed (a kill between the report and the commit) may be Ray's latest.
So the ledger decides: :meth:`RayTrainLedger.resume` returns the ledger's newest committed
checkpoint (the directory Ray persisted, ``checkpoint-<step>`` under the run's storage), never
``get_checkpoint()``'s when they differ. Each report names its directory
(``checkpoint_dir_name``), so the ledger commit made right after it, on every worker, names the
directory Ray wrote.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import ray.train

from lakeckpt_tables.checkpoint import RunLedger
from lakeckpt_tables.ledger import CheckpointRecord

__all__ = ["RayTrainLedger"]

log = logging.getLogger(__name__)


class RayTrainLedger:
    """The ledger of a Ray Train run, used inside ``train_loop_per_worker`` on every worker.

    Args:
        root: the run's storage directory, ``RunConfig.storage_path`` joined with
            ``RunConfig.name`` (Ray persists checkpoints there; the ledger lives at
            ``<root>/_ledger``), seen by every worker.
        run_id: the run; a ledger holds many runs.
        **options: ``ledger``, ``config``, ``storage_options``, ``takeover`` for
            :class:`~lakeckpt_tables.checkpoint.RunLedger`.
    """

    def __init__(self, root: str | os.PathLike[str], run_id: str, **options: Any) -> None:
        self.run = RunLedger(root, run_id, **options)
        """The :class:`RunLedger` underneath (collective, on Ray's process group)."""

    def resume(self, dataloader: Any) -> ray.train.Checkpoint | None:
        """The ledger's newest committed checkpoint as a Ray ``Checkpoint`` (None: a fresh
        run), its reader state loaded into ``dataloader`` (collective; before iterating it).
        Load the model from it, not from ``ray.train.get_checkpoint()`` (NOTE [ Ray's
        checkpoints in the ledger ])."""
        found = [n for n in self.run.storage.list("") if n.startswith("checkpoint-")]
        record = self.run.resume(dataloader=dataloader, found=found)
        ray_latest = ray.train.get_checkpoint()
        if record is None:
            return None
        if ray_latest is not None and os.path.basename(ray_latest.path.rstrip("/")) \
                != record.model_location:
            log.warning("run %s: Ray's latest checkpoint is %s, the ledger's newest committed "
                        "is %s (step %d): resuming from the ledger's", self.run.run_id,
                        ray_latest.path, record.model_location, record.step)
        return ray.train.Checkpoint(self.run.url(record))

    def report(self, metrics: Mapping[str, Any], *, step: int, dataloader: Any,
               checkpoint_dir: str | None) -> CheckpointRecord:
        """``ray.train.report`` of this worker's checkpoint files (``checkpoint_dir``; None on
        a worker that writes none), persisted as ``checkpoint-<step>``, then the ledger commit
        naming that directory (collective: call it on every worker)."""
        name = f"checkpoint-{step}"
        checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir) \
            if checkpoint_dir is not None else None
        ray.train.report(dict(metrics), checkpoint=checkpoint,
                         checkpoint_dir_name=name if checkpoint is not None else None)
        return self.run.commit(step, name, dataloader=dataloader)

    def heartbeat(self, step: int) -> None:
        """See :meth:`RunLedger.heartbeat`."""
        self.run.heartbeat(step)
