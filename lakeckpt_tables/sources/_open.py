"""Opening a data file for reading its rows: Spark's INT96 timestamps read as microseconds.

NOTE [ one timestamp unit ]
Spark writes timestamps as Parquet INT96, which pyarrow reads as nanoseconds by default:
dates past 2262 overflow and the unit differs from every other timestamp. Data files are opened
with ``coerce_int96_timestamp_unit="us"`` so every timestamp the readers return is
microseconds (readers cast the rest; see ``sources.types``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.parquet as pq

from lakeckpt_tables.io import Storage
from lakeckpt_tables.sources.footers import open_parquet

__all__ = ["OpenFile", "open_data_file"]


@dataclass(frozen=True)
class OpenFile:
    """An open Parquet data file and what is checked against the pinned snapshot."""

    file: pq.ParquetFile
    size: int
    row_group_rows: tuple[int, ...]


def open_data_file(path: str, storage: Storage | None = None) -> OpenFile:
    """Open ``path`` (local path or URI) through the table's ``storage`` (the environment's
    store when None); on object stores the footer cached by planning is reused.

    Raises:
        FileNotFoundError: no such file.
        StorageError: the store failed.
        OSError, pyarrow.ArrowException: the file cannot be opened or is not Parquet.
    """
    file = open_parquet(path, storage)
    meta = file.metadata
    rows = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
    return OpenFile(file, file.size_bytes, rows)
