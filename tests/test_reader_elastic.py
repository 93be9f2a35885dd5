"""Ranks read in lockstep, and an elastic resume redistributes what is left exactly once.

Ranks are simulated in one process: one LakeDataset per rank with ``rank=`` and
``world_size=``, each behind its own StatefulDataLoader (Guarantees 1, 2 and 6).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from conftest import Table, base_ids, canonical_unit_ids, flat, loader_for, take
from hypothesis import given, settings
from hypothesis import strategies as st

from lakeckpt_tables.errors import StateMismatchError
from lakeckpt_tables.plan import EpochPlan, PlanPolicy, replan
from lakeckpt_tables.plan.check import check_exactly_once
from lakeckpt_tables.reader import (
    ReaderState,
    decode_state,
    encode_state,
    merge_states,
    states_from_loader,
)


@dataclass(frozen=True)
class Shape:
    world_size: int
    workers: int  # DataLoader workers; 0 reads in the main process
    batch_size: int

    @property
    def plan_shape(self) -> tuple[int, int, int]:
        return (self.world_size, max(self.workers, 1), self.batch_size)

    def policy(self, common: Common) -> PlanPolicy:
        return PlanPolicy(batch_size=self.batch_size, world_size=self.world_size,
                          workers=max(self.workers, 1), shuffle=common.shuffle,
                          seed=common.seed, shuffle_window=common.shuffle_window)


@dataclass(frozen=True)
class Common:
    """What every stage of one run shares (the run configuration a state is checked against)."""

    seed: int
    shuffle: bool
    shuffle_window: int
    epochs: int

    def reader_args(self, shape: Shape, rank: int) -> dict[str, Any]:
        return {"seed": self.seed, "shuffle": self.shuffle, "shuffle_window": self.shuffle_window,
                "epochs": self.epochs, "batch_size": shape.batch_size, "rank": rank,
                "world_size": shape.world_size}


commons = st.builds(Common, seed=st.integers(0, 5), shuffle=st.booleans(),
                    shuffle_window=st.integers(1, 3), epochs=st.integers(1, 2))


def shapes(workers: st.SearchStrategy[int]) -> st.SearchStrategy[Shape]:
    return st.builds(Shape, world_size=st.integers(1, 3), workers=workers,
                     batch_size=st.integers(2, 40))


def assert_lockstep(runs: list[list[list[int]]]) -> None:
    """Every rank yields the same number of batches; sizes at a step differ by at most one."""
    if len(runs) < 2:
        return
    assert len({len(run) for run in runs}) == 1, [len(run) for run in runs]
    for step in zip(*runs, strict=True):
        sizes = [len(batch) for batch in step]
        assert max(sizes) - min(sizes) <= 1, sizes


def full_pass(table: Table, common: Common, shape: Shape) -> list[list[list[int]]]:
    return [take(loader_for(table.dataset(**common.reader_args(shape, rank)), shape.workers))
            for rank in range(shape.world_size)]


@settings(deadline=None, max_examples=20)
@given(common=commons, shape=st.builds(Shape, world_size=st.integers(2, 5), workers=st.just(0),
                                       batch_size=st.integers(1, 60)))
def test_every_rank_yields_the_same_number_of_batches_differing_by_at_most_one_row(
    source: Table, common: Common, shape: Shape
) -> None:
    runs = full_pass(source, common, shape)
    assert_lockstep(runs)
    assert all(len(batch) >= 1 for run in runs for batch in run)


@pytest.mark.parametrize("shape", [Shape(2, 2, 25), Shape(3, 1, 1), Shape(2, 2, 1)])
def test_ranks_with_dataloader_workers_stay_in_lockstep(source: Table, shape: Shape) -> None:
    """387 rows: 2 x 2 workers at batch 25 cut slices of 96 and 97 rows; at batch 1 with
    uneven slices the plan keeps the remainder back as its tail, never an extra batch."""
    common = Common(seed=4, shuffle=True, shuffle_window=2, epochs=1)
    runs = full_pass(source, common, shape)
    assert_lockstep(runs)
    delivered = flat(b for run in runs for b in run)
    assert len(delivered) == len(set(delivered))
    slices = shape.world_size * max(shape.workers, 1)
    if shape.batch_size == 1:
        assert len(delivered) == source.rows - source.rows % slices
    else:
        assert len(delivered) == source.rows


class Run:
    """A run through stages of different shapes, each resumed from the merged state of all
    ranks of the stage before."""

    def __init__(self, table: Table, common: Common) -> None:
        self.table = table
        self.common = common
        self.delivered: list[int] = []
        self.state: dict[str, Any] | None = None
        self.tails: dict[int, list[int]] = {}  # per epoch: ids the current plan leaves out
        self.unit_rows = [u.rows for u in table.make_source().snapshot().units]
        self.unit_ids = canonical_unit_ids(table)

    def stage(self, shape: Shape, steps: int | None) -> list[list[list[int]]]:
        """Every rank reads ``steps`` batches (to the end when None) at ``shape``."""
        self._account_tails(shape)
        runs, states = [], []
        for rank in range(shape.world_size):
            dataset = self.table.dataset(**self.common.reader_args(shape, rank))
            if self.state is not None:
                dataset.load_state_dict(self.state)
            loader = loader_for(dataset, shape.workers)
            runs.append(take(loader, steps))
            states.extend(states_from_loader(json.loads(json.dumps(loader.state_dict()))))
        merged = merge_states(states)
        if merged.plan is None:  # taken before any batch: no position yet, nothing to resume
            assert not self.delivered and not flat(b for run in runs for b in run)
        else:
            assert merged.complete
            self.state = decode_state(encode_state(merged))
        self.delivered.extend(flat(b for run in runs for b in run))
        return runs

    def _account_tails(self, shape: Shape) -> None:
        """Track the ids the plan reports undelivered, per epoch (the oracle is the pure plan).

        A re-plan takes up the tails of the epochs it re-plans; a tail of an epoch every
        slice had finished stays undelivered.
        """
        old = None if self.state is None else ReaderState.from_dict(self.state)
        if old is not None and old.plan == shape.plan_shape:
            return  # the same shape resumes its own plan: nothing is re-planned
        if old is None or old.plan is None:
            layouts: dict[int, Any] = {}
            first = 0
        else:
            world, workers, batch = old.plan
            policy = Shape(world, workers, batch).policy(self.common)
            first, layouts = replan(self.unit_rows, policy, dict(old.layouts), old.positions())
        for epoch in range(first, self.common.epochs):
            plan = EpochPlan(self.unit_rows, shape.policy(self.common), epoch=epoch,
                             layout=layouts.get(epoch))
            ids = base_ids(plan, self.unit_ids)
            tail = [int(i) for piece in plan.tail() for i in ids[piece.rows()]]
            if plan.rows >= plan.policy.slices:
                assert tail == [], "with batch size >= 2 only too few rows leave a tail"
            self.tails[epoch] = tail

    def assert_exactly_once(self) -> None:
        # the tails (rows the plan cannot give in lockstep) are due one time less
        tails = [i for tail in self.tails.values() for i in tail]
        verdict = check_exactly_once([*self.delivered, *tails], self.table.ids,
                                     times=self.common.epochs)
        assert verdict, str(verdict)


def steps_for(table: Table, common: Common, shape: Shape, fraction: float) -> int:
    per_rank = math.ceil(common.epochs * table.rows / (shape.world_size * shape.batch_size))
    return int(fraction * per_rank)


def check_elastic(table: Table, common: Common, stages: list[tuple[Shape, float]],
                  last: Shape) -> None:
    run = Run(table, common)
    for shape, fraction in stages:
        assert_lockstep(run.stage(shape, steps_for(table, common, shape, fraction)))
    assert_lockstep(run.stage(last, None))
    run.assert_exactly_once()


@settings(deadline=None, max_examples=20)
@given(common=commons, first=shapes(st.just(0)), then=shapes(st.just(0)),
       fraction=st.floats(0.0, 1.0))
def test_an_elastic_resume_in_the_main_process_delivers_every_row_exactly_once(
    source: Table, common: Common, first: Shape, then: Shape, fraction: float
) -> None:
    check_elastic(source, common, [(first, fraction)], then)


@settings(deadline=None, max_examples=4)
@given(common=commons, first=shapes(st.integers(0, 2)), then=shapes(st.integers(0, 2)),
       fraction=st.floats(0.0, 1.0))
def test_an_elastic_resume_across_worker_counts_delivers_every_row_exactly_once(
    source: Table, common: Common, first: Shape, then: Shape, fraction: float
) -> None:
    check_elastic(source, common, [(first, fraction)], then)


@settings(deadline=None, max_examples=15)
@given(common=commons, stages=st.lists(st.tuples(shapes(st.just(0)), st.floats(0.0, 0.7)),
                                       min_size=2, max_size=3),
       last=shapes(st.just(0)))
def test_elastic_resumes_in_a_row_still_deliver_every_row_exactly_once(
    delta_table: Table, common: Common, stages: list[tuple[Shape, float]], last: Shape
) -> None:
    check_elastic(delta_table, common, stages, last)


@pytest.mark.parametrize(("before", "after"), [
    (Shape(2, 2, 16), Shape(3, 1, 16)),   # fewer workers, more ranks
    (Shape(3, 0, 10), Shape(1, 2, 24)),   # one rank with workers takes over
    (Shape(1, 2, 32), Shape(2, 2, 7)),    # another batch size
])
def test_an_elastic_resume_at_a_fixed_shape_change_delivers_every_row_exactly_once(
    source: Table, before: Shape, after: Shape
) -> None:
    common = Common(seed=3, shuffle=True, shuffle_window=2, epochs=2)
    check_elastic(source, common, [(before, 0.4)], after)


def test_an_elastic_resume_between_epochs_delivers_every_row_exactly_once(
    delta_table: Table,
) -> None:
    """Crash after the first epoch ended for every rank: the re-plan starts the second one."""
    common = Common(seed=8, shuffle=True, shuffle_window=2, epochs=2)
    before, after = Shape(2, 0, 20), Shape(3, 0, 9)
    per_epoch = math.ceil(delta_table.rows / 2 / 20)
    run = Run(delta_table, common)
    run.stage(before, per_epoch)
    assert ReaderState.from_dict(run.state or {}).positions()[0][0] == 0
    assert_lockstep(run.stage(after, None))
    run.assert_exactly_once()


def test_resuming_the_same_merged_state_twice_gives_the_same_batches(
    delta_table: Table,
) -> None:
    common = Common(seed=2, shuffle=True, shuffle_window=3, epochs=1)
    run = Run(delta_table, common)
    run.stage(Shape(2, 0, 12), 5)
    again = [take(loader_for(_resumed(delta_table, common, run.state, r), 0)) for r in range(3)]
    for rank in range(3):
        assert take(loader_for(_resumed(delta_table, common, run.state, rank), 0)) == again[rank]


def _resumed(table: Table, common: Common, state: Any, rank: int) -> Any:
    dataset = table.dataset(**common.reader_args(Shape(3, 0, 12), rank))
    dataset.load_state_dict(state)
    return dataset


@pytest.mark.parametrize("world_size", [1, 3])
def test_loading_one_ranks_state_at_another_world_size_names_both_shapes(
    delta_table: Table, world_size: int
) -> None:
    common = Common(seed=1, shuffle=True, shuffle_window=2, epochs=1)
    loader = loader_for(delta_table.dataset(**common.reader_args(Shape(2, 0, 8), 0)), 0)
    take(loader, 3)
    dataset = delta_table.dataset(**common.reader_args(Shape(world_size, 0, 8), 0))
    dataset.load_state_dict(loader.state_dict())  # rank 0's state only
    with pytest.raises(StateMismatchError) as info:
        next(iter(dataset))
    message = str(info.value)
    assert "(world_size, workers, batch_size)=(2, 1, 8)" in message
    assert f"({world_size}, 1, 8)" in message
    assert "merge" in message


def test_merging_states_that_claim_the_same_slice_differently_is_refused(
    delta_table: Table,
) -> None:
    common = Common(seed=1, shuffle=True, shuffle_window=2, epochs=1)
    states = []
    for steps in (2, 4):
        loader = loader_for(delta_table.dataset(**common.reader_args(Shape(2, 0, 8), 1)), 0)
        take(loader, steps)
        states.append(loader.state_dict()["dataset_state"])
    with pytest.raises(StateMismatchError, match="disagree on slice 1"):
        merge_states(states)
    with pytest.raises(StateMismatchError, match="no reader states"):
        merge_states([])


def test_merged_positions_are_rows_delivered_per_slice(delta_table: Table) -> None:
    """The state is positions: one integer per (rank, worker), the rows it delivered."""
    common = Common(seed=1, shuffle=True, shuffle_window=2, epochs=1)
    shape = Shape(2, 0, 8)
    runs, states = [], []
    for rank in range(2):
        loader = loader_for(delta_table.dataset(**common.reader_args(shape, rank)), 0)
        runs.append(take(loader, 5))
        states.extend(states_from_loader(loader.state_dict()))
    merged = merge_states(states)
    assert merged.plan == (2, 1, 8)
    assert merged.positions() == [(0, len(flat(run))) for run in runs]
    assert np.all(np.array([len(flat(run)) for run in runs]) == 40)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_crash_after_an_elastic_resume_resumes_into_the_same_sequence(
    delta_table: Table, workers: int
) -> None:
    """Determinism holds on the re-planned pass too, whichever way it is resumed."""
    common = Common(seed=5, shuffle=True, shuffle_window=2, epochs=2)
    run = Run(delta_table, common)
    run.stage(Shape(3, 0, 10), 7)
    after = Shape(2, workers, 12)

    def resumed(rank: int, state: Any) -> Any:
        dataset = delta_table.dataset(**common.reader_args(after, rank))
        dataset.load_state_dict(state)
        return dataset

    for rank in range(after.world_size):
        full = take(loader_for(resumed(rank, run.state), workers))
        loader = loader_for(resumed(rank, run.state), workers)
        head = take(loader, 5)
        saved = json.loads(json.dumps(loader.state_dict()))
        assert head + take(loader_for(resumed(rank, saved), workers)) == full
        again = loader_for(delta_table.dataset(**common.reader_args(after, rank)), workers)
        again.load_state_dict(saved)
        assert head + take(again) == full
