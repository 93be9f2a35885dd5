"""What every source resolves to: a pinned, immutable snapshot listed as units."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote, urlparse

import pyarrow as pa

from lakeckpt_tables.errors import PinnedFileMissingError, RowCountMismatchError
from lakeckpt_tables.io import Storage
from lakeckpt_tables.sources._footers import FileFooter, open_parquet, read_footers
from lakeckpt_tables.types import TableIdentity, Unit

if TYPE_CHECKING:
    from lakeckpt_tables.sources.commits import Commit

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


@dataclass(frozen=True, slots=True)
class DataFile:
    """A data file as table metadata lists it, before its footer is read."""

    path: str
    size_bytes: int | None
    rows: int | None  # None when the table metadata carries no row count


class RowGroupReader:
    """Turns one unit's row group into the table's rows: the one place that reads data bytes.

    NOTE [ reading seam ]
    The plan decides which rows of which unit, in which order; it knows units only by their
    live row counts. A reader, built by the source with the snapshot (picklable: it crosses
    into DataLoader workers, where it opens files lazily), reads a unit's row group and
    returns exactly its live rows, in row order, as the table's logical columns: deleted rows
    removed, partition values added, physical names mapped to logical ones, types normalised.
    Row positions the plan hands out are positions among these live rows.

    This base class reads plain Parquet files whose columns are the table's columns.
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
            RowCountMismatchError: the row group no longer holds the rows it held when pinned.
        """
        path = unit.path
        try:
            handle = self._handles.get(path)
            if handle is None:
                handle = self._handles[path] = open_parquet(path, self.storage)
            table = handle.read_row_group(unit.row_group, columns=list(columns))
        except FileNotFoundError as exc:
            raise PinnedFileMissingError(
                f"{self.describe()}: data file {path} of the pinned version is gone "
                "(vacuumed or expired?); restore it, or start a new run on a newer version"
            ) from exc
        if table.num_rows != unit.rows:
            raise RowCountMismatchError(
                f"{self.describe()}: row group {unit.row_group} of {path} holds "
                f"{table.num_rows} rows, {unit.rows} when the snapshot was pinned; "
                "the file was rewritten in place")
        return table.select(list(columns))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One immutable version of a source, resolved to its units in canonical order.

    Attributes:
        identity: which table.
        version: Delta version or Iceberg snapshot id.
        schema: Arrow schema of the table at this version.
        units: every row group of every data file, sorted by (path, row group).
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

    def row_reader(self) -> RowGroupReader:
        """The reader of this snapshot's units (and of units appended later, in follow mode)."""
        return self.reader if self.reader is not None else RowGroupReader(self.identity,
                                                                            self.version)

    @property
    def rows(self) -> int:
        return sum(u.rows for u in self.units)

    def describe(self) -> str:
        return f"{self.identity.describe()} at version {self.version}"


class Source(Protocol):
    """A Delta or Iceberg table that can be pinned to a snapshot."""

    def snapshot(self, version: int | None = None) -> Snapshot:
        """Resolve ``version`` (latest when None) to an immutable snapshot."""
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
    storage: Storage | None = None,
) -> tuple[tuple[Unit, ...], dict[str, tuple[str, ...]]]:
    """Read the footers of ``files`` and list their row groups as units, canonically ordered.

    ``storage`` is the table's store (its storage options); the environment's when None.

    Raises:
        PinnedFileMissingError: a listed file is gone.
        RowCountMismatchError: metadata and footer disagree on a file's row count.
    """
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
    units: list[Unit] = []
    for data_file, footer in zip(ordered, footers, strict=True):
        _check_row_count(identity, version, data_file, footer)
        units.extend(Unit(data_file.path, i, n, data_file)
                     for i, n in enumerate(footer.row_group_rows) if n)
    return tuple(units), {f.path: f.column_names for f in footers}


def _check_row_count(
    identity: TableIdentity, version: int, data_file: DataFile, footer: FileFooter
) -> None:
    if data_file.rows is not None and data_file.rows != footer.rows:
        raise RowCountMismatchError(
            f"{identity.describe()} at version {version}: table metadata says data file "
            f"{data_file.path} holds {data_file.rows} rows, its Parquet footer says "
            f"{footer.rows}. The table or the file is corrupt; repair it before training."
        )
