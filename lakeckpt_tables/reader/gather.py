"""A shuffled window's rows, gathered in emission order batch by batch (NOTE [ gathering a
shuffled window ]).

NOTE [ gathering a shuffled window ]
A window of the token table is ~75 MB of ``list<int32>`` values in ~9 row groups, and its
permutation sends every row somewhere else. Gathering it whole (one Arrow ``take`` of the
window's row group slices) cost the token table 0.35-0.5x of its unshuffled speed. Where it went
(``perf``, 4M rows): page faults first: the slices concatenated (75 MB) and the gathered window
(75 MB) are fresh memory each window, which the kernel zeroes, huge page by huge page (the
allocator returns memory idle for more than a few milliseconds, and a window lives for hundreds);
then Arrow's ``take`` of a list column, which gathers the values one by one (~330 ns a row, or
~730 over chunked columns, against ~280 ns to decode the row).

So a window is gathered when its batches are cut, one batch at a time, from the row groups as
they were decoded: a batch's rows are fresh memory the size of a batch, which the allocator
hands out again as the batches before it are dropped (no page faults), and nothing is
concatenated.
- a list column of fixed-width values without nulls is described once per window as Arrow
  ``binary_view`` views (16 bytes a row: length, first bytes, which row group buffer, where)
  over the row groups' own value buffers; a batch takes its rows' views (numpy) and Arrow's
  cast to ``large_binary`` copies each row's values at once; the bytes are read back as the
  same list type: exactly the rows and values of a ``take``;
- a plain numeric column without nulls is gathered whole when the window is read (a few
  bytes a row: one ``np.take`` a window costs less than one a batch); a batch is a slice;
- any other column is one Arrow array per window, a batch one Arrow ``take``.

A batch of a list column is not gathered alone, though: its rows come with the next batches'
(of its size), up to :data:`BLOCK_ROWS` rows or :data:`BLOCK_BYTES` bytes, and the batches are
slices of that block (a window's batches are asked in order). The per-call work of a gather
(the view ``take``, Arrow's cast, the offsets, the table) is then paid once a block, and the
block is still fresh memory small enough to be handed out again (measured on the token table,
CPU time, paired: a 1024-row batch gathered and converted in 133 ns a row alone, 85 ns in
16,384-row blocks).

NOTE [ fused batches ]
Output ``"torch"`` takes a block's rows once more out of Arrow: the list column's gathered
values and offsets (int64, from 0) as numpy arrays, and each batch is cut from them as
``convert`` would cut it from its table (a 2-D tensor when its rows are of one length, else
:class:`~lakeckpt_tables.reader.convert.Ragged` with offsets of its own), with no Arrow array,
table or slice per block or batch between. Measured on the token table, CPU time, paired in
one process: gathering and converting a window 0.87x of through a table; a whole shuffled pass
under ``StatefulDataLoader``, 0.95x of its user CPU time. The gather itself is at the floor of
a vectorized one: ``np.take`` of rows of the same mean width, in the same order and blocks,
costs as much (~110 ns a row under load, against ~360 to decode it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

import lakeckpt_tables.reader.spare as spare
from lakeckpt_tables.reader.convert import PLAIN_NUMERIC, Batch, Ragged

__all__ = ["Gathered"]

Run = tuple[pa.Table, int, int]
"""Rows ``[first, end)`` of a decoded row group (or of any table)."""

_INLINE = 12
"""Most bytes a ``binary_view`` view holds itself (Arrow columnar format)."""

BLOCK_ROWS = 16_384
"""Rows of a window gathered at once (NOTE [ gathering a shuffled window ])."""

BLOCK_BYTES = 4 << 20
"""Bytes of a window gathered at once, at most (unless one batch holds more)."""


class Gathered:
    """Rows ``order`` of the runs laid end to end, in that order: a shuffled window, gathered
    batch by batch (:meth:`slice`); holds the runs' tables, never a copy of them."""

    def __init__(self, runs: Sequence[Run], order: np.ndarray[Any, Any], *,
                 spares: Sequence[np.ndarray[Any, Any]] = ()) -> None:
        self._spares = list(spares)  # given back when the window is dropped (``order``'s)
        tables = {id(table): table for table, _, _ in runs}  # a window's ~120 runs share ~10
        schema = runs[0][0].schema
        slices: list[pa.Table] | None = None  # the runs as tables, made only when needed
        if any(t.schema != schema for t in tables.values()):  # evolved: types promoted
            slices = [pa.concat_tables([table.slice(first, end - first)
                                        for table, first, end in runs],
                                       promote_options="permissive")]
            schema = slices[0].schema
        self.schema: pa.Schema = schema
        self.num_rows = len(order)
        self.order = order
        self._columns: list[_Plain | _Arrow | _Lists] = []
        for i in range(len(schema)):
            column = (None if slices is not None
                      else _plain(runs, tables, i, order, self._spares))
            if column is None:
                if slices is None:
                    slices = [table.slice(first, end - first) for table, first, end in runs]
                column = _source(schema.field(i).type,
                                 [chunk for t in slices for chunk in t.column(i).chunks], order)
            self._columns.append(column)
        per_row = {key: int(t.nbytes) / max(t.num_rows, 1) for key, t in tables.items()}
        self.nbytes = int(sum(per_row[id(table)] * (end - first) for table, first, end in runs))
        row_bytes = self.nbytes // max(self.num_rows, 1)
        self._block_rows = max(min(BLOCK_ROWS, BLOCK_BYTES // max(row_bytes, 1)), 1)
        if all(isinstance(column, _Plain) for column in self._columns):
            self._block_rows = 1  # gathered whole already: a batch is a slice of each column
        self._block: tuple[int, pa.Table] | None = None  # (first row, rows gathered last)
        self._fusable = all(isinstance(c, _Plain) or (isinstance(c, _Lists) and c.dtype
                                                      is not None) for c in self._columns)
        self._fused: tuple[int, int, list[Any]] | None = None  # (first, end, column arrays)

    def slice(self, first: int, rows: int) -> pa.Table:
        """Rows ``[first, first + rows)`` of the gathered order, as a table: a slice of the
        block of rows gathered with them (NOTE [ gathering a shuffled window ])."""
        block = self._block
        if block is None or not block[0] <= first <= first + rows <= block[0] + len(block[1]):
            end = self._block_end(first, rows)
            at = self.order[first:end]
            block = self._block = (first, pa.Table.from_arrays(
                [column.cut(first, at) for column in self._columns], schema=self.schema))
        start, table = block
        return table if first == start and rows == len(table) else table.slice(first - start,
                                                                                rows)

    def __del__(self) -> None:
        for array in self._spares:  # no one holds them (NOTE [ spare window arrays ])
            spare.give_back(array)

    def _block_end(self, first: int, rows: int) -> int:
        """The end of the block gathered from ``first``: whole batches of ``rows`` rows, so
        the next ones fall inside it, none across."""
        return min(first + max(self._block_rows // max(rows, 1), 1) * rows, self.num_rows)

    def tensors(self, first: int, rows: int) -> Batch | None:
        """Rows ``[first, first + rows)`` as the tensors ``convert`` makes of them (output
        ``"torch"``), or None unless every column is plain numeric or a list of plain
        numeric values without nulls. Cut from the block's numpy arrays, with no Arrow table
        or array between (NOTE [ fused batches ])."""
        if not self._fusable:
            return None
        fused = self._fused
        if fused is None or not fused[0] <= first <= first + rows <= fused[1]:
            end = self._block_end(first, rows)
            at = self.order[first:end]
            fused = self._fused = (first, end, [
                column.arrays(at) if isinstance(column, _Lists) else None
                for column in self._columns])
        i = first - fused[0]
        out = Batch()
        for name, column, arrays in zip(self.schema.names, self._columns, fused[2],
                                        strict=True):
            if arrays is None:
                out[name] = torch.from_numpy(column.values[first:first + rows])
                continue
            values, offsets = arrays
            own = offsets[i:i + rows + 1]
            a, b = int(own[0]), int(own[-1])
            width = int(own[1]) - a if rows else 0
            if rows and width * rows == b - a and (np.diff(own) == width).all():
                out[name] = torch.from_numpy(values[a:b].reshape(rows, width))
            else:
                out[name] = Ragged(torch.from_numpy(values[a:b]), torch.from_numpy(own - a))
        return out

    def plain(self) -> list[tuple[str, np.ndarray[Any, Any]]] | None:
        """Every column as a numpy array of the window's rows in emission order, or None
        when one is not plain numeric without nulls (a batch is then a slice of each)."""
        out = []
        for name, column in zip(self.schema.names, self._columns, strict=True):
            if not isinstance(column, _Plain):
                return None
            out.append((name, column.values))
        return out


class _Plain:
    """A plain numeric column gathered whole, in emission order: a few bytes a row, so one
    ``np.take`` per window costs less than one per batch."""

    def __init__(self, kind: pa.DataType, values: np.ndarray[Any, Any]) -> None:
        self.kind, self.values = kind, values

    def cut(self, first: int, at: np.ndarray[Any, Any]) -> pa.Array:
        rows = self.values[first:first + len(at)]
        return pa.Array.from_buffers(self.kind, len(rows), [None, pa.py_buffer(rows)])


class _Arrow:
    def __init__(self, array: pa.Array) -> None:
        self.array = array

    def cut(self, first: int, at: np.ndarray[Any, Any]) -> pa.Array:
        return self.array.take(at)


class _Lists:
    """A list column of fixed-width values as ``binary_view`` views over the runs' buffers."""

    def __init__(self, kind: pa.DataType, width: int, views: np.ndarray[Any, Any],
                 buffers: list[pa.Buffer]) -> None:
        self.kind, self.width, self.views, self.buffers = kind, width, views, buffers
        self.shift = width.bit_length() - 1  # widths are powers of two: / width is >> shift
        value = kind.value_type
        self.dtype = (np.dtype(value.to_pandas_dtype()) if value.id in PLAIN_NUMERIC
                      else None)  # the values as numpy (fused batches), or None

    def gather(self, at: np.ndarray[Any, Any]) -> tuple[pa.Buffer, int, np.ndarray[Any, Any]]:
        """Rows ``at``: their values end to end (buffer, first byte) and their offsets
        (int64, from 0): Arrow's cast of the rows' views copies each row's values at once."""
        picked = np.take(self.views, at, axis=0)
        rows = len(picked)
        as_views = pa.Array.from_buffers(pa.binary_view(), rows,
                                         [None, pa.py_buffer(picked), *self.buffers])
        taken = as_views.cast(pa.large_binary())
        got = np.frombuffer(taken.buffers()[1], dtype=np.int64, count=rows + 1,
                            offset=taken.offset * 8)
        first = int(got[0])
        offsets = got - first
        offsets >>= self.shift
        return taken.buffers()[2], first, offsets

    def cut(self, first: int, at: np.ndarray[Any, Any]) -> pa.Array:
        data, start, got = self.gather(at)
        large = pa.types.is_large_list(self.kind)
        offsets = got if large else got.astype(np.int32)
        values = pa.Array.from_buffers(self.kind.value_type, int(got[-1]), [None, data],
                                       offset=start // self.width)
        return pa.Array.from_buffers(self.kind, len(at), [None, pa.py_buffer(offsets)],
                                     children=[values])

    def arrays(self, at: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any],
                                                        np.ndarray[Any, Any]]:
        """Rows ``at`` as numpy: values end to end and int64 offsets from 0."""
        data, start, offsets = self.gather(at)
        if data is None:  # no values at all
            return np.empty(0, dtype=self.dtype), offsets
        values = np.frombuffer(data, dtype=self.dtype, count=int(offsets[-1]), offset=start)
        return values, offsets


def _plain(runs: Sequence[Run], tables: dict[int, pa.Table], i: int,
           order: np.ndarray[Any, Any], spares: list[np.ndarray[Any, Any]]) -> _Plain | None:
    """Column ``i`` gathered whole when it is plain numeric without nulls in every row group
    (else None): each row group's column made a numpy array once, its runs numpy slices of it
    (a window's ~120 runs, one Python call each instead of four Arrow ones)."""
    kind = next(iter(tables.values())).schema.field(i).type
    if kind.id not in PLAIN_NUMERIC:
        return None
    arrays = {}
    for key, table in tables.items():
        column = table.column(i)
        if column.null_count or column.num_chunks != 1:
            return None
        arrays[key] = column.chunk(0).to_numpy(zero_copy_only=True)
    parts = [arrays[id(table)][first:end] for table, first, end in runs]
    if len(parts) == 1:
        return _Plain(kind, np.take(parts[0], order))
    nbytes = sum(len(p) for p in parts) * parts[0].dtype.itemsize
    buffer = spare.take(nbytes)
    spares.append(buffer)
    values = np.concatenate(parts, out=buffer[:nbytes].view(parts[0].dtype))
    return _Plain(kind, np.take(values, order))


def _source(kind: pa.DataType, chunks: list[pa.Array],
            order: np.ndarray[Any, Any]) -> _Plain | _Arrow | _Lists:
    """How a column of the window is gathered (NOTE [ gathering a shuffled window ])."""
    if not chunks:
        chunks = [pa.array([], kind)]
    if kind.id in PLAIN_NUMERIC and not any(c.null_count for c in chunks):
        values = (np.concatenate([c.to_numpy(zero_copy_only=True) for c in chunks])
                  if len(chunks) > 1 else chunks[0].to_numpy(zero_copy_only=True))
        return _Plain(kind, np.take(values, order))
    width = _value_width(kind)
    if width is not None and not any(c.null_count or c.values.null_count for c in chunks):
        lists = _views(kind, width, chunks)
        if lists is not None:
            return lists
    return _Arrow(pa.concat_arrays(chunks) if len(chunks) > 1 else chunks[0])


def _value_width(kind: pa.DataType) -> int | None:
    """Bytes per value of a list type gathered as bytes; None: gathered as it is."""
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
        return None
    child = kind.value_type
    if (not pa.types.is_primitive(child) or pa.types.is_boolean(child)
            or child.bit_width % 8):
        return None
    return int(child.bit_width // 8)


def _views(kind: pa.DataType, width: int, chunks: list[pa.Array]) -> _Lists | None:
    """The rows of ``chunks`` as ``binary_view`` views: length, first 4 bytes, buffer, offset
    (or length and up to 12 bytes inline); None if a buffer is past 2 GiB (a view's offset is
    32-bit). Written chunk by chunk into one array (a window is ~10 numpy calls a chunk)."""
    offset_type = np.int64 if pa.types.is_large_list(kind) else np.int32
    buffers: list[pa.Buffer] = []
    heads: list[np.ndarray[Any, Any]] = []  # per buffer: the 4 bytes at each byte offset
    where: dict[int, int] = {}  # buffer address -> its index among the views' buffers
    views = np.zeros((sum(len(c) for c in chunks), 4), dtype=np.int32)
    at = 0
    for chunk in chunks:
        n = len(chunk)
        if not n:
            continue
        values = chunk.values
        data = values.buffers()[1]
        if data is None or data.size >= 2**31:
            if data is not None:
                return None
            data = pa.py_buffer(b"")
        k = where.setdefault(data.address, len(buffers))
        if k == len(buffers):
            buffers.append(data)
            heads.append(_heads(data))
        offsets = np.frombuffer(chunk.buffers()[1], dtype=offset_type, count=n + 1,
                                offset=chunk.offset * np.dtype(offset_type).itemsize)
        byte_offsets = offsets.astype(np.int64)
        byte_offsets += values.offset
        byte_offsets *= width
        starts = byte_offsets[:-1]
        mine = views[at:at + n]
        mine[:, 0] = np.diff(byte_offsets)
        if len(heads[k]):  # indexing, not np.take: that would copy the strided view whole
            mine[:, 1] = heads[k][np.minimum(starts, len(heads[k]) - 1)]
        mine[:, 2] = k
        mine[:, 3] = starts
        at += n
    short = np.flatnonzero(views[:, 0] <= _INLINE)
    if len(short):  # rows of 12 bytes or less are held in their views
        _inline(views, short, buffers)
    return _Lists(kind, width, views, buffers)


def _heads(data: pa.Buffer) -> np.ndarray[Any, Any]:
    """The 4 bytes at every byte offset of ``data`` as int32 (overlapping, no copy)."""
    raw = np.frombuffer(data, dtype=np.uint8)
    if len(raw) < 4:
        return np.zeros(0, dtype=np.int32)
    return np.ndarray((len(raw) - 3,), dtype=np.int32, buffer=raw, strides=(1,))


def _inline(views: np.ndarray[Any, Any], short: np.ndarray[Any, Any],
            buffers: list[pa.Buffer]) -> None:
    """Rows ``short`` (12 bytes or less) with their bytes in their views, zero-padded."""
    raw = views.view(np.uint8)
    lengths, which, starts = views[short, 0], views[short, 2], views[short, 3].astype(np.int64)
    got = np.zeros((len(short), _INLINE), dtype=np.uint8)
    for k, data in enumerate(buffers):
        rows = np.flatnonzero((which == k) & (lengths > 0))
        if not len(rows):
            continue
        source = np.frombuffer(data, dtype=np.uint8)
        at = np.minimum(starts[rows, None] + np.arange(_INLINE), len(source) - 1)
        got[rows] = np.where(np.arange(_INLINE) < lengths[rows, None], source[at], 0)
    raw[short, 4:] = got
