"""Read-ahead yields exactly what a sequential read yields, in order, within its bounds."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from lakeckpt_tables.reader.readahead import ReadAhead


def test_results_come_in_job_order_whatever_order_reads_finish_in() -> None:
    def read(i: int) -> int:
        time.sleep(0.002 * ((7 * i) % 5))  # later jobs often finish first
        return i * i

    assert list(ReadAhead(read, range(40), depth=4)) == [i * i for i in range(40)]


def test_depth_zero_reads_in_the_calling_thread() -> None:
    seen: list[str] = []
    out = list(ReadAhead(lambda i: seen.append(threading.current_thread().name) or i,
                         range(5), depth=0))
    assert out == list(range(5))
    assert set(seen) == {threading.current_thread().name}


def test_the_next_read_runs_while_the_consumer_holds_the_previous_result() -> None:
    second_started = threading.Event()

    def read(i: int) -> int:
        if i == 1:
            second_started.set()
        return i

    it = iter(ReadAhead(read, range(3), depth=2))
    assert next(it) == 0
    # the consumer has not asked for job 1 yet: only read-ahead can have started it
    assert second_started.wait(timeout=5)
    assert list(it) == [1, 2]


class _PeakReads:
    """A read that sleeps and counts how many of its calls ran at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.running = self.peak = 0
        self._lock = threading.Lock()

    def __call__(self, i: int) -> int:
        with self._lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(self.seconds)
        with self._lock:
            self.running -= 1
        return i


def test_no_more_than_depth_reads_are_in_flight() -> None:
    read = _PeakReads(0.005)
    assert list(ReadAhead(read, range(30), depth=3)) == list(range(30))
    assert read.peak == 3


def test_a_zero_byte_budget_reads_one_job_at_a_time() -> None:
    read = _PeakReads(0.002)
    assert list(ReadAhead(read, range(20), depth=4, max_bytes=0)) == list(range(20))
    assert read.peak == 1


def test_an_error_is_raised_at_its_job_after_the_results_before_it() -> None:
    def read(i: int) -> int:
        if i == 3:
            raise OSError("disk gone at job 3")
        return i

    got: list[int] = []
    with pytest.raises(OSError, match="job 3"):
        for value in ReadAhead(read, range(6), depth=2):
            got.append(value)
    assert got == [0, 1, 2]


def test_leaving_the_loop_early_stops_reading_and_its_threads_serve_the_next_read_ahead(
) -> None:
    started: list[int] = []

    def read(i: int) -> int:
        started.append(i)
        time.sleep(0.01)
        return i

    reader = iter(ReadAhead(read, range(1000), depth=2))
    assert [next(reader) for _ in range(3)] == [0, 1, 2]
    reader.close()  # type: ignore[attr-defined]
    assert len(started) <= 5
    alive = {t.ident for t in threading.enumerate()}
    # NOTE [ reused threads ]: the next read-ahead runs on them, no new thread starts
    used: set[int | None] = set()
    assert list(ReadAhead(lambda i: used.add(threading.get_ident()) or i, range(20),
                          depth=2)) == list(range(20))
    assert used and used <= alive
    assert {t.ident for t in threading.enumerate()} <= alive


def test_read_aheads_at_once_never_share_threads() -> None:
    used: dict[str, set[int]] = {"a": set(), "b": set()}

    def reader(name: str) -> Any:
        def read(i: int) -> int:
            used[name].add(threading.get_ident())
            time.sleep(0.001)
            return i
        return iter(ReadAhead(read, range(30), depth=2))

    a, b = reader("a"), reader("b")
    assert [(next(a), next(b)) for _ in range(30)] == [(i, i) for i in range(30)]
    assert used["a"] and used["b"] and not used["a"] & used["b"]


def _read_ahead_in_child(queue: Any) -> None:
    queue.put(list(ReadAhead(lambda i: i * 2, range(10), depth=2)))


def test_a_forked_process_starts_threads_of_its_own() -> None:
    import multiprocessing

    assert list(ReadAhead(lambda i: i, range(10), depth=2)) == list(range(10))  # pool idle
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_read_ahead_in_child, args=(queue,))
    child.start()
    try:
        # the parent's idle threads do not exist in the child: reusing them would hang
        assert queue.get(timeout=20) == [i * 2 for i in range(10)]
    finally:
        child.join(timeout=5)
        if child.exitcode is None:
            child.kill()
    assert child.exitcode == 0


