"""Arrow batches to torch: zero-copy for numeric columns wherever Arrow allows."""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from lakeckpt_tables.errors import UnsupportedTableError

__all__ = ["Ragged", "to_tensors"]


class Ragged(NamedTuple):
    """A variable-length list column: row ``i`` is ``values[offsets[i]:offsets[i + 1]]``."""

    values: torch.Tensor
    offsets: torch.Tensor


def _spend_readonly_warning() -> None:
    """Arrow buffers are read-only and torch warns when it wraps one, but only once per process
    (``TORCH_WARN_ONCE``); batches are never written to. Spend that one warning here, silenced,
    rather than entering ``warnings.catch_warnings()`` for every batch: that costs a few us per
    batch on the hot path, and it swaps process-global warning filters, which is not
    thread-safe. A forked worker inherits the spent warning; a spawned one imports this module.
    """
    readonly = np.zeros(1)
    readonly.flags.writeable = False
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        torch.from_numpy(readonly)


_spend_readonly_warning()

# Types whose non-null arrays go straight to torch zero-copy (the hot path: one set lookup
# instead of a dozen type predicates per column per batch).
_PLAIN_NUMERIC = frozenset(t.id for t in (
    pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
    pa.uint64(), pa.float16(), pa.float32(), pa.float64()))


def to_tensors(table: pa.Table) -> dict[str, Any]:
    """One batch as a dict: tensors, 2-D tensors for fixed-length lists, :class:`Ragged` for
    variable-length lists, lists of ``str``/``bytes`` for strings and binaries."""
    # schema.names, not column_names: the latter costs ~2 us per call, a fifth of a batch's
    # conversion on the hot path.
    return {name: _column(name, column)
            for name, column in zip(table.schema.names, table.columns, strict=True)}


def _column(name: str, column: pa.ChunkedArray) -> Any:
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    kind = array.type
    if kind.id in _PLAIN_NUMERIC and not array.null_count:
        return torch.from_numpy(array.to_numpy(zero_copy_only=True))
    if pa.types.is_dictionary(kind):
        array = array.dictionary_decode()
        kind = array.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _list(name, array)
    if (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
            or pa.types.is_large_binary(kind) or pa.types.is_string_view(kind)):
        return array.to_pylist()
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind) or pa.types.is_duration(kind):
        array = _as_integers(array)
    return torch.from_numpy(_numpy(name, array))


def _as_integers(array: pa.Array) -> pa.Array:
    """NOTE [ one timestamp unit ]: timestamps (naive or tz-aware) as int64 microseconds since
    the epoch, durations as int64 microseconds, dates as int32 days."""
    kind = array.type
    if pa.types.is_timestamp(kind) and kind.unit != "us":
        array = pc.cast(array, pa.timestamp("us", kind.tz), safe=False)
    elif pa.types.is_duration(kind) and kind.unit != "us":
        array = pc.cast(array, pa.duration("us"), safe=False)
    elif pa.types.is_date64(kind):
        array = array.cast(pa.date32())
    return array.cast(pa.int32() if pa.types.is_date(array.type) else pa.int64())


def _numpy(name: str, array: pa.Array) -> np.ndarray[Any, Any]:
    out: np.ndarray[Any, Any]
    if array.null_count:
        if pa.types.is_floating(array.type):
            out = array.to_numpy(zero_copy_only=False)  # nulls become NaN
            return out
        raise UnsupportedTableError(
            f"column {name!r} ({array.type}) holds {array.null_count} null(s) in a batch; "
            "torch has no null for it. Fill the nulls in the table or leave the column out."
        )
    if pa.types.is_boolean(array.type):
        out = array.to_numpy(zero_copy_only=False)  # bit-packed: one copy is unavoidable
        return out
    if pa.types.is_primitive(array.type):
        out = array.to_numpy(zero_copy_only=True)
        return out
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
