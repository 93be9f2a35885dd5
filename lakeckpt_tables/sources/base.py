"""What every source resolves to: a pinned, immutable snapshot listed as units."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa

from lakeckpt_tables.errors import (
    DataFileError,
    DataFileStoreError,
    PinnedFileMissingError,
    RowCountMismatchError,
    SourceFileChangedError,
    StorageError,
)
from lakeckpt_tables.io import Storage
from lakeckpt_tables.sources._deletes import select_live
from lakeckpt_tables.sources._open import open_data_file
from lakeckpt_tables.sources.commits import Commit
from lakeckpt_tables.sources.datafile import DataFile
from lakeckpt_tables.sources.footers import FileFooter, read_footers
from lakeckpt_tables.sources.lazy import WHOLE_FILE, file_unit, row_group_parts
from lakeckpt_tables.types import TableIdentity, Unit

__all__ = [
    "DataFile",
    "RowGroupReader",
    "Snapshot",
    "Source",
    "local_path_or_uri",
    "units_from_files",
]


def local_path_or_uri(uri: str) -> str:
    """Local files as plain paths (what pyarrow opens fastest), others left as URIs."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return unquote(parsed.path).rstrip("/") or "/"
    return uri.rstrip("/")


class RowGroupReader:
    """Turns one unit's row group into the table's rows: the one place that reads data bytes.

    NOTE [ reading seam ]
    The plan decides which rows of which unit, in which order; it knows units only by their
    live row counts. A reader, built by the source with the snapshot (picklable: it crosses
    into DataLoader workers, where it opens files lazily), reads a unit's row group and
    returns exactly its live rows, in row order, as the table's logical columns: deleted rows
    removed, partition values added, physical names mapped to logical ones, types normalised.
    Row positions the plan hands out are positions among these live rows.

    Before the first row of a file is delivered its size and its row groups' row counts are
    checked against what was pinned: a file rewritten in place is refused, never read.

    This base class reads plain Parquet files whose columns are the table's columns;
    subclasses map physical columns to logical ones in :meth:`_logical`.
    """

    def __init__(self, identity: TableIdentity, version: int,
                 storage: Storage | None = None) -> None:
        self.identity = identity
        self.version = version
        self.storage = storage  # the table's store (its storage options); ambient when None
        self._handles: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"] = {}  # open file handles stay in their process
        return state

    def describe(self) -> str:
        return f"{self.identity.describe()} at version {self.version}"

    def read(self, unit: Unit, columns: Sequence[str]) -> pa.Table:
        """The live rows of ``unit``, columns ``columns`` in that order.

        Raises:
            PinnedFileMissingError: the unit's data file is gone.
            SourceFileChangedError: the file's size or row groups differ from the pinned ones.
            RowCountMismatchError: the row group holds another number of live rows.
            DataFileError: the file cannot be read or converted (names file and column).
        """
        if unit.row_group == WHOLE_FILE:  # every row group (NOTE [ lazy footers ])
            tables = [self.read(part, columns) for part, _, _ in self.parts(unit, 0, unit.rows)]
            return pa.concat_tables(tables)  # a unit has rows: one table at least
        data_file = unit.file if isinstance(unit.file, DataFile) else None
        handle = self._handle(unit.path, data_file)
        try:
            table = self._logical(handle, unit, data_file, list(columns))
        except StorageError as exc:  # the store failed: named with table, version and file
            raise DataFileStoreError.wrap(self.describe(), unit.path, exc) from exc
        except (pa.ArrowException, OSError, ValueError, TypeError, KeyError) as exc:
            raise DataFileError(
                f"{self.describe()}: cannot read row group {unit.row_group} of data file "
                f"{unit.path} (columns {list(columns)}): {type(exc).__name__}: {exc}"
            ) from exc
        if data_file is not None and data_file.deletes is not None:
            keep = self._keep(unit, data_file, handle)
            if keep is not None:  # None: the vector deletes no row of this row group
                table = select_live(table, keep)
        if table.num_rows != unit.rows:
            raise RowCountMismatchError(
                f"{self.describe()}: row group {unit.row_group} of {unit.path} holds "
                f"{table.num_rows} live rows, {unit.rows} when the snapshot was pinned; "
                "the file was rewritten in place")
        return table

    def parts(self, unit: Unit, first: int, end: int,
              keep: bool = True) -> list[tuple[Unit, int, int]]:
        """Live rows ``[first, end)`` of ``unit`` as (row group unit, first, end) ranges: the
        unit itself when it is a row group; a whole file's row groups that hold them, from its
        footer read here, once per process (NOTE [ lazy footers ]).

        Raises:
            PinnedFileMissingError, SourceFileChangedError, DataFileError: as :meth:`read`.
            RowCountMismatchError: the footer's row count is not the metadata's.
        """
        if unit.row_group != WHOLE_FILE:
            return [(unit, first, end)]
        data_file = unit.file if isinstance(unit.file, DataFile) else None
        handle = self._handle(unit.path, data_file, keep)
        return row_group_parts(unit, first, end, handle.row_group_rows)

    def _handle(self, path: str, data_file: DataFile | None, keep: bool = True) -> Any:
        handle = self._handles.get(path)
        if handle is not None:
            return handle
        try:
            handle = open_data_file(path, self.storage)
        except FileNotFoundError as exc:
            raise PinnedFileMissingError(
                f"{self.describe()}: data file {path} of the pinned version is gone "
                "(vacuumed or expired?); restore it, or start a new run on a newer version"
            ) from exc
        except StorageError as exc:  # the store failed: named with table, version and file
            raise DataFileStoreError.wrap(self.describe(), path, exc) from exc
        except (OSError, pa.ArrowException) as exc:
            raise DataFileError(
                f"{self.describe()}: cannot open data file {path}: {type(exc).__name__}: "
                f"{exc}. Check the file and its permissions; restore it from a backup."
            ) from exc
        if data_file is not None:
            _check_pinned(self.describe(), data_file, handle)
        if keep:
            self._handles[path] = handle
        return handle

    def _logical(self, handle: Any, unit: Unit, data_file: DataFile | None,
                 columns: list[str]) -> pa.Table:
        """The row group's rows (deleted ones included) as logical ``columns``."""
        table: pa.Table = handle.file.read_row_group(unit.row_group, columns=columns)
        return table.select(columns)

    def null_counts(self, units: Sequence[Unit], columns: Sequence[str]) -> dict[str, int]:
        """Nulls of ``columns`` in the row groups of ``units`` (one data file), from footer
        statistics where the file has them (deleted rows included), by reading otherwise.

        Raises:
            PinnedFileMissingError, SourceFileChangedError, DataFileError: as :meth:`read`.
        """
        if not units:
            return {}
        data_file = units[0].file if isinstance(units[0].file, DataFile) else None
        counts: dict[str, int] | None = known_null_counts(units, columns)
        if counts is not None:  # metadata statistics: no footer read
            return counts
        if units[0].row_group == WHOLE_FILE:  # its row groups, from its footer
            units = [part for part, _, _ in self.parts(units[0], 0, units[0].rows, keep=False)]
        counts = {}
        handle = self._handle(units[0].path, data_file, keep=False)  # reads check again
        meta = handle.file.metadata
        for column in columns:
            source = self._null_source(handle, data_file, column)
            total = 0
            for unit in units:
                rows = handle.row_group_rows[unit.row_group]
                if isinstance(source, int):
                    total += rows if source else 0
                    continue
                stat = _leaf_null_count(meta.row_group(unit.row_group), source)
                if stat is None:
                    table = self._logical(handle, unit, data_file, [column])
                    stat = table.column(column).null_count
                total += stat
            counts[column] = total
        return counts

    def _null_source(self, handle: Any, data_file: DataFile | None, column: str) -> str | int:
        """Where ``column``'s nulls show in a file: the Parquet leaf path holding it, or 1 when
        every row is null (the file lacks the column), 0 when none is."""
        return column if column in handle.file.schema_arrow.names else 1

    def _keep(self, unit: Unit, data_file: DataFile,
              handle: Any) -> np.ndarray[Any, Any] | None:
        """Keep mask of the unit's row group; None when no row of it is deleted (the copy of
        every column is then skipped: deletes often cluster in a few files' row groups)."""
        sizes = data_file.row_group_rows or handle.row_group_rows
        start = int(sum(sizes[: unit.row_group]))
        deletes = data_file.deletes
        assert deletes is not None
        rows = sizes[unit.row_group]
        if not deletes.count_per_range([start, start + rows])[0]:
            return None
        return deletes.keep(start, rows)