@pytest.mark.parametrize("bad", [{"depth": -1}, {"max_bytes": -1}])
def test_negative_bounds_are_refused(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        ReadAhead(lambda i: i, range(3), **bad)


def test_an_unshuffled_window_is_read_in_small_pieces_so_the_first_batch_waits_for_less(
    delta_table: Any,
) -> None:
    # 17-row row groups cut into 5-row units: a piece is 4 units (20 rows), at most 2 row groups
    dataset = delta_table.dataset(batch_size=4, shuffle=False, unit_rows=5, read_ahead=0)
    batches = iter(dataset)
    first = next(batches)["id"].tolist()
    assert len(dataset._reader.cache._tables) <= 2  # not the window's 23 row groups
    rest = [i for b in batches for i in b["id"].tolist()]
    # the same rows in the same order as one read of the whole window (units of 4096 rows)
    whole = delta_table.dataset(batch_size=4, shuffle=False, read_ahead=0)
    assert first + rest == [i for b in whole for i in b["id"].tolist()]
    assert sorted(first + rest) == delta_table.ids.tolist()


def test_read_pieces_cut_only_unshuffled_windows_and_keep_their_rows_in_order() -> None:
    from lakeckpt_tables.plan import Piece
    from lakeckpt_tables.reader.readahead import read_pieces

    plain = Piece.plain([(0, 10), (20, 45), (50, 51)])
    pieces = read_pieces(plain, unit_rows=3)
    assert [p.size for p in pieces] == [12, 12, 12]
    assert [r for p in pieces for r in p.rows().tolist()] == plain.rows().tolist()
    shuffled = Piece(plain.spans, 7, 0, plain.size)
    assert read_pieces(shuffled, unit_rows=3) == [shuffled]


# ------------------------------------------------------------------ the row group cache
# (NOTE [ row group cache ] in reader/_cache.py): read-ahead threads share it


def _unit(row_group: int) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(path="f.parquet", row_group=row_group)


def test_two_row_groups_decode_at_once_and_one_asked_twice_decodes_once() -> None:
    import pyarrow as pa

    from lakeckpt_tables.reader._cache import RowGroupCache

    both = threading.Barrier(2, timeout=5)  # broken unless two reads run at the same time
    calls: list[int] = []

    def read(unit: Any) -> pa.Table:
        calls.append(unit.row_group)
        both.wait()
        return pa.table({"rg": [unit.row_group]})

    cache = RowGroupCache(read)
    out: dict[str, Any] = {}
    threads = [threading.Thread(target=lambda n=n, g=g: out.__setitem__(n, cache.get(_unit(g))))
               for n, g in (("a", 0), ("b", 1), ("c", 0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert sorted(calls) == [0, 1]  # row group 0 once, though two threads asked for it
    assert out["a"] is out["c"] and out["b"]["rg"].to_pylist() == [1]


def test_a_failed_read_raises_in_its_caller_and_is_tried_again_by_the_next() -> None:
    import pyarrow as pa

    from lakeckpt_tables.reader._cache import RowGroupCache

    fails = [True]

    def read(unit: Any) -> pa.Table:
        if fails.pop():
            raise OSError("disk gone")
        return pa.table({"rg": [unit.row_group]})

    fails.insert(0, False)
    cache = RowGroupCache(read)
    with pytest.raises(OSError, match="disk gone"):
        cache.get(_unit(3))
    assert cache.get(_unit(3))["rg"].to_pylist() == [3]


def test_a_row_group_still_held_is_found_beyond_the_kept_ones_and_one_let_go_is_not() -> None:
    import pyarrow as pa

    from lakeckpt_tables.reader._cache import RowGroupCache

    calls: list[int] = []

    def read(unit: Any) -> pa.Table:
        calls.append(unit.row_group)
        return pa.table({"rg": [unit.row_group] * 1000})

    cache = RowGroupCache(read, keep=1)  # keeps only the last one used
    held = cache.get(_unit(0))
    cache.get(_unit(1))
    cache.get(_unit(2))
    assert cache.get(_unit(0)) is held  # a pending read holds it: no second decode
    assert calls == [0, 1, 2]
    cache.get(_unit(3))
    assert cache.get(_unit(1))["rg"][0].as_py() == 1  # nobody held it: decoded again
    assert calls == [0, 1, 2, 3, 1]


def _read_in_forked_child(cache: Any, result: Any) -> None:
    out: dict[int, Any] = {}
    threads = [threading.Thread(target=lambda g=g: out.__setitem__(g, cache.get(_unit(g))))
               for g in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    result.put(sorted(int(t["rg"][0].as_py()) for t in out.values()))


@pytest.mark.timeout(60)
def test_a_forked_worker_starts_with_an_empty_cache_whatever_the_parent_held() -> None:
    # the parent forks while one of its threads holds the lock and decodes row group 0: the
    # child's threads must neither wait for that read nor reset the cache under each other
    import multiprocessing

    import pyarrow as pa

    from lakeckpt_tables.reader._cache import RowGroupCache

    cache = RowGroupCache(lambda unit: pa.table({"rg": [unit.row_group]}))
    cache._reading[("f.parquet", 0)] = threading.Event()  # a read in flight at the fork
    context = multiprocessing.get_context("fork")
    result = context.Queue()
    with cache._lock:
        child = context.Process(target=_read_in_forked_child, args=(cache, result))
        child.start()
    assert result.get(timeout=30) == [0, 1]
    child.join(timeout=30)
    assert child.exitcode == 0
