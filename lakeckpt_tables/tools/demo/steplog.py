"""What each training step trained: an append-only binary log, one record per step.

Every trained batch is logged with its step. A crash can lose steps after the last checkpoint
(and cut the last record short); the proof drops the logged steps after the step the next
attempt restored, so the "delivered for training" sequence is well defined: the steps whose
effect survives in the final model, in order.

Record: ``<step:int64> <rows:int64> <loss:float64>`` then ``rows`` int64 row ids, little-endian.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

__all__ = ["StepLog", "StepRecord", "read_steps"]

_HEADER = struct.Struct("<qqd")


@dataclass(frozen=True)
class StepRecord:
    """One trained step: its number, the loss it trained on, and the row ids of its batch."""

    step: int
    loss: float
    ids: np.ndarray[Any, Any]


class StepLog:
    """Appends step records with one ``write`` each, so a SIGKILL loses at most the last one."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)

    def write(self, step: int, loss: float, ids: np.ndarray[Any, Any]) -> None:
        data = np.ascontiguousarray(ids, dtype="<i8")
        os.write(self._fd, _HEADER.pack(step, len(data), loss) + data.tobytes())

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> StepLog:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def read_steps(path: Path) -> list[StepRecord]:
    """Every complete record of ``path``; a record cut short by a crash is ignored."""
    raw = path.read_bytes()
    out: list[StepRecord] = []
    pos = 0
    while pos + _HEADER.size <= len(raw):
        step, rows, loss = _HEADER.unpack_from(raw, pos)
        end = pos + _HEADER.size + 8 * rows
        if end > len(raw):
            break
        ids = np.frombuffer(raw, dtype="<i8", count=rows, offset=pos + _HEADER.size)
        out.append(StepRecord(step, loss, ids.astype(np.int64)))
        pos = end
    return out
