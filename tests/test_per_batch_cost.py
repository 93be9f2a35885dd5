"""Per-batch bookkeeping and ``state_dict()`` are O(1) (issue 12 item 1): the Python work per
batch, the work of a state and its size do not grow with the number of batches delivered, and
memory held does not grow with them either."""

from __future__ import annotations

import json
import re
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

from conftest import Table

from lakeckpt_tables import LakeDataset


def _calls(fn: Callable[[], Any]) -> tuple[int, Any]:
    """Python and C function calls made by ``fn()``: a deterministic measure of its work."""
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        result = fn()
    finally:
        sys.setprofile(None)
    return count, result


def _dataset(table: Table) -> LakeDataset:
    # one unit per 17-row row group and a window of every unit: one read per epoch, so every
    # batch but an epoch's first is pure bookkeeping
    return table.dataset(batch_size=3, epochs=3, seed=5, read_ahead=0)


def _shape(state: dict[str, Any]) -> str:
    return re.sub(r"\d+", "0", json.dumps(state, sort_keys=True))


def test_state_dict_work_and_size_do_not_grow_with_batches_delivered(
    delta_table: Table,
) -> None:
    dataset = _dataset(delta_table)
    batches: Iterator[Any] = iter(dataset)
    per_epoch = -(-delta_table.rows // 3)
    samples = {}
    for n in range(1, 3 * per_epoch):
        next(batches)
        if n in (2, 3, per_epoch + 5, 3 * per_epoch - 2):
            samples[n] = _calls(dataset.state_dict)
    works = {calls for calls, _ in samples.values()}
    assert len(works) == 1, f"state_dict() work by batches delivered: {samples}"
    shapes = {_shape(state) for _, state in samples.values()}
    assert len(shapes) == 1  # the same keys and entries, only the numbers move
    last = samples[3 * per_epoch - 2][1]
    assert last["slices"] == [[2, 3 * (3 * per_epoch - 2 - 2 * per_epoch)]]  # exact position


def test_the_work_per_batch_does_not_grow_with_batches_delivered(delta_table: Table) -> None:
    dataset = _dataset(delta_table)
    batches: Iterator[Any] = iter(dataset)
    per_epoch = -(-delta_table.rows // 3)
    work = [_calls(lambda: next(batches))[0] for _ in range(3 * per_epoch)]
    early = work[2:per_epoch - 2]  # past the first read, before the short last batch
    late = work[2 * per_epoch + 2:3 * per_epoch - 2]
    assert max(late) <= max(early), (max(early), max(late))
    assert max(early) <= 2 * min(early)  # no batch pays for the ones before it


def test_memory_held_does_not_grow_with_batches_delivered(delta_table: Table) -> None:
    dataset = _dataset(delta_table)
    batches: Iterator[Any] = iter(dataset)
    per_epoch = -(-delta_table.rows // 3)
    for _ in range(per_epoch + 2):  # past the first read of epoch 1: caches are warm
        next(batches)
    tracemalloc.start()
    try:
        held = []
        for n in range(per_epoch - 6):  # no read until the next epoch
            next(batches)
            dataset.state_dict()
            if n in (20, per_epoch - 7):
                held.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    grown = held[1] - held[0]
    assert grown < 8 * (per_epoch - 27), f"{grown} bytes kept by {per_epoch - 27} batches"


def test_a_reads_plan_units_are_located_at_once_exactly_as_one_by_one() -> None:
    # row groups split into plan units (compact lookups), carried ranges first, whole ones
    import numpy as np

    from lakeckpt_tables.plan.rounds import RoundUnits
    from lakeckpt_tables.reader.loop import _at
    from lakeckpt_tables.types import Unit

    groups = [Unit("a.parquet", g, rows) for g, rows in enumerate((10, 3, 25, 7))]
    for carried in ((), ((Unit("b.parquet", 0, 40), 5, 30, (None, 1)),)):
        units = RoundUnits.of(groups, unit_rows=4, carried=carried)
        rng = np.random.default_rng(0)
        chunks = []
        for u in rng.permutation(len(units.rows)).tolist():
            r0 = int(rng.integers(0, int(units.rows[u]) + 1))
            chunks.append((u, r0, int(rng.integers(r0, int(units.rows[u]) + 1))))
        assert _at(units, chunks) == [units.at(*chunk) for chunk in chunks]
        assert len(chunks) > len(groups) and _at(units, []) == []
