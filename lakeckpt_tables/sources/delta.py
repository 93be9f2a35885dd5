"""Delta Lake tables through deltalake (delta-rs), called in the main process only.

NOTE [ fork safety ]: deltalake's tokio runtime panics in a forked child that uses it after the
parent did, so this module resolves snapshots in the main process (file paths, deletion vectors
as row positions, typed partition values, physical column names) and the DataLoader workers
read the files with pyarrow alone (:class:`DeltaRowGroupReader`).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote

import pyarrow as pa

from lakeckpt_tables.errors import (
    SourceArgumentError,
    SourceNotFoundError,
    StorageError,
    TableMetadataError,
    UnsupportedTableError,
)
from lakeckpt_tables.io import Storage
from lakeckpt_tables.sources._arrow import (
    PhysicalNames,
    conform,
    constant,
    parquet_field_id,
    parse_partition_value,
)
from lakeckpt_tables.sources._deletes import Deletes
from lakeckpt_tables.sources.base import (
    DataFile,
    RowGroupReader,
    Snapshot,
    local_path_or_uri,
    units_from_files,
)
from lakeckpt_tables.sources.commits import Commit, read_delta_commit
from lakeckpt_tables.sources.lazy import checked_units
from lakeckpt_tables.types import TableIdentity, Unit

__all__ = ["READABLE_READER_FEATURES", "DeltaRowGroupReader", "DeltaSource"]

_COLUMN_MAPPING_KEY = "delta.columnMapping.mode"
_PHYSICAL_NAME_KEY = "delta.columnMapping.physicalName"
_FIELD_ID_KEY = "delta.columnMapping.id"
_DV_FEATURE = "deletionVectors"

READABLE_READER_FEATURES = frozenset({
    "deletionVectors",  # applied as row masks
    "columnMapping",  # physical names mapped to logical ones
    "timestampNtz",  # naive timestamps, microseconds
    "v2Checkpoint",  # the log is deltalake's business
    "vacuumProtocolCheck",
    "typeWidening", "typeWidening-preview",  # narrower file types cast to the table's
    "variantType", "variantType-preview",  # unshredded variant: a struct of two binaries
})
"""Delta reader features whose tables read right; any other is refused by name."""


class DeltaSource:
    """A Delta table, by path or URI.

    Args:
        uri: table root, a local path or a URI delta-rs understands.
        storage_options: for object stores; the log (delta-rs), the data files and follow
            mode's log polling all go through them, and nothing falls back to ``AWS_*``
            environment variables when they are given (:class:`~lakeckpt_tables.io.Storage`).
        units: ``"row_groups"`` (every file's footer read when pinned) or ``"files"`` (a file
            whose log entry gives its row count is one unit, its footer read by the reader
            that reads it: NOTE [ lazy footers ] in ``sources/lazy.py``).
    """

    def __init__(self, uri: str | os.PathLike[str], *,
                 storage_options: dict[str, str] | None = None,
                 units: str = "row_groups") -> None:
        if not isinstance(uri, str | os.PathLike) or not str(os.fspath(uri)).strip():
            raise SourceArgumentError(
                f"DeltaSource(uri={uri!r}): a Delta table is named by its root directory, a "
                "local path or a URI such as 's3://bucket/table'; for an Iceberg table in a "
                "catalog use IcebergSource('namespace.table')")
        self.uri = str(os.fspath(uri))
        self.units = checked_units(units, f"DeltaSource({self.uri!r})")
        self.storage_options = dict(storage_options or {})
        self._storage = Storage(self.uri, storage_options or None)
        self._snapshots: dict[int, Snapshot] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"DeltaSource({self.uri!r})"

    def with_units(self, units: str) -> DeltaSource:
        """This table pinned with ``units`` (a reader state's: NOTE [ lazy footers ])."""
        if units == self.units:
            return self
        return DeltaSource(self.uri, storage_options=self.storage_options or None, units=units)

    def _open(self, version: int | None) -> Any:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        if version is not None and version < 0:  # delta-rs raises OverflowError for these
            raise SourceNotFoundError(f"Delta table {self.uri} has no version {version}: "
                                      "versions start at 0")
        if version is not None and not self._storage.exists(f"_delta_log/{version:020d}.json"):
            # delta-rs 1.6 does not return for a version far past the latest (2**31: minutes);
            # one HEAD answers the usual case, the latest version the rest
            newest = int(self._open(None).version())
            if version > newest:
                raise SourceNotFoundError(f"Delta table {self.uri} has no version {version}: "
                                          f"its latest is {newest}")
        try:
            return DeltaTable(self.uri, version=version,
                              storage_options=self._storage.delta_options())
        except TableNotFoundError as exc:
            raise SourceNotFoundError(
                f"no Delta table at {self.uri}: {_message(exc)}. Check the path or URI."
            ) from exc
        except OSError as exc:  # the store failed (delta-rs has retried)
            raise StorageError(
                f"Delta table {self.uri}: the store failed: "
                f"{self._storage.redact(_message(exc))}. "
                "Check the endpoint and credentials in storage_options, then retry") from exc
        except Exception as exc:
            if version is None or self._storage.exists(f"_delta_log/{version:020d}.json"):
                at = "" if version is None else f" at version {version}"
                raise TableMetadataError(
                    f"Delta table {self.uri}: deltalake cannot load its log{at}: "
                    f"{type(exc).__name__}: {self._storage.redact(_message(exc))}. The log is "
                    "malformed or uses what deltalake cannot read") from exc
            try:
                latest: int | str = DeltaTable(
                    self.uri, storage_options=self._storage.delta_options()).version()
            except Exception:
                latest = "unknown"
            raise SourceNotFoundError(
                f"Delta table {self.uri} has no version {version} (or cannot read it; latest "
                f"is {latest}, older ones may be vacuumed): {type(exc).__name__}: "
                f"{_message(exc)}"
            ) from exc

    def latest_version(self) -> int:
        """The newest committed version."""
        return int(self._open(None).version())

    def snapshot(self, version: int | None = None, *,
                 schema_id: int | None = None) -> Snapshot:
        """Pin ``version`` (the latest when None) and list its units, read with the version's
        own schema (a Delta schema is its version's: ``schema_id`` must be None).

        Raises:
            SourceNotFoundError: no table at ``uri``, or no such version.
            UnsupportedTableError: a reader feature not in ``READABLE_READER_FEATURES``.
            TableMetadataError: deltalake cannot read the log or the deletion vectors.
            PinnedFileMissingError: a data file of the version is gone.
            RowCountMismatchError: the log and a file footer disagree.
        """
        if schema_id is not None:
            raise SourceArgumentError(
                f"{self!r}.snapshot(schema_id={schema_id!r}): a Delta version is read with its "
                "own schema; the schema id is for Iceberg tables (is the reader state of one?)")
        if version is not None and version in self._snapshots:
            return self._snapshots[version]
        dt = self._open(version)
        pinned = int(dt.version())
        with self._lock:
            if pinned in self._snapshots:
                return self._snapshots[pinned]
        where = f"Delta table {self.uri} at version {pinned}"
        try:
            identity = TableIdentity("delta", local_path_or_uri(dt.table_uri),
                                     str(dt.metadata().id))
            _refuse_unsupported(dt, identity, pinned)
            reader = _reader(dt, identity, pinned, self._storage)
            files = _data_files(dt, identity.location, reader)
            types = {f["name"]: json.dumps(f["type"])
                     for f in json.loads(dt.schema().to_json())["fields"]}
        except (UnsupportedTableError, TableMetadataError):
            raise
        except Exception as exc:
            raise TableMetadataError(
                f"{where}: cannot list its files: {type(exc).__name__}: {_message(exc)}"
            ) from exc
        units, _ = units_from_files(identity, pinned, files, self._storage, self.units)
        names = tuple(reader.schema.names)
        columns = {f.path: names for f in files}  # missing ones read null
        snap = Snapshot(identity, pinned, reader.schema, units, columns, types, reader,
                        whole_files=self.units == "files")
        with self._lock:
            self._snapshots[pinned] = snap
        return snap

    def commit_after(self, version: int, snapshot: Snapshot,
                     columns: Sequence[str]) -> Commit | None:
        """Commit ``version + 1`` from the log JSON (fork-safe: no deltalake); None if absent."""
        reader = snapshot.reader
        if not isinstance(reader, DeltaRowGroupReader):  # an empty snapshot of another kind
            return read_delta_commit(snapshot.identity.location, version + 1, list(columns),
                                     snapshot.column_types, self._storage)
        return read_delta_commit(snapshot.identity.location, version + 1, list(columns),
                                 snapshot.column_types, self._storage,
                                 add_file=functools.partial(_add_file, reader=reader),
                                 partition_columns=sorted(reader.partitions))

    def is_after(self, version: int, until: int) -> bool:
        return version > until


class DeltaRowGroupReader(RowGroupReader):
    """Reads a Delta row group as the table's logical columns (NOTE [ reading seam ]).

    Partition columns come from the log (constant per file, typed); with column mapping the
    file's physical names are mapped to logical ones, nested fields included; columns a file
    lacks (added after it was written) read as nulls; deletion vectors drop deleted rows.
    Picklable and free of deltalake, so it reads in DataLoader workers.
    """

    def __init__(self, identity: TableIdentity, version: int, schema: pa.Schema,
                 partitions: Sequence[str], physical: PhysicalNames | None,
                 storage: Storage | None = None, *,
                 field_ids: Mapping[str, int] | None = None) -> None:
        super().__init__(identity, version, storage)
        self.schema = schema
        self.partitions = frozenset(partitions)
        self.physical = dict(physical) if physical else None
        self.field_ids = dict(field_ids) if field_ids else None  # column mapping mode "id"
        self._constants: dict[tuple[str, Any, int], pa.Array] = {}
        self._by_id: dict[str, dict[int, str]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_constants"] = {}
        state["_by_id"] = {}
        return state

    def _constant(self, column: str, value: Any, kind: pa.DataType, rows: int) -> pa.Array:
        """A partition column's array, built once per (column, value, rows) and reused:
        Arrow arrays are immutable, and row groups mostly share one size."""
        key = (column, value, rows)
        array = self._constants.get(key)
        if array is None:
            if len(self._constants) >= 256:
                self._constants.clear()
            array = self._constants[key] = constant(value, kind, rows)
        return array

    def _names(self, column: str) -> tuple[str, PhysicalNames | None]:
        if self.physical is None:
            return column, None
        entry = self.physical.get(column, (column, None))
        return str(entry[0]), entry[1]

    def _file_name(self, handle: Any, path: str | None, column: str) -> str:
        """The file's top-level column holding ``column``.

        NOTE [ column mapping id ]
        In mode ``id`` the Delta protocol resolves a column by its Parquet field id, not its
        name: files converted from Iceberg, or written by engines that keep their own names,
        hold the column under another name with the same id. A file without field ids is
        read by physical name (as deltalake 1.6.6 reads every file: by name only). Nested
        struct fields are resolved the same way, each by its own id (``conform``); a list's
        element and a map's key and value are their parent's only child of that role in
        Parquet, so they need no id to be found.
        """
        physical = self._names(column)[0]
        if self.field_ids is None or column not in self.field_ids:
            return physical
        by_id = self._by_id.get(path) if path is not None else None
        if by_id is None:
            by_id = {}
            for field in handle.file.schema_arrow:
                field_id = parquet_field_id(field)
                if field_id is not None:
                    by_id[field_id] = field.name
            if path is not None:
                if len(self._by_id) >= 1024:
                    self._by_id.clear()
                self._by_id[path] = by_id
        return by_id.get(self.field_ids[column], physical) if by_id else physical

    def _logical(self, handle: Any, unit: Unit, data_file: DataFile | None,
                 columns: list[str]) -> pa.Table:
        rows = handle.row_group_rows[unit.row_group]
        in_file = set(handle.file.schema_arrow.names)
        names = {c: self._file_name(handle, unit.path, c) for c in columns
                 if c not in self.partitions}
        present = list(dict.fromkeys(p for p in names.values() if p in in_file))
        read = (handle.file.read_row_group(unit.row_group, columns=present) if present
                else None)
        values = dict(data_file.partition) if data_file is not None else {}
        arrays, fields = [], []
        for column in columns:
            field = pa.field(column, self.schema.field(column).type)
            nested = self._names(column)[1]
            physical = names.get(column, column)
            if column in self.partitions:
                arrays.append(self._constant(column, values.get(column), field.type, rows))
            elif read is not None and physical in read.column_names:
                arrays.append(conform(read.column(physical), field, nested))
            else:
                arrays.append(pa.nulls(rows, field.type))
            fields.append(field)
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


    def _null_source(self, handle: Any, data_file: DataFile | None, column: str) -> str | int:
        if column in self.partitions:
            values = dict(data_file.partition) if data_file is not None else {}
            return 1 if values.get(column) is None else 0
        physical = self._file_name(handle, data_file.path if data_file else None, column)
        return physical if physical in handle.file.schema_arrow.names else 1


_BACKTRACE = re.compile(r"\n\s*0: ")


def _message(exc: BaseException) -> str:
    """deltalake's error text without the Rust backtrace its kernel errors carry, nor a
    trailing period (the caller's sentence follows)."""
    return _BACKTRACE.split(str(exc), maxsplit=1)[0].strip().rstrip(".")


def _reader(dt: Any, identity: TableIdentity, version: int,
            storage: Storage | None = None) -> DeltaRowGroupReader:
    fields = json.loads(dt.schema().to_json())["fields"]
    arrow = pa.schema(dt.schema().to_arrow())
    schema = pa.schema([pa.field(f.name, f.type) for f in arrow])  # no mapping metadata
    mode = dt.metadata().configuration.get(_COLUMN_MAPPING_KEY, "none")
    physical = (_physical_names(fields, ids=mode == "id") if mode not in ("none", None)
                else None)
    ids = ({f["name"]: int(f["metadata"][_FIELD_ID_KEY]) for f in fields
            if _FIELD_ID_KEY in f.get("metadata", {})} if mode == "id" else None)
    return DeltaRowGroupReader(identity, version, schema,
                               list(dt.metadata().partition_columns), physical, storage,
                               field_ids=ids)


def _physical_names(fields: list[dict[str, Any]], *, ids: bool = False) -> dict[str, Any]:
    """Column mapping: logical name -> (physical name, children) from the schema JSON; with
    ``ids`` (mode ``id``), (physical name, children, field id) where the field has an id."""
    out: dict[str, Any] = {}
    for f in fields:
        meta = f.get("metadata", {})
        entry: tuple[Any, ...] = (meta.get(_PHYSICAL_NAME_KEY, f["name"]),
                                  _nested_names(f["type"], ids=ids))
        if ids and _FIELD_ID_KEY in meta:
            entry = (*entry, int(meta[_FIELD_ID_KEY]))
        out[f["name"]] = entry
    return out


def _nested_names(kind: Any, *, ids: bool = False) -> dict[str, Any] | None:
    if not isinstance(kind, dict):
        return None
    if kind.get("type") == "struct":
        return _physical_names(kind["fields"], ids=ids)
    if kind.get("type") == "array":
        return _nested_names(kind["elementType"], ids=ids)
    if kind.get("type") == "map":
        return {"key": ("key", _nested_names(kind["keyType"], ids=ids)),
                "value": ("value", _nested_names(kind["valueType"], ids=ids))}
    return None


def _data_files(dt: Any, root: str, reader: DeltaRowGroupReader) -> list[DataFile]:
    adds = pa.table(dt.get_add_actions(flatten=False))
    paths = adds.column("path").to_pylist()
    sizes = adds.column("size_bytes").to_pylist()
    rows = adds.column("num_records").to_pylist() if "num_records" in adds.column_names else None
    parts = (adds.column("partition").to_pylist()
             if reader.partitions and "partition" in adds.column_names else None)
    nulls = (adds.column("null_count").to_pylist() if "null_count" in adds.column_names
             else [None] * len(paths))
    logical = {reader._names(c)[0]: c for c in reader.schema.names}
    deletes = _deletion_vectors(dt)
    out = []
    for i, rel in enumerate(paths):
        full = rel if "://" in rel else f"{root}/{unquote(rel)}"
        partition = tuple(sorted((parts[i] or {}).items())) if parts is not None else ()
        missing = reader.partitions and reader.partitions - {name for name, _ in partition}
        if missing:
            raise TableMetadataError(
                f"{reader.describe()}: the log gives data file {full} no value for partition "
                f"column(s) {sorted(missing)}; the log is corrupt")
        counts = tuple(sorted((logical[k], int(v)) for k, v in (nulls[i] or {}).items()
                              if k in logical and isinstance(v, int)))
        deleted = deletes.pop(local_path_or_uri(full), None) if deletes else None
        out.append(DataFile(full, sizes[i], None if rows is None else rows[i], deleted,
                            partition, null_counts=counts or None))
    if deletes:  # never read a file without its deletion vector
        raise TableMetadataError(
            f"{reader.describe()}: deletion vectors name data file(s) the log does not list as "
            f"this reader spells them: {sorted(deletes)[:3]}; refusing rather than reading "
            "deleted rows")
    return out


def _deletion_vectors(dt: Any) -> dict[str, Deletes]:
    """Deleted rows per data file, from deltalake's selection vectors (main process only)."""
    if _DV_FEATURE not in (dt.protocol().reader_features or []):
        return {}
    table = pa.table(dt.deletion_vectors())
    out: dict[str, Deletes] = {}
    selection = table.column("selection_vector").combine_chunks()
    if selection.null_count:
        masks: Any = selection.to_pylist()
    else:  # one bit unpacking, not a Python bool per row (~15 ms a million rows)
        flat = selection.flatten().to_numpy(zero_copy_only=False)
        ends = selection.offsets.to_numpy()
        ends = ends - ends[0]
        masks = [flat[a:b] for a, b in itertools.pairwise(ends)]
    for uri, keep in zip(table.column("filepath").to_pylist(), masks, strict=True):
        deletes = Deletes.from_selection(keep)
        if deletes is not None:
            out[local_path_or_uri(uri)] = deletes
    return out


def _add_file(root: str, add: Mapping[str, Any], *, reader: DeltaRowGroupReader) -> DataFile:
    """An appended file (follow mode) with the facts a pinned one carries: typed partition
    values keyed by logical name. Adds with deletion vectors are 'change' commits."""
    rel = add["path"]
    path = rel if "://" in rel else f"{root}/{unquote(rel)}"
    stats = json.loads(add["stats"]) if add.get("stats") else {}
    rows = stats.get("numRecords")
    raw = add.get("partitionValues") or {}
    partition = []
    for column in sorted(reader.partitions):
        physical = reader._names(column)[0]
        text = raw.get(physical, raw.get(column))
        partition.append((column, parse_partition_value(text, reader.schema.field(column).type)))
    return DataFile(path, add.get("size"), None if rows is None else int(rows),
                    partition=tuple(partition))


def _refuse_unsupported(dt: Any, identity: TableIdentity, version: int) -> None:
    where = f"{identity.describe()} at version {version}"
    protocol = dt.protocol()
    if protocol.min_reader_version > 3:
        raise UnsupportedTableError(
            f"{where} needs Delta reader version {protocol.min_reader_version}; this reader "
            "knows versions up to 3. Upgrade lakeckpt-tables.")
    unknown = sorted(set(protocol.reader_features or []) - READABLE_READER_FEATURES)
    if unknown:
        raise UnsupportedTableError(
            f"{where} uses Delta reader feature(s) {unknown}, which lakeckpt-tables cannot read "
            "correctly (readable: deletion vectors, column mapping, timestampNtz, v2 "
            "checkpoints, type widening, unshredded variant). Rewrite the table without them.")
