"""Prefetch (NOTE [ prefetch ] in lakeckpt_tables/io/prefetch.py): row group reads issued ahead
on threads, handed over in any order asked, each read once; Parquet files read from threads."""

from __future__ import annotations

import pickle
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakeckpt_tables.io import Storage
from lakeckpt_tables.io import prefetch as prefetch_module
from lakeckpt_tables.io.prefetch import Prefetch


class Reads:
    """A read that records which items were read, on which thread, and how many at once."""

    def __init__(self, delay: float = 0.0, fail: int | None = None) -> None:
        self.delay, self.fail = delay, fail
        self.calls: Counter[int] = Counter()
        self.threads: set[str] = set()
        self.active = self.peak = 0
        self._lock = threading.Lock()

    def __call__(self, item: int) -> int:
        with self._lock:
            self.calls[item] += 1
            self.threads.add(threading.current_thread().name)
            self.active += 1
            self.peak = max(self.peak, self.active)
        time.sleep(self.delay)
        with self._lock:
            self.active -= 1
        if item == self.fail:
            raise OSError(f"injected: item {item} cannot be read")
        return item * 10


def test_expected_items_are_read_ahead_depth_at_a_time_and_each_once() -> None:
    reads = Reads(delay=0.05)
    fetch = Prefetch(reads, depth=3)
    fetch.expect(range(12))
    assert [fetch.get(i) for i in range(12)] == [i * 10 for i in range(12)]
    assert reads.calls == Counter(range(12))
    assert reads.peak == 3
    assert all(name.startswith("lakeckpt-prefetch") for name in reads.threads)


def test_gets_out_of_the_expected_order_each_get_their_item_read_once() -> None:
    """The reader reads ahead one window while it cuts another: their gets interleave."""
    reads = Reads(delay=0.01)
    fetch = Prefetch(reads, depth=4)
    fetch.expect(range(20))
    order = [i for pair in zip(range(0, 10), range(10, 20), strict=True) for i in pair]
    assert [fetch.get(i) for i in order] == [i * 10 for i in order]
    assert reads.calls == Counter(range(20))


def test_an_item_not_expected_is_read_in_the_calling_thread() -> None:
    reads = Reads()
    fetch = Prefetch(reads, depth=2)
    assert fetch.get(7) == 70
    assert reads.threads == {threading.current_thread().name}


def test_depth_zero_reads_everything_in_the_calling_thread() -> None:
    reads = Reads()
    fetch = Prefetch(reads, depth=0)
    fetch.expect(range(5))
    assert [fetch.get(i) for i in range(5)] == [0, 10, 20, 30, 40]
    assert reads.threads == {threading.current_thread().name} and fetch._pool is None


def test_an_item_expected_again_right_after_it_was_read_is_not_read_again() -> None:
    """A row group cut across two windows: the second window finds it in the reader's cache."""
    reads = Reads()
    fetch = Prefetch(reads, depth=2)
    fetch.expect([1, 2])
    assert [fetch.get(1), fetch.get(2)] == [10, 20]
    fetch.expect([2, 3])
    assert fetch.get(3) == 30
    assert reads.calls == Counter([1, 2, 3])


def test_a_failed_read_raises_at_its_turn_and_the_rest_are_still_served() -> None:
    fetch = Prefetch(Reads(fail=2), depth=3)
    fetch.expect(range(5))
    assert [fetch.get(0), fetch.get(1)] == [0, 10]
    with pytest.raises(OSError, match="item 2 cannot be read"):
        fetch.get(2)
    assert [fetch.get(3), fetch.get(4)] == [30, 40]


def test_items_expected_but_never_asked_for_give_their_slots_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefetch_module, "_STALE_AFTER", 3)
    reads = Reads()
    fetch = Prefetch(reads, depth=2)
    fetch.expect([100, 101])  # the reader's cache will serve these: never asked for
    fetch.expect(range(10))
    assert [fetch.get(i) for i in range(10)] == [i * 10 for i in range(10)]
    assert list(fetch._queue) == []
    assert set(reads.calls) <= {100, 101, *range(10)}
    assert all(reads.calls[i] == 1 for i in range(10))


def times_ten(item: int) -> int:
    return item * 10


def test_a_copy_crosses_processes_without_threads_or_expectations() -> None:
    fetch = Prefetch(times_ten, depth=2)
    fetch.expect(range(4))
    copy = pickle.loads(pickle.dumps(fetch))
    assert copy._queue == {} and copy._pool is None
    assert copy.get(3) == 30
    fetch.close()


