"""Opening a data file for reading its rows: Spark's INT96 timestamps read as microseconds.

NOTE [ one timestamp unit ]
Spark writes timestamps as Parquet INT96, which pyarrow reads as nanoseconds by default:
dates past 2262 overflow and the unit differs from every other timestamp. Data files are opened
with ``coerce_int96_timestamp_unit="us"`` so every timestamp the readers return is
microseconds (readers cast the rest; see ``sources.types``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.fs as pafs
import pyarrow.parquet as pq

__all__ = ["OpenFile", "open_data_file"]


@dataclass(frozen=True)
class OpenFile:
    """An open Parquet data file and what is checked against the pinned snapshot."""

    file: pq.ParquetFile
    size: int
    row_group_rows: tuple[int, ...]


def open_data_file(path: str) -> OpenFile:
    """Open ``path`` (local path or URI pyarrow understands).

    Raises:
        FileNotFoundError: no such file.
        OSError, pyarrow.ArrowException: the file cannot be opened or is not Parquet.
    """
    if "://" in path:
        fs, inner = pafs.FileSystem.from_uri(path)
    else:
        fs, inner = pafs.LocalFileSystem(), path
    stream = fs.open_input_file(inner)
    size = stream.size()
    file = pq.ParquetFile(stream, coerce_int96_timestamp_unit="us")
    meta = file.metadata
    rows = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
    return OpenFile(file, size, rows)