def known_null_counts(units: Sequence[Unit], columns: Sequence[str]) -> dict[str, int] | None:
    """Nulls of ``columns`` in a whole file (``units``: all its row groups) from the table
    metadata's statistics; None when they do not say (the footer must)."""
    data_file = units[0].file if units and isinstance(units[0].file, DataFile) else None
    if data_file is None or data_file.null_counts is None:
        return None
    whole = units[0].row_group == WHOLE_FILE
    if not whole and (data_file.row_group_rows is None
                      or len(units) != len(data_file.row_group_rows)):
        return None
    known = dict(data_file.null_counts)
    return {c: known[c] for c in columns} if all(c in known for c in columns) else None


def _leaf_null_count(row_group: Any, path: str) -> int | None:
    for j in range(row_group.num_columns):
        chunk = row_group.column(j)
        if chunk.path_in_schema == path:
            stats = chunk.statistics
            return int(stats.null_count) if stats is not None and stats.has_null_count else None
    return None


def _check_pinned(where: str, data_file: DataFile, handle: Any) -> None:
    """Size and row groups of an opened file against the pinned snapshot's record of them
    (its row count alone when pinned without its footer: NOTE [ lazy footers ])."""
    if data_file.row_group_rows is None and data_file.rows is not None:
        footer_rows = sum(handle.row_group_rows)
        if footer_rows != data_file.rows:
            raise RowCountMismatchError(
                f"{where}: table metadata says data file {data_file.path} holds "
                f"{data_file.rows} rows, its Parquet footer says {footer_rows}. The table or "
                "the file is corrupt; repair it before training. None of its rows is delivered.")
    if data_file.size_bytes is not None and handle.size != data_file.size_bytes:
        raise SourceFileChangedError(
            f"{where}: data file {data_file.path} is {handle.size} bytes, the pinned snapshot "
            f"lists {data_file.size_bytes}: the file was replaced or truncated. Restore it; "
            "its rows are not delivered.")
    pinned = data_file.row_group_rows
    if pinned is not None and tuple(handle.row_group_rows) != tuple(pinned):
        raise SourceFileChangedError(
            f"{where}: data file {data_file.path} holds row groups of "
            f"{list(handle.row_group_rows)} rows, {list(pinned)} when pinned: the file was "
            "rewritten in place. Restore it; its rows are not delivered.")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One immutable version of a source, resolved to its units in canonical order.

    NOTE [ schema read ]
    A version's rows are read with one schema. Delta: the version's own (column mapping
    resolved from the log at that version). Iceberg, as pyiceberg reads: pinned without
    ``version=``, the table's current schema (a rename or drop since the last snapshot made no
    snapshot); pinned with ``version=S``, snapshot S's own. Columns are resolved by field id
    either way. When the schema read is not the version's own, its id is ``schema_id``, which
    the reader state keeps so a resume reads the same columns, whatever the table did since.

    Attributes:
        identity: which table.
        version: Delta version or Iceberg snapshot id.
        schema: Arrow schema of the rows read (NOTE [ schema read ]).
        units: every row group of every data file, sorted by (path, row group); or whole
            files (NOTE [ lazy footers ]).
        schema_id: the Iceberg schema read when it is not the version's own; None otherwise
            (``source.snapshot(version)`` then reads the same columns).
    """

    identity: TableIdentity
    version: int
    schema: pa.Schema
    units: tuple[Unit, ...]
    file_columns: dict[str, tuple[str, ...]]
    column_types: dict[str, str] = field(default_factory=dict)
    """Column name -> the table format's own type text, to detect type changes in follow mode."""
    reader: RowGroupReader | None = None
    """Reads this table's units (NOTE [ reading seam ]); a plain Parquet reader when None."""
    schema_id: int | None = None
    whole_files: bool = False
    """Pinned with ``units="files"``: files whose metadata gives their row counts are whole
    units (NOTE [ lazy footers ]); a reader state records it."""

    def row_reader(self) -> RowGroupReader:
        """The reader of this snapshot's units (and of units appended later, in follow mode)."""
        return self.reader if self.reader is not None else RowGroupReader(self.identity,
                                                                            self.version)

    @property
    def rows(self) -> int:
        return sum(u.rows for u in self.units)

    def describe(self) -> str:
        schema = "" if self.schema_id is None else f" (schema {self.schema_id})"
        return f"{self.identity.describe()} at version {self.version}{schema}"


