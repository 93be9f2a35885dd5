"""Row group reads issued ahead, concurrently: an object store's latency paid once, not per read.

NOTE [ prefetch ]
On an object store a row group read is one or two ranged GETs whose latency (tens of
milliseconds on a real store) dwarfs their transfer time. Read one after another, a pass waits
out every request in turn; pyarrow.dataset hides that by keeping several fragments in flight.
The reader knows every row group a pass of one round will read, in order, before it reads
them: it hands that sequence to :meth:`Prefetch.expect` as a lazy iterable, and the prefetch
keeps up to ``depth`` reads in flight on threads (pyarrow releases the GIL while it fetches and
decodes), pulling the next items as :meth:`Prefetch.get` hands results over. The sequence runs
across window and piece boundaries: the next window's row groups are fetched while this one is
still being cut (measured on the local S3 server with 50 ms per request: told one piece of 4
row groups at a time, requests in flight averaged 0.6 and the pass took 1.4x its zero-latency
time). Nothing delivered changes: the same reads of the same rows, only started earlier; an
item never expected is read in the calling thread, as before.

One sequence at a time: a later :meth:`Prefetch.expect` replaces the earlier one and drops
its reads not yet taken (a new pass of the reader, or its next round; an old pass that still
runs reads its rows in its own thread), so an abandoned pass neither keeps fetching nor holds
slots.

Memory: at most ``depth`` results read (or being read) but not yet taken, and no new read
starts while the finished ones waiting, plus the running ones counted at the size of the
last result, would hold ``max_bytes`` or more (row groups of hundreds of MB: fewer in
flight). An item expected but then not asked for (the reader found the row group in its
cache) is dropped after ``_STALE_AFTER`` later gets, so it never holds a slot for long.
The reads run concurrently: ``read`` must be thread-safe (the Parquet files of
:meth:`lakeckpt_tables.io.Storage.open_parquet` are).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

__all__ = ["DEFAULT_PREFETCH", "DEFAULT_PREFETCH_BYTES", "Prefetch"]

K = TypeVar("K")
T = TypeVar("T")

DEFAULT_PREFETCH = 16
"""Row group reads in flight on an object store. In flight must cover latency x row group
rate, where a read's time includes its decode on a shared CPU: measured on the local S3
server with 50 ms injected (2 M rows, 124 row groups of 2.2 MB, load average 12-15, paired
passes), 8 gave 0.69x and 1.00x of the zero-latency pass, 16 gave 1.00x and 0.97x. The GETs
themselves go through pyarrow's I/O thread pool (``pyarrow.io_thread_count()``, 8 by
default): at most that many are in flight, the other reads wait their turn to fetch or
decode. Memory stays bounded by ``DEFAULT_PREFETCH_BYTES``."""

DEFAULT_PREFETCH_BYTES = 256 << 20
"""Bytes of finished reads waiting to be taken before no new read starts."""

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
        max_bytes: no new read starts while the reads not yet taken would hold this many
            bytes (``size`` of the finished ones, the last result's size for each running
            one); one read is always allowed.
        size: the bytes a result holds; its ``nbytes`` (a pyarrow table's) when None.

    Picklable: the threads stay in their process and a copy (a spawned DataLoader worker,
    or a forked one) starts with none in flight.
    """

    def __init__(self, read: Callable[[K], T], *, depth: int = DEFAULT_PREFETCH,
                 key: Callable[[K], Hashable] | None = None,
                 max_bytes: int = DEFAULT_PREFETCH_BYTES,
                 size: Callable[[T], int] | None = None) -> None:
        if depth < 0:
            raise ValueError(f"prefetch depth must be >= 0, got {depth}")
        if max_bytes < 0:
            raise ValueError(f"prefetch max_bytes must be >= 0, got {max_bytes}")
        self._read = read
        self._depth = depth
        self._key: Callable[[K], Hashable] = key or _itself
        self._max_bytes = max_bytes
        self._size: Callable[[T], int] = size or _nbytes
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.RLock()  # a read done at once calls back in the starting thread
        # expected items in order: the item, when it was expected (in gets), its read once
        # started (the first ``depth`` are started)
        self._queue: OrderedDict[Hashable, tuple[K, int, Future[T] | None]] = OrderedDict()
        self._taken: OrderedDict[Hashable, None] = OrderedDict()  # the last items asked for
        self._stream: Iterator[K] | None = None  # the rest of the expected sequence
        self._waiting = 0  # bytes of finished reads not yet taken
        self._counted: dict[Future[T], int] = {}  # those reads and their bytes
        self._last_size = 0  # bytes of the last result: what a running read will hold
        self._gets = 0
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, object]:
        return {"_read": self._read, "_depth": self._depth, "_key": self._key,
                "_max_bytes": self._max_bytes, "_size": self._size}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._reset()

    def expect(self, items: Iterable[K]) -> None:
        """The items about to be asked for, in the order they will be: pulled lazily, as
        slots free up, so a whole pass's sequence costs nothing up front. Replaces the
        sequence expected before, and drops what was read of it but not taken."""
        if self._depth == 0:
            return
        self._check_process()
        with self._lock:
            for k, (_, _, started) in list(self._queue.items()):  # the earlier pass's
                if started is not None:
                    started.cancel()
                    self._release(started)
                del self._queue[k]
            self._stream = iter(items)
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
            if future is not None:
                self._release(future)
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
            self._stream = None
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
                self._release(started)
            del self._queue[k]

    def _start(self) -> None:
        """Start reads, in order, while fewer than ``depth`` are in flight (read or being
        read, not taken) and they would hold less than ``max_bytes``."""
        while len(self._queue) < self._depth and self._pull():
            pass
        for k, (item, since, started) in self._queue.items():
            if started is not None:
                continue
            running = sum(1 for _, _, f in self._queue.values()
                          if f is not None and f not in self._counted)
            if self._waiting + running * self._last_size >= self._max_bytes and (
                    running or self._waiting):
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self._depth,
                                                thread_name_prefix="lakeckpt-prefetch")
            future = self._pool.submit(self._read, item)
            self._queue[k] = (item, since, future)
            future.add_done_callback(self._finished)

    def _pull(self) -> bool:
        """Queue the next item of the expected sequence not queued or just taken; False
        when the sequence is done."""
        if self._stream is None:
            return False
        for item in self._stream:
            k = self._key(item)
            if k not in self._taken and k not in self._queue:  # just read: the cache has it
                self._queue[k] = (item, self._gets, None)
                return True
        self._stream = None
        return False

    def _finished(self, future: Future[T]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        size = self._size(future.result())
        with self._lock:
            if any(started is future for _, _, started in self._queue.values()):
                self._counted[future] = size
                self._waiting += size
            self._last_size = size

    def _release(self, future: Future[T]) -> None:
        """``future`` leaves the queue: its bytes no longer wait (the caller holds the lock)."""
        self._waiting -= self._counted.pop(future, 0)

    def _check_process(self) -> None:
        if self._pid != os.getpid():
            # a forked DataLoader worker: the parent's threads are not here, and one of them
            # may have held the lock at the fork
            self._reset()


def _itself(item: Hashable) -> Hashable:
    return item


def _nbytes(result: object) -> int:
    return int(getattr(result, "nbytes", 0))
