"""Arrow batches to torch: zero-copy for numeric columns wherever Arrow allows."""

from __future__ import annotations

import decimal
import warnings
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from lakeckpt_tables.errors import UnsupportedTableError

__all__ = ["DECIMAL_POLICIES", "OUTPUTS", "Batch", "Ragged", "check_convertible", "convert",
           "to_device", "to_tensors"]

OUTPUTS = ("torch", "arrow")
DECIMAL_POLICIES = ("refuse", "float64")
PLAIN_NUMERIC = frozenset(t.id for t in (
    pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
    pa.uint64(), pa.float16(), pa.float32(), pa.float64()))
"""Arrow types whose arrays without nulls are numpy arrays, zero-copy (one set lookup
instead of a dozen type predicates per column on the hot path)."""


class Batch(dict[str, Any]):
    """One batch: column name to tensor, :class:`Ragged` or list. A plain ``dict`` in every
    way; its own type lets a DataLoader that would batch it again refuse by name (NOTE
    [ batches batched again ] in ``reader/loaders.py``)."""

    __slots__ = ()

    def __copy__(self) -> Batch:
        # a loader with batch_size=None copies every batch (default_convert): keep dict's speed
        return Batch(self)


class Ragged(NamedTuple):
    """A variable-length list column: row ``i`` is ``values[offsets[i]:offsets[i + 1]]``.

    It moves like a tensor: ``pin_memory()`` (called by a DataLoader with
    ``pin_memory=True``) and ``to(device, non_blocking=True)`` act on both tensors.
    """

    values: torch.Tensor
    offsets: torch.Tensor

    def pin_memory(self) -> Ragged:
        """Both tensors in page-locked memory (needs an accelerator, as ``Tensor.pin_memory``)."""
        return Ragged(self.values.pin_memory(), self.offsets.pin_memory())

    def to(self, *args: Any, **kwargs: Any) -> Ragged:
        """Both tensors moved as ``Tensor.to(*args, **kwargs)`` moves one."""
        return Ragged(self.values.to(*args, **kwargs), self.offsets.to(*args, **kwargs))


def to_device(batch: Any, device: torch.device | str, *, non_blocking: bool = True) -> Any:
    """A batch of any output type on ``device``: tensors and :class:`Ragged` moved (without
    blocking when their memory is pinned), strings, bytes and Arrow batches as they are.

    Args:
        batch: what the reader (or a DataLoader over it) yields: a dict, or a transform's
            output made of dicts, lists and tuples.
        device: the target device.
        non_blocking: passed to ``Tensor.to``: asynchronous from pinned memory.

    Returns:
        The batch with the same structure.
    """
    if isinstance(batch, (torch.Tensor, Ragged)):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        out = Batch() if isinstance(batch, Batch) else {}  # the reader's batches stay Batch
        for k, v in batch.items():
            out[k] = to_device(v, device, non_blocking=non_blocking)
        return out
    if isinstance(batch, list):
        return [to_device(v, device, non_blocking=non_blocking) for v in batch]
    if isinstance(batch, tuple):
        moved = (to_device(v, device, non_blocking=non_blocking) for v in batch)
        return type(batch)(*moved) if hasattr(batch, "_fields") else tuple(moved)
    return batch  # str, bytes, numbers, pyarrow.RecordBatch: host values


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

def check_convertible(where: str, schema: pa.Schema, columns: list[str], *, output: str,
                      nulls: str, decimals: str) -> None:
    """Refuse at construction what the chosen output cannot hold (decimals in torch unless
    ``decimals="float64"``), and a mask column name that is already a column.

    Raises:
        ValueError: an unknown option value.
        UnsupportedTableError: names the table, version, column and type.
    """
    from lakeckpt_tables.sources.nulls import MASK_SUFFIX, needs_policy

    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    if decimals not in DECIMAL_POLICIES:
        raise ValueError(f"decimals must be one of {DECIMAL_POLICIES}, got {decimals!r}")
    if output == "arrow":
        return
    for name in columns:
        kind = schema.field(name).type
        if pa.types.is_decimal(kind) and decimals == "refuse":
            raise UnsupportedTableError(
                f"{where}: column {name!r} is {kind}; torch has no decimal. Pass "
                "decimals='float64' (float64 tensors, exact to 15 significant digits) or "
                "output='arrow' (exact values), or leave the column out.")
        if nulls == "mask" and needs_policy(kind) and name + MASK_SUFFIX in schema.names:
            raise UnsupportedTableError(
                f"{where}: nulls='mask' would add column {name + MASK_SUFFIX!r}, which the "
                "table already has; rename it or use nulls='fill'")