class Source(Protocol):
    """A Delta or Iceberg table that can be pinned to a snapshot."""

    def snapshot(self, version: int | None = None, *,
                 schema_id: int | None = None) -> Snapshot:
        """Resolve ``version`` (latest when None) to an immutable snapshot, read with schema
        ``schema_id`` when given (a reader state's; NOTE [ schema read ])."""
        ...

    def commit_after(self, version: int, snapshot: Snapshot,
                     columns: Sequence[str]) -> Commit | None:
        """The commit following ``version``, classified; None if none yet. Fork-safe."""
        ...

    def is_after(self, version: int, until: int) -> bool:
        """Whether ``version`` comes after ``until`` in the table's history."""
        ...


def units_from_files(
    identity: TableIdentity, version: int, files: Sequence[DataFile],
    storage: Storage | None = None, kind: str = "row_groups",
) -> tuple[tuple[Unit, ...], dict[str, tuple[str, ...]]]:
    """Read the footers of ``files`` and list their row groups as units, canonically ordered;
    with ``kind="files"``, a file whose metadata gives its row count is one unit instead, its
    footer unread (NOTE [ lazy footers ]). The column names returned are those of the footers
    read.

    ``storage`` is the table's store (its storage options); the environment's when None.

    Raises:
        PinnedFileMissingError: a listed file is gone.
        RowCountMismatchError: metadata and footer disagree on a file's row count.
    """
    if kind == "files":
        whole = sorted((f for f in files if f.rows is not None), key=lambda f: f.path)
        rest = [f for f in files if f.rows is None]
        listed = [u for f in whole if (u := file_unit(identity, version, f)) is not None]
        more, columns = units_from_files(identity, version, rest, storage)
        return (tuple(sorted([*listed, *more])) if more else tuple(listed)), columns
    ordered = sorted(files, key=lambda f: f.path)
    try:
        footers = read_footers([f.path for f in ordered], [f.size_bytes for f in ordered],
                               storage)
    except FileNotFoundError as exc:
        missing = exc.filename or str(exc)
        raise PinnedFileMissingError(
            f"{identity.describe()} at version {version}: data file {missing} is gone "
            "(vacuumed or expired?). Pin a newer version or restore the file."
        ) from exc
    except (OSError, pa.ArrowException) as exc:
        raise DataFileError(
            f"{identity.describe()} at version {version}: cannot read the Parquet footer of "
            f"data file {_failing(ordered)}: {type(exc).__name__}: {exc}. Check the file and "
            "its permissions; restore it from a backup."
        ) from exc
    units: list[Unit] = []
    for data_file, footer in zip(ordered, footers, strict=True):
        _check_row_count(identity, version, data_file, footer)
        pinned = dataclasses.replace(data_file, row_group_rows=tuple(footer.row_group_rows))
        live = _live_rows(identity, version, pinned)
        units.extend(Unit(pinned.path, i, n, pinned) for i, n in enumerate(live) if n)
    return tuple(units), {f.path: f.column_names for f in footers}


