"""Read-ahead: decode the next windows on background threads while the loop trains.

NOTE [ read-ahead ]
pyarrow releases the GIL while it reads and decodes Parquet, so a thread can decode the next
windows while the training loop (or the batch cutting) holds the GIL. Results come back in
submission order, so what the reader yields, and therefore its position, is exactly what a
sequential read would give: the position counts rows *delivered*, never rows read ahead, and
state and resume are unchanged. The reads in flight decode at once (the row group cache lets
them, NOTE [ row group cache ] in ``reader/_cache.py``): on 2 cores the two threads decode
while the loop only cuts batches. Memory is bounded twice: at most ``depth`` reads in flight, and
no new read is started while the results waiting to be consumed hold ``max_bytes`` or more
(the first pending result is always allowed, so a window larger than the budget still reads).
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar, cast

from lakeckpt_tables.plan import Piece

__all__ = ["DEFAULT_DEPTH", "DEFAULT_MAX_BYTES", "PLAIN_PIECE_UNITS", "ReadAhead", "read_pieces"]

T = TypeVar("T")
J = TypeVar("J")

DEFAULT_DEPTH = 2
"""Reads in flight ahead of the consumer, each on its own thread: two decode at once on 2 cores
(the 1M-row token table: 1.5x the single-threaded raw pyarrow loop under ``StatefulDataLoader``)."""

DEFAULT_MAX_BYTES = 256 << 20
"""Bytes of decoded windows waiting to be consumed before read-ahead pauses."""


PLAIN_PIECE_UNITS = 4
"""Least units per read of an unshuffled window: its rows come out in order, so reading it in
pieces changes nothing but the wait for the first batch (one row group, not a whole window)."""


def read_pieces(window: Piece, unit_rows: int, bounds: Sequence[int] = ()) -> list[Piece]:
    """The reads of one window: a shuffled window at once (its permutation spans all of it),
    an unshuffled one in pieces of at least :data:`PLAIN_PIECE_UNITS` units, in order, each
    ending where a row group does when ``bounds`` (the window positions where row groups
    change, ascending) are given: a row group is decoded whole anyway, and every read costs
    its planning (~3 ns a row at 4 units of 4096 rows)."""
    step = PLAIN_PIECE_UNITS * unit_rows
    if window.seed is not None or window.size <= step:
        return [window]
    if bounds:
        edges = [0]
        for b in bounds:
            if b - edges[-1] >= step and b < window.size:
                edges.append(b)
    else:
        edges = list(range(0, window.size, step))
    edges.append(window.size)
    return [window.cut(a, b) for a, b in itertools.pairwise(edges)]


class ReadAhead(Generic[J, T]):
    """Iterate ``read(job)`` for each job, in order, reading up to ``depth`` jobs ahead.

    Args:
        read: the work per job (runs on a background thread; must be thread-safe).
        jobs: the jobs, in the order their results are wanted.
        depth: reads in flight at most; 0 reads in the calling thread (no threads at all).
        max_bytes: pause reading ahead while finished results hold this many bytes.
        size: the bytes a result holds (``nbytes`` of a pyarrow table, say).

    An exception raised by ``read`` is raised by the iteration at that job's place, after the
    results before it. Closing the iterator (or leaving a ``for`` loop) cancels what is queued.
    """

    def __init__(self, read: Callable[[J], T], jobs: Iterable[J], *,
                 depth: int = DEFAULT_DEPTH, max_bytes: int = DEFAULT_MAX_BYTES,
                 size: Callable[[T], int] = lambda _: 0) -> None:
        if depth < 0:
            raise ValueError(f"read-ahead depth must be >= 0, got {depth}")
        if max_bytes < 0:
            raise ValueError(f"read-ahead max_bytes must be >= 0, got {max_bytes}")
        self._read = read
        self._jobs = iter(jobs)
        self._depth = depth
        self._max_bytes = max_bytes
        self._size = size

    def __iter__(self) -> Iterator[T]:
        if self._depth == 0:
            for job in self._jobs:
                yield self._read(job)
            return
        pid = os.getpid()
        pool = _take_pool(self._depth, pid)
        pending: deque[Future[T]] = deque()
        waiting_bytes = _Counter()
        exhausted = False
        try:
            while True:
                while (not exhausted and len(pending) < self._depth
                       and (not pending or waiting_bytes.value < self._max_bytes)):
                    item: object = next(self._jobs, _END)
                    if item is _END:
                        exhausted = True
                        break
                    pending.append(pool.submit(self._counted, cast(J, item), waiting_bytes))
                if not pending:
                    return
                result = pending.popleft().result()
                waiting_bytes.add(-self._size(result))
                yield result
        finally:
            for future in pending:
                future.cancel()
            _give_back(pool, self._depth, pid)

    def _counted(self, job: J, counter: _Counter) -> T:
        result = self._read(job)
        counter.add(self._size(result))
        return result


_END: object = object()

KEEP_IDLE = 2
"""Idle thread pools of one depth kept for the next read-ahead (NOTE [ reused threads ])."""

_IDLE: dict[int, deque[tuple[int, ThreadPoolExecutor]]] = {}  # depth -> (pid, pool)


def _take_pool(depth: int, pid: int) -> ThreadPoolExecutor:
    """NOTE [ reused threads ]
    A read-ahead takes an idle pool of its depth and gives it back when it ends, so its threads
    outlive one pass (a round, an epoch, a dataset). Each new thread starts a fresh allocator
    heap (pyarrow's mimalloc is per thread), whose pages the kernel must fault in and zero: a
    pass over a shuffled narrow table took 4,666 page faults on new threads, 489 on reused
    ones, and 21 reading inline. Each read-ahead still has threads of its own (pools are
    never shared by two at once), and a pool of another process (forked) is never reused: its
    threads do not exist there. No lock: deque appends and pops are atomic, and a lock could
    be re-entered by a generator the garbage collector finalizes while it is held."""
    idle = _IDLE.get(depth)
    while idle:
        try:
            owner, pool = idle.pop()
        except IndexError:  # emptied by another thread meanwhile
            break
        if owner == pid:
            return pool
    return ThreadPoolExecutor(max_workers=depth, thread_name_prefix="lakeckpt-readahead")


def _give_back(pool: ThreadPoolExecutor, depth: int, pid: int) -> None:
    """Keep ``pool`` (``depth`` threads, taken in process ``pid``) idle for the next read-ahead
    of its depth, or stop it without waiting: an abandoned iterator is finalized by the garbage
    collector, which may run inside threading's own bookkeeping, and joining a thread there
    deadlocks (reads in flight finish and the threads end on their own)."""
    if sys.is_finalizing():  # a generator collected at exit: threads are gone
        return
    idle = _IDLE.setdefault(depth, deque())
    if len(idle) < KEEP_IDLE and pid == os.getpid():
        idle.append((pid, pool))
        return
    pool.shutdown(wait=False, cancel_futures=True)


class _Counter:
    """An int shared between the reading threads and the consumer."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self, amount: int) -> None:
        with self._lock:
            self.value += amount
