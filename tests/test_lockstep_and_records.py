"""Lockstep with drop_last over several ranks, and consumption ranges coalesced only when
adjacent (issue 8: kinds of test the suite lacked)."""

from __future__ import annotations

import pytest
from conftest import Table, flat, loader_for, take

from lakeckpt_tables.plan.accounting import Consumed, coalesce_ranges


@pytest.mark.parametrize(("world", "batch", "batches"), [
    (2, 97, 1),   # slices of 193 and 194 rows: 1 and 2 full batches alone; lockstep: 1 each
    (4, 32, 3),   # slices of 96, 97, 97, 97
    (3, 7, 18),   # slices of 129: 18 full batches, 3 rows each dropped
])
def test_drop_last_gives_every_rank_the_same_number_of_full_batches(
        delta_table: Table, world: int, batch: int, batches: int) -> None:
    runs = [take(loader_for(delta_table.dataset(batch_size=batch, drop_last=True, seed=1,
                                                 rank=r, world_size=world), 0))
            for r in range(world)]
    assert [len(run) for run in runs] == [batches] * world
    assert {len(b) for run in runs for b in run} == {batch}
    delivered = flat(b for run in runs for b in run)
    assert len(delivered) == len(set(delivered)) == world * batches * batch


def _rec(start: int, end: int, rows: int | None = None, *, group: int = 0,
         worker: int = 0, segment: int = 0) -> Consumed:
    n = end - start if rows is None else rows
    return Consumed(0, worker, segment, 0, "f.parquet", group, start, end, n)


def test_only_adjacent_exact_ranges_of_one_row_group_and_worker_are_coalesced() -> None:
    got = coalesce_ranges([_rec(0, 5), _rec(5, 9), _rec(10, 12), _rec(12, 14, group=1),
                     _rec(14, 16, group=1, worker=1), _rec(16, 20, 2), _rec(20, 22)])
    assert [(r.row_group, r.worker, r.row_start, r.row_end, r.rows) for r in got] == [
        (0, 0, 0, 9, 9),      # adjacent, exact: one record
        (0, 0, 10, 12, 2),    # a gap at row 9: kept apart
        (1, 0, 12, 14, 2),    # another row group
        (1, 1, 14, 16, 2),    # another worker
        (0, 0, 16, 20, 2),    # a partial (shuffled) count: never merged
        (0, 0, 20, 22, 2),
    ]


def test_ranges_of_two_segments_are_never_coalesced_even_when_adjacent() -> None:
    # a follow segment's carried tail is read in the next segment (NOTE [ segment tails are
    # carried ]): the ledger must keep the rows of each segment under that segment
    got = coalesce_ranges([_rec(0, 3), _rec(3, 4, segment=1)])
    assert [(r.segment, r.row_start, r.row_end, r.rows) for r in got] == [
        (0, 0, 3, 3), (1, 3, 4, 1)]


def test_a_lockstep_remainder_is_said_once_per_pass_not_again_at_a_resume_inside_it(
        delta_table: Table, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 32 item 7, for a reader of rows: a fresh pass says its remainder once; a reader
    resumed inside that pass does not say it again; the next pass does."""
    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]

    rows = len(delta_table.ids)
    assert rows % 4  # batch size 1 over 4 ranks leaves a remainder
    with caplog.at_level("WARNING", logger="lakeckpt_tables"):
        ds = delta_table.dataset(batch_size=1, seed=1, rank=0, world_size=4, epochs=2)
        it = iter(ds)
        next(it), next(it)
        state = ds.state_dict()
        assert len(said()) == 1 and "epoch 0" in said()[0] and "lockstep" in said()[0]
        resumed = delta_table.dataset(batch_size=1, seed=1, rank=0, world_size=4, epochs=2)
        resumed.load_state_dict(state)
        list(resumed)  # the rest of epoch 0, then epoch 1
        assert len(said()) == 2 and "epoch 1" in said()[1]