def _failing(files: Sequence[DataFile]) -> str:
    """Which file's footer fails (error path only: footers are read in a pool)."""
    for f in files:
        try:
            read_footers([f.path], [f.size_bytes])
        except (OSError, pa.ArrowException):
            return f.path
    return "(one of the snapshot's files)"


def _live_rows(identity: TableIdentity, version: int, data_file: DataFile) -> list[int]:
    """Rows per row group left by the file's deletes: what the plan counts."""
    sizes = list(data_file.row_group_rows or ())
    if data_file.deletes is None:
        return sizes
    total = sum(sizes)
    if data_file.deletes.beyond(total):
        raise RowCountMismatchError(
            f"{identity.describe()} at version {version}: the deletes of data file "
            f"{data_file.path} name rows past its {total} rows. The table is corrupt.")
    bounds = np.cumsum([0, *sizes])
    deleted = data_file.deletes.count_per_range(bounds)
    return [n - int(d) for n, d in zip(sizes, deleted, strict=True)]


def _check_row_count(
    identity: TableIdentity, version: int, data_file: DataFile, footer: FileFooter
) -> None:
    if data_file.rows is not None and data_file.rows != footer.rows:
        raise RowCountMismatchError(
            f"{identity.describe()} at version {version}: table metadata says data file "
            f"{data_file.path} holds {data_file.rows} rows, its Parquet footer says "
            f"{footer.rows}. The table or the file is corrupt; repair it before training."
        )
