"""Arrow batches to torch: zero-copy for numeric columns wherever Arrow allows."""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import torch

from lakeckpt_tables.errors import UnsupportedTableError

__all__ = ["Ragged", "to_tensors"]


class Ragged(NamedTuple):
    """A variable-length list column: row ``i`` is ``values[offsets[i]:offsets[i + 1]]``."""

    values: torch.Tensor
    offsets: torch.Tensor


def to_tensors(table: pa.Table) -> dict[str, Any]:
    """One batch as a dict: tensors, 2-D tensors for fixed-length lists, :class:`Ragged` for
    variable-length lists, lists of ``str``/``bytes`` for strings and binaries."""
    with warnings.catch_warnings():
        # Arrow buffers are read-only; torch warns once, but batches are never written to.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return {name: _column(name, table.column(name)) for name in table.column_names}


def _column(name: str, column: pa.ChunkedArray) -> Any:
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    kind = array.type
    if pa.types.is_dictionary(kind):
        array = array.dictionary_decode()
        kind = array.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _list(name, array)
    if (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
            or pa.types.is_large_binary(kind) or pa.types.is_string_view(kind)):
        return array.to_pylist()
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind) or pa.types.is_duration(kind):
        array = array.cast(pa.int64() if kind.bit_width == 64 else pa.int32())
    return torch.from_numpy(_numpy(name, array))


def _numpy(name: str, array: pa.Array) -> np.ndarray[Any, Any]:
    if array.null_count:
        if pa.types.is_floating(array.type):
            return array.to_numpy(zero_copy_only=False)  # nulls become NaN
        raise UnsupportedTableError(
            f"column {name!r} ({array.type}) holds {array.null_count} null(s) in a batch; "
            "torch has no null for it. Fill the nulls in the table or leave the column out."
        )
    if pa.types.is_boolean(array.type):
        return array.to_numpy(zero_copy_only=False)  # bit-packed: one copy is unavoidable
    if pa.types.is_primitive(array.type):
        return array.to_numpy(zero_copy_only=True)
    raise UnsupportedTableError(f"column {name!r} has type {array.type}, which has no tensor "
                                "form; leave it out with columns=[...]")


def _list(name: str, array: pa.Array) -> Any:
    if pa.types.is_fixed_size_list(array.type):
        values = _numpy(name, array.flatten())
        return torch.from_numpy(values.reshape(len(array), array.type.list_size))
    if array.null_count:
        raise UnsupportedTableError(f"list column {name!r} holds null lists; fill them first")
    offsets = np.asarray(array.offsets)  # honours slicing: len(array) + 1 entries
    offsets = offsets - offsets[0]
    values = _numpy(name, array.flatten())
    lengths = np.diff(offsets)
    if len(lengths) and (lengths == lengths[0]).all():
        return torch.from_numpy(values.reshape(len(array), int(lengths[0])))
    return Ragged(torch.from_numpy(values), torch.from_numpy(offsets.astype(np.int64)))
