"""Decoded row groups kept for the plan units cut from them (NOTE [ bounded units ])."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable

import pyarrow as pa

from lakeckpt_tables.types import Unit

DEFAULT_BUDGET_BYTES = 512 * 1024 * 1024


class RowGroupCache:
    """The most recently used decoded row groups, within ``budget`` bytes (at least one).

    A slice reads the parts of a row group one after the other (the plan keeps a group's parts
    together), so a small budget already reads each row group once per slice and epoch.
    """

    def __init__(self, read: Callable[[Unit], pa.Table],
                 budget: int = DEFAULT_BUDGET_BYTES) -> None:
        self._read = read
        self._budget = budget
        self._tables: OrderedDict[tuple[str, int], pa.Table] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, object]:
        # crosses into spawned DataLoader workers empty: decoded tables stay in their process
        return {"_read": self._read, "_budget": self._budget}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._tables = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def get(self, unit: Unit) -> pa.Table:
        if self._pid != os.getpid():
            # a forked DataLoader worker: a read-ahead thread of the parent may have held the
            # lock at the fork, and no thread here will ever release it
            self.__setstate__(self.__getstate__())
        # read-ahead threads share the cache (and the reader's open files): one at a time
        with self._lock:
            return self._get(unit)

    def _get(self, unit: Unit) -> pa.Table:
        key = (unit.path, unit.row_group)
        table = self._tables.get(key)
        if table is not None:
            self._tables.move_to_end(key)
            return table
        table = self._read(unit)
        self._tables[key] = table
        self._bytes += table.nbytes
        while len(self._tables) > 1 and self._bytes > self._budget:
            _, old = self._tables.popitem(last=False)
            self._bytes -= old.nbytes
        return table

    def clear(self) -> None:
        self._tables.clear()
        self._bytes = 0