def test_a_parquet_file_reads_row_groups_from_many_threads_at_once(tmp_path: Path) -> None:
    ids = pa.array(range(40_000), pa.int64())
    pq.write_table(pa.table({"id": ids, "x": pa.compute.multiply(ids, 2)}),
                   tmp_path / "f.parquet", row_group_size=1_000)
    file = Storage(tmp_path).open_parquet("f.parquet")

    def read(i: int) -> list[int]:
        return file.read_row_group(i, columns=["id"]).column(0).to_pylist()  # type: ignore[no-any-return]

    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(read, [i for _ in range(5) for i in range(40)]))
    assert got == [list(range(i * 1_000, (i + 1) * 1_000)) for _ in range(5) for i in range(40)]


def test_the_expected_sequence_is_pulled_lazily_as_slots_free_up() -> None:
    """A whole pass's row groups are expected at once: only ``depth`` are pulled ahead."""
    pulled: list[int] = []

    def sequence() -> Iterator[int]:
        for i in range(1_000):
            pulled.append(i)
            yield i

    reads = Reads()
    fetch = Prefetch(reads, depth=3)
    fetch.expect(sequence())
    assert pulled == [0, 1, 2]
    assert [fetch.get(i) for i in range(5)] == [0, 10, 20, 30, 40]
    assert pulled == list(range(8))  # five taken, three ahead
    wait_for(lambda: set(reads.calls) == set(range(8)))
    assert reads.calls == Counter(range(8))


def test_a_later_sequence_replaces_the_earlier_one() -> None:
    """A new pass: the abandoned pass's sequence is not fetched any further."""
    reads = Reads()
    fetch = Prefetch(reads, depth=2)
    fetch.expect(range(100))
    assert fetch.get(0) == 0
    wait_for(lambda: {1, 2} <= set(reads.calls))
    fetch.expect(range(200, 210))
    assert list(fetch._queue) == [200, 201]  # 1 and 2, read ahead, give their slots back
    assert [fetch.get(i) for i in range(200, 210)] == [i * 10 for i in range(200, 210)]
    wait_for(lambda: sum(reads.calls.values()) == 13)
    # 0, the two ahead of it (1, 2), then the new pass only
    assert reads.calls == Counter([0, 1, 2, *range(200, 210)])


class Sized:
    nbytes = 10


def test_no_read_starts_while_finished_reads_hold_the_byte_budget() -> None:
    calls: Counter[int] = Counter()
    go = threading.Event()

    def read(item: int) -> Sized:
        calls[item] += 1
        go.wait()
        return Sized()

    fetch = Prefetch(read, depth=4, max_bytes=20)
    fetch.expect(range(10))
    wait_for(lambda: len(calls) == 4)  # none finished yet: the budget holds no bytes
    go.set()
    wait_for(lambda: fetch._waiting == 40)  # the four finished: 40 bytes wait
    fetch.get(0)
    fetch.get(1)
    time.sleep(0.05)
    assert set(calls) == {0, 1, 2, 3}  # 20 bytes still wait: nothing new starts
    fetch.get(2)  # 10 bytes wait: the next read starts, and counts 10 more
    wait_for(lambda: 4 in calls)
    time.sleep(0.05)
    assert set(calls) == set(range(5))
    assert [fetch.get(i) for i in range(3, 10)] and calls == Counter(range(10))


def wait_for(done: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_running_reads_count_against_the_byte_budget_at_the_last_results_size() -> None:
    """Row groups of hundreds of MB: reads still running count as the last result's size."""
    calls: Counter[int] = Counter()
    first, later = threading.Event(), threading.Event()

    def read(item: int) -> Sized:
        calls[item] += 1
        (first if item < 8 else later).wait()
        return Sized()

    fetch = Prefetch(read, depth=8, max_bytes=30)
    fetch.expect(range(20))
    wait_for(lambda: len(calls) == 8)  # no size known yet: the depth is the limit
    first.set()
    wait_for(lambda: fetch._waiting == 80)
    for i in range(6):
        fetch.get(i)  # 20 bytes wait
    time.sleep(0.05)
    assert set(calls) == set(range(9))  # 20 waiting + one running at 10 reach 30
    later.set()
    assert [fetch.get(i) for i in range(6, 20)] and calls == Counter(range(20))
