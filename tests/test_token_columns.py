"""Token (list) columns reach torch straight from the Arrow buffers (issue 12 item 2): the
values without a copy, the offsets rebased for a sliced batch, 32- and 64-bit offsets."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from lakeckpt_tables import Ragged
from lakeckpt_tables.reader.convert import to_tensors


def _tokens(kind: pa.DataType, rows: int) -> pa.Array:
    lengths = np.arange(rows) % 5  # 0 to 4 tokens: empty lists included
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = pa.array(np.arange(offsets[-1], dtype=np.int32))
    if pa.types.is_large_list(kind):
        return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


@pytest.mark.parametrize("kind", [pa.list_(pa.int32()), pa.large_list(pa.int32())])
@pytest.mark.parametrize(("start", "length"), [(0, 50), (7, 23), (13, 2), (20, 0)])
def test_a_sliced_token_batch_is_its_rows_with_values_shared_not_copied(
    kind: pa.DataType, start: int, length: int,
) -> None:
    column = _tokens(kind, 50)
    batch = column.slice(start, length)
    got = to_tensors(pa.table({"t": batch}))["t"]
    assert isinstance(got, Ragged)
    assert got.offsets.dtype == torch.int64 and len(got.offsets) == length + 1
    rows = [got.values[got.offsets[i]:got.offsets[i + 1]].tolist() for i in range(length)]
    assert rows == batch.to_pylist()
    first = int(np.asarray(column.offsets)[start])
    if length and len(got.values):
        assert got.values.data_ptr() == column.values.buffers()[1].address + 4 * first


def test_equal_lengths_in_a_slice_give_a_2d_view_of_the_values() -> None:
    column = pa.array([[9], [1, 2], [3, 4], [5, 6], [7]], pa.list_(pa.int64()))
    got = to_tensors(pa.table({"t": column.slice(1, 3)}))["t"]
    assert isinstance(got, torch.Tensor) and got.tolist() == [[1, 2], [3, 4], [5, 6]]
    assert got.data_ptr() == column.values.buffers()[1].address + 8 * 1


def test_lengths_that_sum_like_equal_ones_are_still_ragged() -> None:
    column = pa.array([[1], [2, 3, 4], [5, 6]], pa.list_(pa.int64()))  # 6 values = 3 x 2
    got = to_tensors(pa.table({"t": column}))["t"]
    assert isinstance(got, Ragged) and got.offsets.tolist() == [0, 1, 4, 6]
