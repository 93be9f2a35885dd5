"""The raw read every benchmark measures the library against: plain pyarrow, no library.

Read a row group, cut batches in place, hand each column to torch zero-copy (a list column as
its flat values and offsets, ``<name>_values`` / ``<name>_offsets``). No DataLoader, no plan,
no state: the most a reader of the same row groups can deliver in this process.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

__all__ = ["Batch", "Units", "raw_batches", "table_batches", "units_of"]

Batch = dict[str, torch.Tensor]
Units = Sequence[tuple[str, int]]
"""(data file, row group) pairs, in reading order."""


def units_of(files: Sequence[str]) -> list[tuple[str, int]]:
    """Every row group of ``files``, in order."""
    return [(f, i) for f in files for i in range(pq.ParquetFile(f).metadata.num_row_groups)]


def raw_batches(units: Units, columns: Sequence[str], batch_size: int, *, skip: int = 0,
                handles: dict[str, pq.ParquetFile] | None = None) -> Iterator[Batch]:
    """Batches of ``columns`` of ``units``: the raw limit.

    Args:
        units: the row groups to read.
        columns: columns read; the first one counts the rows.
        batch_size: rows per batch (the last of each row group may be shorter).
        skip: rows read and dropped first: a naive skip-ahead resume.
        handles: open files to reuse across passes (keeps footer reads off the clock).
    """
    handles = {} if handles is None else handles
    for path, row_group in units:
        handle = handles.get(path) or handles.setdefault(path, pq.ParquetFile(path))
        table = handle.read_row_group(row_group, columns=list(columns))
        start = min(skip, table.num_rows)
        skip -= start
        yield from table_batches(table, columns, batch_size, start=start)


def table_batches(table: pa.Table, columns: Sequence[str], batch_size: int, *,
                  start: int = 0) -> Iterator[Batch]:
    """``table`` from row ``start`` cut into batches of ``batch_size`` rows, zero-copy."""
    arrays = [_one_array(table.column(c)) for c in columns]
    for lo in range(start, table.num_rows, batch_size):
        length = min(batch_size, table.num_rows - lo)
        batch: Batch = {}
        for name, array in zip(columns, arrays, strict=True):
            _put(batch, name, array.slice(lo, length))
        yield batch


def _one_array(column: pa.ChunkedArray) -> pa.Array:
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _put(batch: Batch, name: str, array: pa.Array) -> None:
    if isinstance(array, pa.ListArray | pa.LargeListArray):
        offsets = array.offsets.to_numpy()
        values = array.values.to_numpy(zero_copy_only=False)[offsets[0]:offsets[-1]]
        batch[f"{name}_values"] = torch.from_numpy(values)
        batch[f"{name}_offsets"] = torch.from_numpy((offsets - offsets[0]).astype(np.int64))
    else:
        batch[name] = torch.from_numpy(array.to_numpy(zero_copy_only=True))
