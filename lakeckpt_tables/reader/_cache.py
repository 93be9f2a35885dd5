"""Decoded row groups kept for the plan units cut from them (NOTE [ bounded units ])."""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable

import pyarrow as pa

from lakeckpt_tables.types import Unit

DEFAULT_KEEP = 2
"""Row groups kept beyond those still held: the last ones used (NOTE [ row group cache ])."""

FILE_KEEP_BYTES = 512 << 20
"""Decoded row groups of the whole file being read kept at most (NOTE [ row group cache ])."""

_CACHES: weakref.WeakSet[RowGroupCache] = weakref.WeakSet()


def _empty_in_child() -> None:
    """A forked process (a DataLoader worker) starts every cache empty, before any of its
    threads runs: a read-ahead thread of the parent may have held a lock or a pending read at
    the fork, and no thread here will ever finish it. (Checked lazily instead, by the first
    threads to call ``get``, two of them could each reset the cache under the other.)"""
    for cache in list(_CACHES):
        cache._reset()


os.register_at_fork(after_in_child=_empty_in_child)


class RowGroupCache:
    """Decoded row groups: every one still held by a reader's pending rows, and the ``keep``
    most recently used ones (at least one).

    NOTE [ row group cache ]
    A slice reads the parts of a row group one after the other (the plan keeps a group's
    parts together), so a row group is wanted again only by a read that overlaps its first
    one (the next window, decoding on another read-ahead thread) or follows it at once. The
    first holds the table until its rows are delivered: a weak reference finds it. The second
    finds it among the last two used. Keeping more costs time, not only memory: every decode
    then goes to fresh pages the kernel must zero (transparent huge pages: 2 MB each) where
    freed ones would be reused. A 64 MB LRU (this was 512 MB before) cost a pass over a narrow
    table 3790 page faults and 0.29 s CPU against 927 and 0.18 s keeping one (perf: 17% of the
    pass in clear_page; 6M rows id+x, batch 8192, read_ahead=0; the raw pyarrow loop: 679 faults,
    0.15 s).

    A whole-file unit (NOTE [ lazy footers ] in ``sources/lazy.py``) is one plan group: its
    parts are read one after the other, but in a seeded order across its row groups, so every
    row group of the file last read is kept (up to :data:`FILE_KEEP_BYTES` decoded), and a
    row group is still decoded once per pass (measured: 8 files of 8 row groups, shuffled: 64
    decodes, as with row-group units; 110 keeping the last two).

    Read-ahead threads share it: a row group is decoded once however many threads ask for it
    (the later ones wait for the first), and different row groups decode at once, outside the
    lock (pyarrow releases the GIL: two cores decode two row groups).
    """

    def __init__(self, read: Callable[[Unit], pa.Table], keep: int = DEFAULT_KEEP) -> None:
        self._read = read
        self._keep_count = max(keep, 1)
        self._reset()
        _CACHES.add(self)

    def _reset(self) -> None:
        self._tables: OrderedDict[tuple[str, int], pa.Table] = OrderedDict()  # recent ones
        self._held: weakref.WeakValueDictionary[tuple[str, int], pa.Table] = (
            weakref.WeakValueDictionary())  # every one still referenced
        self._reading: dict[tuple[str, int], threading.Event] = {}
        self._file: dict[tuple[str, int], pa.Table] = {}  # the whole file being read
        self._file_bytes = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, object]:
        # crosses into spawned DataLoader workers empty: decoded tables stay in their process
        return {"_read": self._read, "_keep_count": self._keep_count}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._reset()
        _CACHES.add(self)

    def get(self, unit: Unit) -> pa.Table:
        key = (unit.path, unit.row_group)
        while True:
            with self._lock:
                table = self._held.get(key)
                if table is None:
                    table = self._file.get(key)
                if table is not None:
                    self._keep(key, table)
                    return table
                busy = self._reading.get(key)
                if busy is None:
                    done = self._reading[key] = threading.Event()
                    break
            busy.wait()  # another thread decodes it; a failed read is tried again here
        try:
            table = self._read(unit)
        except BaseException:
            with self._lock:
                del self._reading[key]
            done.set()
            raise
        # a whole file's row group: its file was pinned without its footer's row groups
        whole = getattr(getattr(unit, "file", None), "row_group_rows", ()) is None
        with self._lock:
            del self._reading[key]
            self._held[key] = table
            self._keep(key, table)
            if whole:
                self._keep_file(key, table)
        done.set()
        return table

    def _keep_file(self, key: tuple[str, int], table: pa.Table) -> None:
        """Keep ``table`` with the other row groups of its file, dropping another file's
        (the caller holds the lock)."""
        if next(iter(self._file), key)[0] != key[0]:
            self._file.clear()
            self._file_bytes = 0
        if self._file_bytes + table.nbytes <= FILE_KEEP_BYTES:
            self._file[key] = table
            self._file_bytes += table.nbytes

    def _keep(self, key: tuple[str, int], table: pa.Table) -> None:
        """``table`` becomes the most recently used (the caller holds the lock)."""
        if key in self._tables:
            self._tables.move_to_end(key)
            return
        self._tables[key] = table
        if len(self._tables) > self._keep_count:
            self._tables.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._tables.clear()
            self._held.clear()
            self._file.clear()
            self._file_bytes = 0
