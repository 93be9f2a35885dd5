"""Every epoch reads every row once, in its own order; the order is a function of the seed
(Guarantees 1 and 2)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from conftest import Table, base_ids, canonical_unit_ids, flat, loader_for, plan_for, take
from hypothesis import given, settings
from hypothesis import strategies as st


def epochs_of(table: Table, *, epochs: int, batch_size: int, workers: int = 0,
              **kwargs: Any) -> list[list[int]]:
    """The ids of each epoch of one pass (one rank, one slice per epoch in the main process)."""
    batches = take(loader_for(table.dataset(epochs=epochs, batch_size=batch_size, **kwargs),
                              workers))
    per_epoch = math.ceil(table.rows / batch_size)
    assert len(batches) == epochs * per_epoch
    return [flat(batches[e * per_epoch:(e + 1) * per_epoch]) for e in range(epochs)]


@settings(deadline=None, max_examples=10)
@given(seed=st.integers(0, 2**31), batch_size=st.integers(1, 64), window=st.integers(1, 4))
def test_each_epoch_reads_every_row_once_in_a_different_order(
    source: Table, seed: int, batch_size: int, window: int
) -> None:
    epochs = epochs_of(source, epochs=3, batch_size=batch_size, seed=seed,
                       shuffle_window=window)
    for ids in epochs:
        assert sorted(ids) == source.ids.tolist()
    assert len({tuple(ids) for ids in epochs}) == 3


def test_the_same_seed_gives_the_same_order_and_another_seed_another(source: Table) -> None:
    first = epochs_of(source, epochs=2, batch_size=32, seed=11)
    assert epochs_of(source, epochs=2, batch_size=32, seed=11) == first
    other = epochs_of(source, epochs=2, batch_size=32, seed=12)
    assert other[0] != first[0] and other[1] != first[1]
    assert sorted(other[0]) == sorted(first[0])


def test_the_order_does_not_depend_on_the_batch_size(source: Table) -> None:
    """Batches are cut from one row order; the order is set by the seed and the window."""
    a = epochs_of(source, epochs=2, batch_size=7, seed=3)
    b = epochs_of(source, epochs=2, batch_size=50, seed=3)
    assert a == b


def test_workers_make_the_same_order_on_every_run(source: Table) -> None:
    args = {"epochs": 2, "batch_size": 30, "seed": 5, "rank": 1, "world_size": 2}
    first = take(loader_for(source.dataset(**args), 2))
    assert take(loader_for(source.dataset(**args), 2)) == first
    # exactly the rows of rank 1's two worker slices, once per epoch
    unit_ids = canonical_unit_ids(source)
    expected: Counter[int] = Counter()
    for epoch in range(2):
        plan = plan_for(source, batch_size=30, world_size=2, workers=2, seed=5, epoch=epoch)
        ids = base_ids(plan, unit_ids)
        for g in (2, 3):
            expected.update(int(i) for p in plan.slice_layout(g) for i in ids[p.rows()])
    assert Counter(flat(first)) == expected


def test_without_shuffle_every_epoch_reads_the_files_in_order(source: Table) -> None:
    epochs = epochs_of(source, epochs=2, batch_size=40, shuffle=False)
    assert epochs[0] == epochs[1]
    runs = [epochs[0][0]]  # ids within a file are ascending: count the breaks between files
    for prev, cur in zip(epochs[0], epochs[0][1:], strict=False):
        if cur != prev + 1:
            runs.append(cur)
    assert len(runs) <= 5  # five data files, each read front to back
