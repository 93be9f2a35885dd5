"""Plan properties that injected bugs showed no other test held (issue 8, "the suite as proof").

Pure and fast: no tables, no torch. Each test names the bug it stops.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from lakeckpt_tables.plan import EpochPlan, Piece, PlanPolicy, cut_spans, replan_rounds


def _pattern(rows: np.ndarray[Any, Any]) -> bytes:
    """A window's shuffle as a permutation of its own positions (what its seed decides)."""
    return np.argsort(np.argsort(rows, kind="stable"), kind="stable").tobytes()


def test_every_shuffle_window_of_every_slice_segment_and_epoch_is_shuffled_its_own_way() -> None:
    # Equal windows (two 16-row units each), so two windows shuffled with one seed would show
    # one pattern: a window seed missing the slice, the window's index, the epoch or the
    # segment makes slices, windows or epochs repeat each other's order.
    units = [16] * 48
    patterns: dict[bytes, tuple[int, int, int, int]] = {}
    for segment, epoch in itertools.product((0, 1), (0, 1, 2)):
        policy = PlanPolicy(batch_size=8, world_size=2, workers=2, seed=7, shuffle_window=2)
        plan = EpochPlan(units, policy, segment=segment, epoch=epoch)
        for g in range(policy.slices):
            windows = plan.windows(g)
            assert [w.size for w in windows] == [32] * 6
            for i, window in enumerate(windows):
                key = _pattern(window.rows())
                assert key not in patterns, (
                    f"window {i} of slice {g}, segment {segment}, epoch {epoch} is shuffled "
                    f"like window {patterns[key]}")
                patterns[key] = (segment, epoch, g, i)
    assert len(patterns) == 2 * 3 * 4 * 6


def test_cut_spans_gives_exactly_the_rows_asked_for_as_non_empty_spans() -> None:
    # an empty span, e.g. (10, 10) where a cut starts at a span's end, becomes a 0-row
    # consumption record in the ledger
    spans = [(0, 3), (10, 12), (12, 13), (20, 25)]
    rows = np.concatenate([np.arange(a, b) for a, b in spans])
    for start in range(len(rows) + 1):
        for stop in range(start, len(rows) + 2):
            out = cut_spans(spans, start, stop)
            assert all(a < b for a, b in out), (start, stop, out)
            got = np.concatenate([np.arange(a, b) for a, b in out] or [np.empty(0, np.int64)])
            assert np.array_equal(got, rows[start:stop]), (start, stop, out)


def test_one_rank_without_drop_last_delivers_every_row_in_full_batches_then_one_short() -> None:
    # a batch count rounded down drops each slice's last partial batch: rows lost silently
    for units, batch_size, workers in itertools.product(([5, 7, 1], [16] * 3, [1]), (1, 3, 4),
                                                        (1, 2, 3)):
        plan = EpochPlan(units, PlanPolicy(batch_size=batch_size, workers=workers))
        assert sum(plan.delivered_rows(g) for g in range(workers)) == sum(units)
        for g in range(workers):
            s = plan.slice_rows(g)
            sizes = np.diff(np.concatenate([[0], plan.batch_ends(g)])).tolist()
            assert sizes == [batch_size] * (s // batch_size) + (
                [s % batch_size] if s % batch_size else []), (units, batch_size, workers, g)


def _rows(pieces: tuple[Piece, ...]) -> list[int]:
    return sorted(int(r) for p in pieces for r in p.rows())


def test_an_elastic_replan_of_follow_rounds_keeps_the_last_rounds_tail_and_no_earlier_one() -> None:
    # 9 rows, 2 ranks, batch size 1: 4 rows each and a 1-row tail (NOTE [ lockstep ]). In
    # follow mode a round's tail is carried into the next segment: an earlier round's tail is
    # already there, the last round's is not yet, so the re-plan must keep it or lose it.
    policy = PlanPolicy(batch_size=1, world_size=2, shuffle=False)

    def plan_for(index: int, layout: Any) -> EpochPlan:
        return EpochPlan([5, 4], policy, segment=index, epoch=0, layout=layout)

    assert _rows(tuple(plan_for(0, None).tail())) == [8]
    delivered = [r for g in range(2) for r in plan_for(0, None).slice_layout(g)[0].rows()[:2]]
    _, layouts = replan_rounds(plan_for, {}, [(0, 2), (0, 2)], carried=True)
    assert sorted(_rows(layouts[0]) + [int(r) for r in delivered]) == list(range(9))
    # two rounds begun: round 0's tail went to round 1 already; round 1's is kept
    _, layouts = replan_rounds(plan_for, {}, [(1, 1), (0, 4)], carried=True)
    assert _rows(layouts[0]) == []
    assert _rows(layouts[1]) == list(range(1, 9))  # row 0: delivered by slice 0
    # not carried (epochs of a pinned snapshot): every round's tail is re-planned
    _, layouts = replan_rounds(plan_for, {}, [(1, 1), (0, 4)], carried=False)
    assert _rows(layouts[0]) == [8]
