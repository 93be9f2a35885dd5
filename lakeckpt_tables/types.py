"""Plain value types shared by sources, plan, reader and ledger (no torch, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["TableFormat", "TableIdentity", "Unit"]

TableFormat = Literal["delta", "iceberg"]


@dataclass(frozen=True, slots=True)
class TableIdentity:
    """Which table a snapshot, a reader state or a ledger record belongs to.

    Attributes:
        format: ``"delta"`` or ``"iceberg"``.
        location: table root URI as the table format reports it.
        table_id: Delta ``metaData.id`` or Iceberg ``table-uuid``: survives a move of the table.
    """

    format: TableFormat
    location: str
    table_id: str

    def to_json(self) -> dict[str, str]:
        return {"format": self.format, "location": self.location, "table_id": self.table_id}

    def describe(self) -> str:
        return f"{self.format} table {self.location} (id {self.table_id})"


@dataclass(frozen=True, slots=True, order=True)
class Unit:
    """One Parquet row group of one data file: the smallest piece of work read as a whole.

    Ordering is the canonical order (path, row group), which the plan permutes.

    Attributes:
        path: data file path or URI, as readable by pyarrow.
        row_group: row group index within the file.
        rows: number of live rows in the row group (footer rows minus deleted ones).
        file: the table metadata's entry for the data file (a ``sources.base.DataFile``):
            what the source's reader needs to turn the file's rows into the table's rows
            (deletes, partition values, column mapping). Not part of identity or order.
    """

    path: str
    row_group: int
    rows: int
    file: Any = field(default=None, compare=False, repr=False)
