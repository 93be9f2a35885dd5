"""Different seeds give different orders at every epoch, under every shuffler.

Pure and fast: no tables, no torch. Row-level checks alone cannot see a unit order that ignores
the seed (the window shuffle still depends on it and mixes the rows), so the unit order is
checked directly, for every way a plan's units come (one unit per row group, row groups cut
into several units, compact ``Parts``, few and many units), and at the row level through what
each rank reads: its *set* of rows, which the window shuffle cannot change.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from lakeckpt_tables.plan import BALANCE_CYCLE, EpochPlan, PlanPolicy
from lakeckpt_tables.plan.compact import Parts
from lakeckpt_tables.plan.order import BALANCE_LIMIT, unit_order
from lakeckpt_tables.plan.shuffle import SHUFFLERS

SEEDS = (0, 1, 2, 123_456_789)
EPOCHS = range(BALANCE_CYCLE + 2)  # a whole chain of balanced deals and the next one's start
MANY = BALANCE_LIMIT + 1_000  # past the limit: orders are random, not layered


def _shapes() -> dict[str, tuple[int, Any]]:
    """name -> (units, groups as unit_order takes them)."""
    few_parts = Parts(np.full(60, 4_000), np.array([1, 2, 3, 4] * 15))
    many_parts = Parts(np.full(MANY // 2, 8_000), np.full(MANY // 2, 2))
    return {
        "one unit per group": (150, None),
        "units of row groups": (200, np.repeat(np.arange(50, dtype=np.int64), 4)),
        "parts": (len(few_parts), few_parts),
        "many units": (MANY, None),
        "many parts": (len(many_parts), many_parts),
    }


SHAPES = _shapes()


def _differ(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    """Whether two orders differ in what their first half holds (what a rank of two reads),
    not only in order."""
    half = len(a) // 2
    return set(a[:half].tolist()) != set(b[:half].tolist())


@pytest.mark.parametrize("shuffler", SHUFFLERS)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_different_seeds_give_different_unit_orders_at_every_epoch(shuffler: str,
                                                                   shape: str) -> None:
    count, groups = SHAPES[shape]
    # past the balance limit orders are not chained from epoch to epoch: two epochs say it
    for epoch in EPOCHS if count <= BALANCE_LIMIT else range(2):
        orders = {seed: np.asarray(unit_order(count, PlanPolicy(batch_size=1, seed=seed,
                                                                 shuffler=shuffler),
                                              0, epoch, groups))
                  for seed in SEEDS}
        for seed, order in orders.items():
            assert np.array_equal(np.sort(order), np.arange(count)), (shuffler, shape, seed)
        for a, b in itertools.combinations(SEEDS, 2):
            assert _differ(orders[a], orders[b]), (
                f"{shuffler}, {shape}: seeds {a} and {b} give the same units to the first half "
                f"in epoch {epoch}")


def _canonical_rows(plan: EpochPlan, unit_rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The table's row (canonical order) at each row of the plan's base space."""
    starts = np.concatenate([[0], np.cumsum(unit_rows)])
    return np.concatenate([np.arange(starts[u] + a, starts[u] + b)
                           for u, a, b in plan.locate([(0, int(starts[-1]))])])


@pytest.mark.parametrize("shuffler", SHUFFLERS)
def test_different_seeds_give_each_rank_other_rows_and_another_row_order_at_every_epoch(
        shuffler: str) -> None:
    unit_rows = np.full(96, 50)  # one window per rank: only the unit order decides its rows
    groups = np.repeat(np.arange(48, dtype=np.int64), 2)
    for epoch in EPOCHS:
        emitted = {}
        for seed in SEEDS:
            plan = EpochPlan(unit_rows, PlanPolicy(batch_size=10, world_size=2, seed=seed,
                                                   shuffle_window=64, shuffler=shuffler),
                             epoch=epoch, groups=groups)
            canonical = _canonical_rows(plan, unit_rows)
            emitted[seed] = [canonical[np.concatenate([w.rows() for w in plan.windows(g)])]
                             for g in range(2)]
        for a, b in itertools.combinations(SEEDS, 2):
            for g in range(2):
                assert set(emitted[a][g].tolist()) != set(emitted[b][g].tolist()), (
                    f"{shuffler}: seeds {a} and {b} give rank {g} the same rows in epoch "
                    f"{epoch}")
                assert not np.array_equal(emitted[a][g], emitted[b][g])
