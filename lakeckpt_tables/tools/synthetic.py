"""A metadata-only source: a snapshot of N files x R row groups that holds no data.

``lakeckpt bench scale`` plans, checkpoints and re-plans a table of a million files without
writing one: the planner sees only units (path, row group, rows), and this source lists them
lazily from two integers, so the listing costs 4 bytes a row group (its row counts), not a
``Unit`` object. Reading a row is refused by name: nothing here has bytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import pyarrow as pa

from lakeckpt_tables.sources.base import RowGroupReader, Snapshot
from lakeckpt_tables.types import TableIdentity, Unit

__all__ = ["SyntheticSnapshot", "SyntheticSource", "SyntheticUnits"]


class SyntheticUnits(Sequence[Unit]):
    """Row group ``r`` of file ``f`` is unit ``f * row_groups + r`` (paths sort in that order,
    the canonical one). Every row group holds ``group_rows`` rows but each file's last, which
    holds a seeded 1..group_rows: uneven sizes, so slices cut units mid-way.

    Attributes:
        rows: rows of each unit (``int32``), what the planner reads without listing units.
    """

    def __init__(self, files: int, row_groups: int, group_rows: int, prefix: str) -> None:
        self.files, self.row_groups, self.prefix = files, row_groups, prefix
        self.rows = np.full(files * row_groups, group_rows, dtype=np.int32)
        last = np.arange(files, dtype=np.int64)
        self.rows[last * row_groups + row_groups - 1] = (
            1 + (last * 2654435761) % group_rows).astype(np.int32)

    def path(self, file: int) -> str:
        return f"{self.prefix}/part-{file:07d}.parquet"

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, i: int) -> Unit: ...
    @overload
    def __getitem__(self, i: slice) -> list[Unit]: ...

    def __getitem__(self, i: int | slice) -> Unit | list[Unit]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"unit {i} of {len(self)}")
        file, group = divmod(i, self.row_groups)
        return Unit(self.path(file), group, int(self.rows[i]))

    def __iter__(self) -> Iterator[Unit]:
        return (self[i] for i in range(len(self)))


class _NoData(RowGroupReader):
    def read(self, unit: Unit, columns: Sequence[str]) -> pa.Table:
        raise NotImplementedError(f"{unit.path} is synthetic (lakeckpt_tables.tools.synthetic):"
                                  " it has metadata only, no rows to read")


@dataclasses.dataclass(frozen=True, slots=True)
class SyntheticSnapshot(Snapshot):
    """A :class:`Snapshot` whose ``units`` is a :class:`SyntheticUnits`."""

    @property
    def rows(self) -> int:
        units = self.units
        return int(units.rows.sum()) if isinstance(units, SyntheticUnits) else 0


class SyntheticSource:
    """A table of ``files`` x ``row_groups`` row groups of ``group_rows`` rows (one float
    column ``x``), pinned at version 0, with no commits after it."""

    def __init__(self, files: int, row_groups: int, group_rows: int = 4096) -> None:
        identity = TableIdentity("delta", f"synthetic://{files}x{row_groups}x{group_rows}",
                                 f"synthetic-{files}-{row_groups}-{group_rows}")
        units: Any = SyntheticUnits(files, row_groups, group_rows, identity.location)
        self._snapshot = SyntheticSnapshot(
            identity=identity, version=0, schema=pa.schema([("x", pa.float64())]),
            units=units, file_columns={}, column_types={"x": "double"},
            reader=_NoData(identity, 0))

    def snapshot(self, version: int | None = None, *,
                 schema_id: int | None = None) -> Snapshot:
        if version not in (None, 0):
            raise ValueError(f"the synthetic table has version 0 only, not {version}")
        return self._snapshot

    def commit_after(self, version: int, snapshot: Snapshot, columns: Sequence[str]) -> None:
        return None

    def is_after(self, version: int, until: int) -> bool:
        return version > until
