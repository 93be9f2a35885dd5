"""A data file as table metadata lists it: what its reader needs besides its bytes.

Its own module so that commits (which list appended files) and the reading seam in ``base``
share it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lakeckpt_tables.sources._deletes import Deletes

__all__ = ["DataFile"]


@dataclass(frozen=True, slots=True)
class DataFile:
    """A data file as table metadata lists it, with what its reader needs besides its bytes.

    Attributes:
        path: local path or URI.
        size_bytes: size the table metadata records (checked before rows are delivered).
        rows: row count the table metadata records; None when it carries none.
        deletes: rows of the file deleted at the pinned version (a Delta deletion vector,
            Iceberg positional deletes), computed in the main process.
        partition: (logical column, typed value) pairs stored in the metadata, not the file.
        row_group_rows: rows per row group as the footer said when pinned (set by
            :func:`units_from_files`; checked again before the rows are delivered).
        null_counts: (logical column, nulls in the whole file) from the table metadata's
            statistics, when it has them: the null policy then needs no footer read.
    """

    path: str
    size_bytes: int | None
    rows: int | None  # None when the table metadata carries no row count
    deletes: Deletes | None = None
    partition: tuple[tuple[str, Any], ...] = ()
    row_group_rows: tuple[int, ...] | None = None
    null_counts: tuple[tuple[str, int], ...] | None = None