def convert(table: pa.Table, output: str = "torch", nulls: str = "refuse") -> Any:
    """One batch in the chosen output: a ``pyarrow.RecordBatch`` (every type, nulls kept) or
    the tensors of :func:`to_tensors` under the null policy (NOTE [ null policy ] in
    ``lakeckpt_tables.sources.nulls``)."""
    if output == "arrow":
        return pa.RecordBatch.from_arrays([c.combine_chunks() for c in table.columns],
                                          schema=table.schema)
    if nulls == "refuse":
        return to_tensors(table)
    return _with_policy(table, nulls == "mask")


class CutConverter:
    """:func:`convert` of batches cut from one table, that table's columns prepared once.

    NOTE [ per-batch cost ]
    On a narrow numeric table a batch's decode is a few microseconds, so what is done per
    batch decides the speed. Converting each batch as its own Arrow slice costs ~10 Arrow
    wrapper calls per column (``table.columns`` alone builds a ChunkedArray per column): measured
    54 us a 1024-row batch of ``id`` + ``x`` against 25 us for the raw loop that slices
    columns it took once per row group. Here a table's plain numeric columns without nulls
    become numpy arrays once, and a batch is one numpy slice and one ``torch.from_numpy`` per
    column (its own storage of exactly its rows, as before: a batch pickled to another
    process carries its rows, not its row group). Any other column, or output, is converted
    per batch by :func:`convert`, unchanged.
    """

    def __init__(self, output: str, nulls: str) -> None:
        self._output, self._nulls = output, nulls
        self._fast = output == "torch" and nulls == "refuse"
        self._table: Any = None  # the table (or gathered window) of the last batch
        self._arrays: list[tuple[str, np.ndarray[Any, Any]]] | None = None

    def __call__(self, table: Any, first: int, rows: int) -> Any:
        if not isinstance(table, pa.Table):  # a shuffled window, gathered batch by batch
            return self._gathered(table, first, rows)
        if self._fast and rows != table.num_rows:
            if table is not self._table:
                self._table, self._arrays = table, _plain_arrays(table)
            if self._arrays is not None:
                return self._cut(first, rows)
        piece = table if first == 0 and rows == table.num_rows else table.slice(first, rows)
        return convert(piece, self._output, self._nulls)

    def _cut(self, first: int, rows: int) -> Batch:
        """Rows ``[first, first + rows)`` of the plain numeric columns held, as tensor views."""
        end = first + rows
        out = Batch()
        for name, values in self._arrays or ():
            out[name] = torch.from_numpy(values[first:end])
        return out

    def _gathered(self, window: Any, first: int, rows: int) -> Any:
        """A batch of a ``reader.gather.Gathered`` window: a slice of each column when every
        column is plain numeric (gathered whole), else its rows gathered straight into
        tensors where the window can, else as a table, converted."""
        if self._fast:
            if window is not self._table:
                self._table, self._arrays = window, window.plain()
            if self._arrays is not None:
                return self._cut(first, rows)
            batch = window.tensors(first, rows)
            if batch is not None:
                return batch
        return convert(window.slice(first, rows), self._output, self._nulls)


def _plain_arrays(table: pa.Table) -> list[tuple[str, np.ndarray[Any, Any]]] | None:
    """Every column as a zero-copy numpy array, or None when one is not plain numeric
    without nulls."""
    out = []
    for name, column in zip(table.schema.names, table.columns, strict=True):
        if column.type.id not in PLAIN_NUMERIC or column.null_count:
            return None
        array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        out.append((name, array.to_numpy(zero_copy_only=True)))
    return out


