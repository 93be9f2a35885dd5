"""How far a run's job got between checkpoints, so that a restore can say what a crash lost.

A checkpoint says which step was saved; a crash loses the steps trained after it, which no
commit records. :meth:`Progress.beat` (``CheckpointManager.heartbeat(step)``, called every step)
writes the step reached to one small object per run, at most once per interval, outside the
run's directory (which gc sweeps); restore reads it before taking the run over and records the
step in its ``restore`` event (``reached_step``), whence ``recoveries.steps_lost``. A failed
write or read only costs that figure: it is logged at debug level, never raised.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from lakeckpt_tables.io.checkpoint_storage import CheckpointStorage

__all__ = ["PROGRESS_DIR", "Progress"]

log = logging.getLogger(__name__)

PROGRESS_DIR = "_progress"
"""Directory under the checkpoint root holding ``<run_id>.json``: ``{"step", "owner", "at"}``."""


class Progress:
    """The run's progress object, written by its owner (rank 0)."""

    def __init__(self, storage: CheckpointStorage, run_id: str, owner: str, *,
                 every_s: float = 10.0) -> None:
        self.storage = storage
        self.owner = owner
        self.every_s = every_s
        self._key = f"{PROGRESS_DIR}/{run_id}.json"
        self._last = -float("inf")

    def beat(self, step: int) -> None:
        """Record ``step`` if the last write is older than the interval."""
        now = time.monotonic()
        if now - self._last < self.every_s:
            return
        self._last = now
        body = {"step": int(step), "owner": self.owner, "at": time.time()}
        try:
            self.storage.store.put(self._key, json.dumps(body).encode())
        except Exception as exc:  # a figure for the ledger, never a reason to stop training
            log.debug("progress of step %d not written: %s", step, exc)

    def reached(self) -> int | None:
        """The last step another job of the run recorded; None if unknown."""
        body = self._read()
        return int(body["step"]) if body and body.get("owner") != self.owner else None

    def last_beat(self, owner: str) -> float | None:
        """When ``owner`` last recorded a step (seconds since the epoch); None if unknown."""
        body = self._read()
        return float(body["at"]) if body and body.get("owner") == owner else None

    def _read(self) -> dict[str, Any] | None:
        try:
            body = json.loads(self.storage.store.read_bytes(self._key))
        except FileNotFoundError:
            return None
        except Exception as exc:
            log.debug("progress not read: %s", exc)
            return None
        return body if isinstance(body, dict) else None
