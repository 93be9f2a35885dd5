"""A shuffled window's batches made straight from its gathered blocks (NOTE [ fused batches ] in
``reader/gather.py``) are exactly the straightforward path's: one Arrow ``take`` of the window
in emission order, each batch converted by ``convert``: same columns, tensor kinds, dtypes,
shapes and values, on random ragged data (empty lists, sliced arrays, children with offsets of
their own, ``list`` and ``large_list``, several row groups, nulls where a column has them)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lakeckpt_tables.errors import UnsupportedTableError
from lakeckpt_tables.reader.convert import CutConverter, Ragged, convert
from lakeckpt_tables.reader.gather import Gathered

VALUE_TYPES = [pa.int32(), pa.int64(), pa.float32(), pa.uint8(), pa.int16(), pa.float64()]


def _lists(rng: np.random.Generator, n: int, value_type: pa.DataType, *, large: bool,
           most: int, equal: bool, skip: int, null_values: bool) -> pa.Array:
    """``n`` lists of 0-``most`` values (all of one length when ``equal``) whose values start
    ``skip`` values into their child array."""
    lengths = np.full(n, most) if equal else rng.integers(0, most + 1, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = pa.array(rng.integers(0, 100, int(offsets[-1]) + skip), pa.int64())
    if null_values:  # a float column's nulls become NaN; an integer one's are refused
        values = pa.array(values.to_numpy(), mask=rng.random(len(values)) < 0.1)
    values = values.cast(value_type).slice(skip)
    kind = (pa.large_list if large else pa.list_)(pa.field("element", value_type))
    offset_type = pa.int64() if large else pa.int32()
    return pa.Array.from_buffers(kind, n, [None, pa.array(offsets, offset_type).buffers()[1]],
                                 children=[values])


def _same(got: Any, want: Any) -> None:
    assert type(got) is type(want)
    if isinstance(want, Ragged):
        _same(got.values, want.values)
        _same(got.offsets, want.offsets)
        return
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got.numpy(), want.numpy(), equal_nan=got.dtype.is_floating_point)


@st.composite
def windows(draw: st.DrawFn) -> tuple[list[tuple[pa.Table, int, int]], int]:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    value_type = draw(st.sampled_from(VALUE_TYPES))
    large, equal = draw(st.booleans()), draw(st.booleans())
    null_values = draw(st.booleans()) and pa.types.is_floating(value_type)
    most = draw(st.sampled_from([0, 2, 3, 5, 40]))  # 0: every list empty; <= 3: inline views
    groups = []
    for k in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 60))
        tokens = _lists(rng, n + 5, value_type, large=large, most=most, equal=equal,
                        skip=draw(st.integers(0, 3)), null_values=null_values)
        tokens = tokens.slice(draw(st.integers(0, 5)), n)  # an array with an offset
        groups.append(pa.table({"id": pa.array(np.arange(n) + 1000 * k),
                                "tokens": tokens}))
    runs = []
    for _ in range(draw(st.integers(1, 4))):
        table = groups[draw(st.integers(0, len(groups) - 1))]
        first = draw(st.integers(0, table.num_rows - 1))
        runs.append((table, first, draw(st.integers(first + 1, table.num_rows))))
    return runs, draw(st.integers(1, 50))


@settings(max_examples=150, deadline=None)
@given(windows())
def test_fused_batches_are_the_taken_rows_converted(window: Any) -> None:
    runs, batch_size = window
    whole = pa.concat_tables([table.slice(a, b - a) for table, a, b in runs])
    order = np.random.default_rng(len(whole)).permutation(whole.num_rows)
    gathered, converted = Gathered(runs, order), CutConverter("torch", "refuse")
    for first in range(0, whole.num_rows, batch_size):
        rows = min(batch_size, whole.num_rows - first)
        try:
            want = convert(whole.take(order[first:first + rows]), "torch", "refuse")
        except UnsupportedTableError:
            with pytest.raises(UnsupportedTableError):
                converted(gathered, first, rows)
            return
        got = converted(gathered, first, rows)
        assert list(got) == list(want)
        for name in want:
            _same(got[name], want[name])


def test_lists_of_plain_values_are_fused_and_others_are_not() -> None:
    rng = np.random.default_rng(0)
    tokens = _lists(rng, 40, pa.int32(), large=False, most=9, equal=False, skip=0,
                    null_values=False)
    table = pa.table({"id": pa.array(np.arange(40)), "tokens": tokens})
    fused = Gathered([(table, 0, 40)], rng.permutation(40))
    batch = fused.tensors(4, 10)
    assert batch is not None and isinstance(batch["tokens"], Ragged)
    assert batch["tokens"].offsets.dtype == torch.int64 and int(batch["tokens"].offsets[0]) == 0
    dates = pa.table({"d": pa.array([[1], [2, 3]], pa.list_(pa.date32()))})
    assert Gathered([(dates, 0, 2)], np.array([1, 0])).tensors(0, 2) is None