def _with_policy(table: pa.Table, mask: bool) -> Batch:
    from lakeckpt_tables.sources.nulls import MASK_SUFFIX, needs_policy

    out = Batch()
    for name, column in zip(table.schema.names, table.columns, strict=True):
        kind = column.type
        if not needs_policy(kind):
            out[name] = _column(name, column)
            continue
        array = column.combine_chunks()
        if array.null_count:
            missing = array.is_null()
            array = array.fill_null(_zero(kind))
        else:
            missing = None
        out[name] = _column(name, pa.chunked_array([array]))
        if mask:
            flags = (np.zeros(len(array), dtype=bool) if missing is None
                     else missing.to_numpy(zero_copy_only=False))
            out[name + MASK_SUFFIX] = torch.from_numpy(flags)
    return out


def _zero(kind: pa.DataType) -> pa.Scalar:
    """The documented fill value: 0, False, the epoch (timestamps and dates)."""
    if pa.types.is_boolean(kind):
        return pa.scalar(False)
    if pa.types.is_date(kind):
        return pa.scalar(0, pa.int32()).cast(pa.date32()).cast(kind)
    if pa.types.is_decimal(kind):
        return pa.scalar(decimal.Decimal(0), kind)
    return pa.scalar(0, pa.int64()).cast(kind)


def to_tensors(table: pa.Table) -> Batch:
    """One batch as a dict: tensors, 2-D tensors for fixed-length lists, :class:`Ragged` for
    variable-length lists, lists of ``str``/``bytes`` for strings and binaries."""
    # schema.names, not column_names: the latter costs ~2 us per call, a fifth of a batch's
    # conversion on the hot path. A loop of assignments costs what a dict comprehension does.
    out = Batch()
    for name, column in zip(table.schema.names, table.columns, strict=True):
        out[name] = _column(name, column)
    return out


def _column(name: str, column: pa.ChunkedArray) -> Any:
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    kind = array.type
    if kind.id in PLAIN_NUMERIC and not array.null_count:
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
    elif pa.types.is_decimal(kind):  # decimals="float64" (refused up front otherwise)
        array = pc.cast(array, pa.float64())
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
    """NOTE [ list columns ]: a list column straight from its Arrow buffers, no per-row Python
    and no compute kernel: the offsets (rebased when the batch is a slice) and the values
    between the first and last offset. Equal lengths (checked on the offsets alone, a cheap
    total first) give a 2-D tensor, anything else :class:`Ragged`."""
    if pa.types.is_fixed_size_list(array.type):
        values = _numpy(name, array.flatten())
        return torch.from_numpy(values.reshape(len(array), array.type.list_size))
    if array.null_count:
        raise UnsupportedTableError(f"list column {name!r} holds null lists; fill them first")
    raw = np.frombuffer(array.buffers()[1], dtype=_OFFSET_TYPES[array.type.id],
                        count=len(array) + 1, offset=array.offset * _offset_width(array.type))
    first, last = int(raw[0]), int(raw[-1])
    flat = array.values.slice(first, last - first)
    values = (flat.to_numpy(zero_copy_only=True)
              if flat.type.id in PLAIN_NUMERIC and not flat.null_count else _numpy(name, flat))
    n = len(array)
    width = int(raw[1]) - first if n else 0
    if n and width * n == last - first and (np.diff(raw) == width).all():
        return torch.from_numpy(values.reshape(n, width))
    offsets = raw.astype(np.int64)  # a copy: the rebased offsets are the batch's own
    if first:
        offsets -= first
    return Ragged(torch.from_numpy(values), torch.from_numpy(offsets))


_OFFSET_TYPES = {pa.list_(pa.int8()).id: np.int32, pa.large_list(pa.int8()).id: np.int64}


def _offset_width(kind: pa.DataType) -> int:
    return 8 if pa.types.is_large_list(kind) else 4
