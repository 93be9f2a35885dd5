"""Row group reads issued ahead, concurrently: an object store's latency paid once, not per read.

NOTE [ prefetch ]
On an object store a row group read is one or two ranged GETs whose latency (tens of
milliseconds on a real store) dwarfs their transfer time. Read one after another, a pass waits
out every request in turn; pyarrow.dataset hides that by keeping several fragments in flight.
The reader knows the row groups a window needs, in order, before it reads them: it hands them
to :meth:`Prefetch.expect`, which keeps up to ``depth`` reads in flight on threads (pyarrow
releases the GIL while it fetches and decodes), and :meth:`Prefetch.get` hands each result over
when the reader asks for it. Nothing delivered changes: the same reads of the same rows, only
started earlier; an item never expected is read in the calling thread, as before.

Memory: at most ``depth`` results read but not yet taken. An item expected but then not asked
for (the reader found the row group in its cache) is dropped after ``_STALE_AFTER`` later
gets, so expectations never hold slots for long. The reads run concurrently: ``read`` must
be thread-safe (the Parquet files of :meth:`lakeckpt_tables.io.Storage.open_parquet` are).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

__all__ = ["DEFAULT_PREFETCH", "Prefetch"]

K = TypeVar("K")
T = TypeVar("T")

DEFAULT_PREFETCH = 4
"""Row group reads in flight on an object store: with ~50 ms per request and ~20 ms to decode
a row group on 2 cores, four keep the decoder busy."""

_REMEMBER = 64
"""Items last asked for that :meth:`Prefetch.expect` skips: a row group cut across two windows
is asked for by both, and the reader's cache serves the second."""

_STALE_AFTER = 1024
"""Gets after which an expected item never asked for is dropped: longer than two windows of
interleaved reads (the reader reads ahead a window while it cuts another)."""


class Prefetch(Generic[K, T]):
    """``read(item)`` for expected items, ``depth`` at a time ahead of :meth:`get`, in order.

    Args:
        read: the work per item (runs on a background thread; must be thread-safe).
        depth: reads in flight at most; 0 reads every item in the calling thread.
        key: what identifies an item (two items of one key are read once); the item itself
            when None.

    Picklable: the threads stay in their process and a copy (a spawned DataLoader worker,
    or a forked one) starts with none in flight.
    """

    def __init__(self, read: Callable[[K], T], *, depth: int = DEFAULT_PREFETCH,
                 key: Callable[[K], Hashable] | None = None) -> None:
        if depth < 0:
            raise ValueError(f"prefetch depth must be >= 0, got {depth}")
        self._read = read
        self._depth = depth
        self._key: Callable[[K], Hashable] = key or _itself
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        # expected items in order: the item, when it was expected (in gets), its read once
        # started (the first ``depth`` are started)
        self._queue: OrderedDict[Hashable, tuple[K, int, Future[T] | None]] = OrderedDict()
        self._taken: OrderedDict[Hashable, None] = OrderedDict()  # the last items asked for
        self._gets = 0
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, object]:
        return {"_read": self._read, "_depth": self._depth, "_key": self._key}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._reset()

    def expect(self, items: Iterable[K]) -> None:
        """Items about to be asked for, in the order they will be (several callers may
        interleave their gets: each item is handed to whoever asks for it)."""
        if self._depth == 0:
            return
        self._check_process()
        with self._lock:
            for item in items:
                k = self._key(item)
                if k not in self._taken:  # just read: the reader's cache has it
                    self._queue.setdefault(k, (item, self._gets, None))
            self._start()

    def get(self, item: K) -> T:
        """``read(item)``: the prefetched result when it was expected, read here otherwise.

        Raises:
            Whatever ``read`` raises, at the item's turn.
        """
        if self._depth == 0:
            return self._read(item)
        self._check_process()
        k = self._key(item)
        with self._lock:
            self._gets += 1
            self._taken[k] = None
            if len(self._taken) > _REMEMBER:
                self._taken.popitem(last=False)
            _, _, future = self._queue.pop(k, (item, 0, None))
            self._drop_stale()
            self._start()
        return future.result() if future is not None else self._read(item)

    def close(self) -> None:
        """Cancel what is expected; reads already running finish on their threads."""
        with self._lock:
            for _, _, started in self._queue.values():
                if started is not None:
                    started.cancel()
            self._queue.clear()
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _drop_stale(self) -> None:
        # An item expected long ago and never asked for was served by the reader's cache:
        # its slot and its result go.
        while self._queue:
            k, (_, since, started) = next(iter(self._queue.items()))
            if self._gets - since <= _STALE_AFTER:
                return
            if started is not None:
                started.cancel()
            del self._queue[k]

    def _start(self) -> None:
        for k in list(itertools.islice(self._queue, self._depth)):  # the first depth in flight
            item, since, started = self._queue[k]
            if started is None:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=self._depth,
                                                    thread_name_prefix="lakeckpt-prefetch")
                self._queue[k] = (item, since, self._pool.submit(self._read, item))

    def _check_process(self) -> None:
        if self._pid != os.getpid():
            # a forked DataLoader worker: the parent's threads are not here, and one of them
            # may have held the lock at the fork
            self._reset()


def _itself(item: Hashable) -> Hashable:
    return item
