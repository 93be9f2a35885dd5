"""The plan's compact forms (int32 orders, offsets kept per block, row groups not copied) give
exactly the rows and order the plan gave before them: digests taken from the plan as it was
(commit 4b11b05), over every shuffler, above and below the balanced order's layering limit,
with row groups split into parts and not."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from lakeckpt_tables.plan import BALANCED, FEISTEL, LEGACY, EpochPlan, PlanPolicy
from lakeckpt_tables.plan.rounds import RoundUnits
from lakeckpt_tables.types import Unit

GOLDEN = {
    ("singletons", 40000, False, "balanced", 0): "cbe62a31bf43e7dd",
    ("singletons", 40000, False, "balanced", 9): "15c477f91b09e5b3",
    ("singletons", 40000, False, "feistel", 0): "6c9ddce907a1dbb9",
    ("singletons", 40000, False, "feistel", 9): "d3586870a73f987b",
    ("singletons", 40000, False, "pcg64", 0): "300fe0cef8e0a8e7",
    ("singletons", 40000, False, "pcg64", 9): "a03bf02956464297",
    ("small", 3000, False, "balanced", 0): "46ceb04c1bc15753",
    ("small", 3000, False, "balanced", 9): "735b5913b192a12d",
    ("small", 3000, False, "feistel", 0): "4f4785d816005f0c",
    ("small", 3000, False, "feistel", 9): "9e9ab67aa159fd8d",
    ("small", 3000, False, "pcg64", 0): "0d67565eb2780b15",
    ("small", 3000, False, "pcg64", 9): "7e843fd853b226ed",
    ("split", 20000, True, "balanced", 0): "e2438449f57ad858",
    ("split", 20000, True, "balanced", 9): "90867f97c9280a34",
    ("split", 20000, True, "feistel", 0): "8a5df497a08023cc",
    ("split", 20000, True, "feistel", 9): "7b65c7ab40237f76",
    ("split", 20000, True, "pcg64", 0): "d26fe3d984d2ea27",
    ("split", 20000, True, "pcg64", 9): "3d07e1754ecd515f",
    ("split_big", 40000, True, "balanced", 0): "ddc82a651a0e1be4",
    ("split_big", 40000, True, "balanced", 9): "209f305102d012bf",
    ("split_big", 40000, True, "feistel", 0): "4abd0f6e0fff5fb0",
    ("split_big", 40000, True, "feistel", 9): "d53daba432ab4cb2",
    ("split_big", 40000, True, "pcg64", 0): "002035a0d3446130",
    ("split_big", 40000, True, "pcg64", 9): "3031fcc01298a230",
}
UNITS_GOLDEN = {
    "singletons": "e4699a2f5d65442f",
    "split": "2c94cd6c80815fc1",
}


def _units(groups: int, split: bool) -> list[Unit]:
    sizes = np.random.default_rng(3).integers(1, 9000 if split else 4000, groups)
    return [Unit(f"f{i // 8:06d}", i % 8, int(s)) for i, s in enumerate(sizes)]


def _digest(plan: EpochPlan) -> str:
    h = hashlib.sha256()
    h.update(np.asarray(plan.order, dtype=np.int64).tobytes())
    h.update(np.asarray(plan.offsets, dtype=np.int64).tobytes())
    for g in range(plan.policy.slices):
        ends = plan.batch_ends(g)
        h.update(repr(plan.windows(g)).encode())
        h.update(repr(plan.remaining(g, int(ends[len(ends) // 3]))).encode())
    for a in range(0, plan.rows, max(plan.rows // 37, 1)):
        h.update(repr(plan.locate([(a, min(a + 5000, plan.rows)), (a, a)])).encode())
    h.update(repr(plan.tail()).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize(("name", "groups", "split"), [
    ("singletons", 40000, False), ("small", 3000, False), ("split", 20000, True),
    ("split_big", 40000, True)])
def test_plans_are_the_plans_of_before(name: str, groups: int, split: bool) -> None:
    units = RoundUnits.of(_units(groups, split))
    for shuffler in (BALANCED, FEISTEL, LEGACY):
        for epoch in (0, 9):
            policy = PlanPolicy(batch_size=1000, world_size=3, workers=2, seed=5,
                                shuffler=shuffler, shuffle_window=16)
            plan = EpochPlan(units.rows, policy, epoch=epoch, groups=units.source)
            assert _digest(plan) == GOLDEN[(name, groups, split, shuffler, epoch)], (
                shuffler, epoch)


@pytest.mark.parametrize(("name", "groups", "split"), [("singletons", 40000, False),
                                                       ("split", 20000, True)])
def test_plan_units_are_the_units_of_before(name: str, groups: int, split: bool) -> None:
    units = RoundUnits.of(_units(groups, split))
    h = hashlib.sha256()
    for values in (units.rows, units.source, units.first):
        h.update(np.asarray(values, dtype=np.int64).tobytes())
    assert h.hexdigest()[:16] == UNITS_GOLDEN[name]


def test_compact_index_views_index_like_the_arrays_they_stand_for() -> None:
    units = [Unit("a", 0, 10), Unit("b", 0, 3), Unit("c", 0, 9)]
    split = RoundUnits.of(units, unit_rows=4)  # 3 + 1 + 3 parts
    whole = RoundUnits.of(units, unit_rows=10)  # one part each
    for ru, source, first in ((split, [0, 0, 0, 1, 2, 2, 2], [0, 3, 6, 0, 0, 3, 6]),
                              (whole, [0, 1, 2], [0, 0, 0])):
        for view, values in ((ru.source, source), (ru.first, first)):
            assert len(view) == len(values) and view.tolist() == values == list(view)
            assert np.array_equal(np.asarray(view), values)
            assert view[-1] == values[-1] and view[1] == values[1]
            assert np.asarray(view)[[2, 0]].tolist() == view[[2, 0]].tolist()
            assert view[1:3].tolist() == values[1:3]
            assert view[np.array([], dtype=np.int64)].tolist() == []
            with pytest.raises(IndexError):
                view[len(values)]
            with pytest.raises(IndexError):
                view[[0, len(values)]]
    assert split.rows.tolist() == [3, 3, 4, 3, 3, 3, 3] and split.units == units
    assert [split.at(u, 0, 1)[1] for u in range(7)] == [0, 3, 6, 0, 0, 3, 6]


def test_a_rounds_plans_share_its_unit_order_and_pickle_without_it() -> None:
    import pickle

    units = RoundUnits.of(_units(2000, True))
    small = PlanPolicy(batch_size=100, world_size=2, workers=2, seed=5)
    plan = units.plan(small, segment=0, epoch=1, layout=None)
    again = units.plan(PlanPolicy(batch_size=7, world_size=3, workers=1, seed=5), segment=0,
                       epoch=1, layout=None)
    assert again.order is plan.order  # one permutation of the units for both shapes
    fresh = EpochPlan(units.rows, small, epoch=1, groups=units.source)
    assert np.array_equal(fresh.order, plan.order) and _digest(fresh) == _digest(plan)
    assert units.plan(small, segment=0, epoch=2, layout=None).order is not plan.order
    assert pickle.loads(pickle.dumps(units)).orders == {} and len(units.orders) == 2


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_replan_takes_every_slices_rest_as_its_windows_would_give_it(shuffle: bool) -> None:
    from lakeckpt_tables.plan import replan
    from lakeckpt_tables.plan.pieces import coalesce
    from lakeckpt_tables.plan.replan import rest

    rng = np.random.default_rng(11)
    rows = rng.integers(0, 300, 400)  # units of no rows among them
    old = PlanPolicy(batch_size=7, world_size=3, workers=2, seed=2, shuffle=shuffle,
                     shuffle_window=5)
    plans = [EpochPlan(rows, old)]
    positions = [(0, int(e[len(e) // 2])) for e in map(plans[0].batch_ends, range(6))]
    _, layouts = replan(rows, old, {}, positions)  # a layout of seeded and plain pieces
    new = PlanPolicy(batch_size=5, world_size=2, workers=3, seed=2, shuffle=shuffle,
                     shuffle_window=4)
    plans.append(EpochPlan(rows, new, layout=layouts[0]))
    assert any(p.seed is not None for p in layouts[0]) == shuffle
    for plan in plans:
        for g in range(plan.policy.slices):
            ends = [0, *plan.batch_ends(g).tolist()]
            for position in {*ends[::3], ends[-1], plan.delivered_rows(g)}:
                assert coalesce(rest(plan, g, position)) == coalesce(
                    plan.remaining(g, position)), (g, position)
