"""Whole-file units: a snapshot pinned from table metadata alone, footers read by the reader.

NOTE [ lazy footers ]
Pinned with ``units="files"`` (``DeltaSource(uri, units="files")``, ``IcebergSource(name,
units="files")``), a data file whose metadata records its row count (Delta ``add.stats.
numRecords``, Iceberg ``record_count``) becomes one unit: ``Unit(path, WHOLE_FILE, live)``,
``live`` its rows minus those its deletes name (Delta deletion vectors, Iceberg positional
deletes, resolved from metadata when pinned as before). No footer is read to pin it. A file
whose metadata lacks a row count is pinned as before: its footer is read and its row groups
are its units. Which of the two a file gets is a fact of the metadata, so every rank lists the
same units.

The plan does not know row groups at all: it cuts a unit's live rows into parts of at most
``unit_rows`` rows (``plan/rounds.py``, NOTE [ bounded units ]), a pure function of the
metadata's row counts, so every rank agrees on every part without reading a footer. Row-group
boundaries are derived only where rows are read: the rank (or DataLoader worker) that reads a
part of a file opens its footer (once per process: ``sources/footers.py``), checks its size and
row count against the metadata (``SourceFileChangedError``, ``RowCountMismatchError``, named as
at pin time before), and maps the part's live rows ``[first, end)`` to the row groups that hold
them (:func:`row_group_parts`: physical positions from the footer's row-group sizes, minus the
deleted rows of each). A data file is immutable and checked, so every process maps a part to the
same rows. Decoded row groups are cached per real row group (``reader/_cache.py``): a part never
decodes a whole file, and the parts of one row group decode it once.

Consumption records of a whole-file unit name row group ``WHOLE_FILE`` (-1) and a range of
the file's live rows; the audit replays them with the source pinned as the state says.
Follow segments (files appended after the pin) keep row-group units: their footers are read
when the segment is listed, as before. A packing reader (token counts per row group) refuses
whole-file units by name.

Compatibility: a reader state records ``"units": "files"`` in its configuration when its
snapshot was pinned so; states without the key (every state written before whole-file units
existed) mean row-group units, the default, and resume exactly as before. A reader resumes a
state only with a source pinned the same way: a mismatch is refused naming the key
(``StateMismatchError``), never read differently.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lakeckpt_tables.errors import RowCountMismatchError
from lakeckpt_tables.sources.datafile import DataFile
from lakeckpt_tables.types import TableIdentity, Unit

__all__ = ["UNIT_KINDS", "WHOLE_FILE", "checked_units", "file_unit", "row_group_parts"]

WHOLE_FILE = -1
"""The ``row_group`` of a unit that is a whole data file's live rows (NOTE [ lazy footers ])."""

UNIT_KINDS = ("row_groups", "files")
"""What a source pins as units: every row group (footers read when pinned), or whole files
where the metadata gives their row counts (NOTE [ lazy footers ])."""


def checked_units(units: str, where: str) -> str:
    """``units`` if it names a kind of unit; ``where`` names the caller in the error."""
    if units not in UNIT_KINDS:
        raise ValueError(f"{where}: units must be one of {UNIT_KINDS}, got {units!r}")
    return units


def file_unit(identity: TableIdentity, version: int, data_file: DataFile) -> Unit | None:
    """``data_file`` as one unit of its live rows (metadata only); None when it has none.

    Raises:
        RowCountMismatchError: its deletes name rows past its recorded row count.
    """
    rows = data_file.rows
    assert rows is not None
    deletes = data_file.deletes
    if deletes is not None and deletes.beyond(rows):
        raise RowCountMismatchError(
            f"{identity.describe()} at version {version}: the deletes of data file "
            f"{data_file.path} name rows past its {rows} rows. The table is corrupt.")
    live = rows - (len(deletes) if deletes is not None else 0)
    return Unit(data_file.path, WHOLE_FILE, live, data_file) if live else None


def row_group_parts(unit: Unit, first: int, end: int,
                    row_group_rows: tuple[int, ...]) -> list[tuple[Unit, int, int]]:
    """Live rows ``[first, end)`` of whole-file ``unit`` as (row group unit, first, end)
    ranges of its row groups, given the footer's ``row_group_rows`` (NOTE [ lazy footers ])."""
    live = live_per_row_group(unit.file, row_group_rows)
    ends = np.cumsum(live)
    out: list[tuple[Unit, int, int]] = []
    i = int(np.searchsorted(ends, first, side="right"))
    while first < end:
        if not live[i]:  # every row of it deleted
            i += 1
            continue
        start = int(ends[i]) - int(live[i])
        stop = min(end, int(ends[i]))
        out.append((Unit(unit.path, i, int(live[i]), unit.file), first - start, stop - start))
        first = stop
        i += 1
    return out


def live_per_row_group(data_file: Any, row_group_rows: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """Rows per row group left by the file's deletes."""
    sizes = np.asarray(row_group_rows, dtype=np.int64)
    deletes = data_file.deletes if isinstance(data_file, DataFile) else None
    if deletes is None:
        return sizes
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    live: np.ndarray[Any, Any] = sizes - deletes.count_per_range(bounds)
    return live
