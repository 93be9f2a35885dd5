"""Deleted rows dropped from list columns (NOTE [ list columns filtered as bytes ] in
``sources/_deletes.py``): exactly Arrow's filter, type, rows and values, for list columns
filtered as bytes and for the kinds filtered as they are."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from lakeckpt_tables.sources._deletes import select_live


def _lists(n: int, value_type: pa.DataType, *, large: bool) -> pa.Array:
    rng = np.random.default_rng(n)
    offsets = np.concatenate([[0], np.cumsum(rng.integers(0, 12, n))])
    values = pa.array(rng.integers(0, 100, int(offsets[-1])), pa.int64()).cast(value_type)
    kind = (pa.large_list if large else pa.list_)(pa.field("element", value_type))
    offset_type = pa.int64() if large else pa.int32()
    return pa.Array.from_buffers(kind, n, [None, pa.array(offsets, offset_type).buffers()[1]],
                                 children=[values])


def _check(table: pa.Table) -> None:
    keep = np.random.default_rng(1).random(table.num_rows) > 0.3
    keep[-1] = True  # the last row kept: its values end the buffer
    got = select_live(table, keep)
    want = table.filter(pa.array(keep))
    got.validate(full=True)
    assert got.schema == want.schema and got.equals(want)
    assert got.to_pylist() == want.to_pylist()


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("value_type", [pa.int32(), pa.int64(), pa.float32(), pa.uint8()])
def test_list_columns_lose_exactly_the_deleted_rows(large: bool, value_type: pa.DataType) -> None:
    lists = _lists(300, value_type, large=large)
    shifted = pa.ListArray.from_arrays(  # a child with an offset of its own
        lists.offsets, pa.concat_arrays([pa.array([9], value_type), lists.values]).slice(1))
    tokens = pa.chunked_array([lists.slice(20, 200), lists.slice(0, 0),
                               shifted if not large else lists.slice(220, 80)])
    _check(pa.table({"id": np.arange(len(tokens)), "tokens": tokens}))
    _check(pa.table({"tokens": lists.slice(7, 100)}))  # offsets not starting at 0


@pytest.mark.parametrize("column", [
    pa.array([[1, None], [2], [], [3, 4], [5]] * 3, pa.list_(pa.int32())),  # null values
    pa.array([[1], None, [], [3, 4], [5]] * 3, pa.list_(pa.int32())),  # a null list
    pa.array([[True], [False], [], [True], []] * 3, pa.list_(pa.bool_())),
    pa.array(["a", "bc", "", "d", "e"] * 3),
])
def test_other_columns_are_filtered_as_they_are(column: pa.Array) -> None:
    _check(pa.table({"c": column, "tokens": _lists(15, pa.int32(), large=False)}))
