"""A shuffled window gathered batch by batch (NOTE [ gathering a shuffled window ] in
``reader/gather.py``): every batch is exactly what one Arrow ``take`` of the window's row group
slices gives, type, rows and values, whatever the slicing, offsets and column kinds (list columns
described as ``binary_view`` views over the row groups' buffers, short rows inline, numeric
columns as numpy, any other column taken as it is)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from lakeckpt_tables.reader.gather import Gathered


def _lists(n: int, seed: int, value_type: pa.DataType, *, large: bool = False,
           most: int = 9) -> pa.Array:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, most + 1, n)
    lengths[::7] = 0  # empty lists among them
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = pa.array(rng.integers(0, 100, int(offsets[-1])), type=pa.int64()).cast(value_type)
    kind = (pa.large_list if large else pa.list_)(pa.field("element", value_type))
    offset_type = pa.int64() if large else pa.int32()
    return pa.Array.from_buffers(kind, n, [None, pa.array(offsets, offset_type).buffers()[1]],
                                 children=[values])


def _row_groups(columns: dict[str, list[pa.Array]]) -> list[pa.Table]:
    count = len(next(iter(columns.values())))
    return [pa.table({name: parts[k] for name, parts in columns.items()}) for k in range(count)]


def _check(runs: list[tuple[pa.Table, int, int]], seed: int = 0) -> None:
    whole = pa.concat_tables([t.slice(a, b - a) for t, a, b in runs],
                             promote_options="permissive")
    order = np.random.default_rng(seed).permutation(whole.num_rows)
    gathered = Gathered(runs, order)
    assert gathered.num_rows == whole.num_rows
    for first, rows in [(0, whole.num_rows), (0, 1), (3, 17), (whole.num_rows - 5, 5), (4, 0)]:
        got = gathered.slice(first, rows)
        want = whole.take(order[first:first + rows])
        assert got.schema == want.schema
        got.validate(full=True)
        assert got.equals(want), (first, rows)
        assert got.to_pylist() == want.to_pylist()


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("value_type", [pa.int32(), pa.int64(), pa.float32(), pa.uint8(),
                                        pa.int16(), pa.float16()])
def test_list_columns_are_gathered_exactly(large: bool, value_type: pa.DataType) -> None:
    # rows of 0-20 values: short ones inline in their views, long ones in the buffers, some
    # ending at the very end of a buffer
    groups = _row_groups({"id": [pa.array(np.arange(k * 100, k * 100 + 80)) for k in range(3)],
                          "tokens": [_lists(80, k, value_type, large=large, most=20)
                                     for k in range(3)]})
    _check([(groups[1], 5, 60), (groups[0], 0, 80), (groups[2], 70, 80), (groups[1], 60, 80)])
    _check([(groups[2], 0, 80)], seed=1)  # one run


def test_sliced_arrays_and_children_with_offsets_are_gathered_exactly() -> None:
    whole = _lists(500, 3, pa.int32(), most=30)
    sliced = whole.slice(100, 200)  # offsets not starting at 0
    shifted = pa.ListArray.from_arrays(whole.offsets, pa.concat_arrays(
        [pa.array([7, 7, 7], pa.int32()), whole.values]).slice(3))  # a child with an offset
    assert sliced.offset == 100 and shifted.values.offset == 3
    groups = [pa.table({"tokens": a}) for a in (sliced, shifted)]
    _check([(groups[0], 10, 190), (groups[1], 400, 500), (groups[0], 0, 10)])


def test_all_empty_lists_and_an_empty_window_are_gathered() -> None:
    empty = pa.table({"tokens": pa.array([[], [], []], pa.list_(pa.int32()))})
    _check([(empty, 0, 3)])
    gathered = Gathered([(empty, 0, 0)], np.zeros(0, dtype=np.int64))
    assert gathered.num_rows == 0 and gathered.slice(0, 0).num_rows == 0


@pytest.mark.parametrize("column", [
    pa.array([[1, None], [2], [], [3, 4], [5]], pa.list_(pa.int32())),  # null values
    pa.array([[1], None, [], [3, 4], [5]], pa.list_(pa.int32())),  # a null list
    pa.array([[True], [False, True], [], [True], []], pa.list_(pa.bool_())),  # bit-packed
    pa.array([["a"], ["b", "c"], [], ["d"], ["e"]], pa.list_(pa.string())),
    pa.array(["a", "bc", "", "d", "efg"]),
    pa.array([[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]], pa.list_(pa.int32(), 2)),
    pa.array([1.5, None, 2.5, 3.5, 4.5]),
])
def test_other_columns_are_taken_as_they_are(column: pa.Array) -> None:
    table = pa.table({"c": column})
    _check([(table, 2, 5), (table, 0, 2)])
    assert Gathered([(table, 0, 5)], np.arange(5)).plain() is None


def test_numeric_columns_are_numpy_and_evolved_types_are_promoted() -> None:
    old = pa.table({"id": pa.array([1, 2, 3], pa.int32()), "x": pa.array([1.0, 2.0, 3.0])})
    new = pa.table({"id": pa.array([4, 5], pa.int64()), "x": pa.array([4.0, 5.0])})
    _check([(old, 0, 3), (new, 0, 2)])
    plain = Gathered([(new, 0, 2), (new, 0, 1)], np.array([2, 0, 1])).plain()
    assert plain is not None and [name for name, _ in plain] == ["id", "x"]
    assert plain[0][1].tolist() == [4, 4, 5]  # gathered whole, in emission order


def _counted_cuts(gathered: Gathered, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows of each gather of the list column (a spy on its ``cut``)."""
    from lakeckpt_tables.reader import gather

    sizes: list[int] = []
    real = gather._Lists.cut

    def cut(self: Any, first: int, at: np.ndarray[Any, Any]) -> pa.Array:
        sizes.append(len(at))
        return real(self, first, at)

    monkeypatch.setattr(gather._Lists, "cut", cut)
    return sizes


@pytest.mark.parametrize(("block_rows", "block_bytes", "want"), [
    (16, 1 << 20, 15),  # rows bound the block: 5 batches of 3
    (10_000, 700, 6),  # bytes bound it (~100 bytes a row): 2 batches
    (10_000, 10, 3),  # a batch is never split
])
def test_batches_are_cut_from_blocks_gathered_once(
        monkeypatch: pytest.MonkeyPatch, block_rows: int, block_bytes: int, want: int) -> None:
    from lakeckpt_tables.reader import gather

    monkeypatch.setattr(gather, "BLOCK_ROWS", block_rows)
    monkeypatch.setattr(gather, "BLOCK_BYTES", block_bytes)
    groups = _row_groups({"id": [pa.array(np.arange(k * 100, k * 100 + 80)) for k in range(2)],
                          "tokens": [_lists(80, k, pa.int64(), most=20) for k in range(2)]})
    runs = [(groups[0], 0, 80), (groups[1], 0, 80)]
    whole = pa.concat_tables([t for t, _, _ in runs])
    order = np.random.default_rng(3).permutation(160)
    gathered = Gathered(runs, order)
    sizes = _counted_cuts(gathered, monkeypatch)
    got = [gathered.slice(first, min(3, 160 - first)) for first in range(0, 160, 3)]
    assert pa.concat_tables(got).equals(whole.take(order))  # the same rows, in order
    assert max(sizes) == want and sum(sizes) == 160  # each row gathered once, in blocks
    assert gathered.slice(150, 10).equals(whole.take(order[150:]))  # asked again: gathered
