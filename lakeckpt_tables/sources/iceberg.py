"""Apache Iceberg tables through pyiceberg, called in the main process only."""

from __future__ import annotations

import os
import threading
import tomllib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import pyarrow as pa

from lakeckpt_tables.errors import (
    SourceChangedError,
    SourceNotFoundError,
    TableMetadataError,
    UnsupportedTableError,
)
from lakeckpt_tables.io import Storage, iceberg_storage
from lakeckpt_tables.sources._deletes import Deletes
from lakeckpt_tables.sources.base import (
    DataFile,
    RowGroupReader,
    Snapshot,
    local_path_or_uri,
    units_from_files,
)
from lakeckpt_tables.sources.commits import Commit, column_change
from lakeckpt_tables.types import TableIdentity, Unit

__all__ = ["DEFAULT_CATALOG_NAME", "IcebergRowGroupReader", "IcebergSource", "default_catalog"]

DEFAULT_CATALOG_NAME = "lakeckpt"


def _default_catalog_properties() -> dict[str, str]:
    home = Path(os.environ.get("LAKECKPT_HOME", Path.home() / ".lakeckpt"))
    text = resources.files("lakeckpt_tables.catalog").joinpath("default.toml").read_text()
    props = {k: str(v).format(home=home) for k, v in tomllib.loads(text).items()}
    if props.get("uri", "").startswith("sqlite:///"):
        home.mkdir(parents=True, exist_ok=True)
    return props


def default_catalog() -> Any:
    """The catalog used when none is given: pyiceberg's SQL catalog on embedded SQLite.

    A pyiceberg catalog named ``lakeckpt`` in ``~/.pyiceberg.yaml`` or in
    ``PYICEBERG_CATALOG__LAKECKPT__*`` environment variables overrides the packaged defaults
    in ``catalog/default.toml`` (for instance a PostgreSQL ``uri``).
    """
    from pyiceberg.catalog import load_catalog
    from pyiceberg.utils.config import Config

    props = _default_catalog_properties()
    overrides = Config().get_catalog_config(DEFAULT_CATALOG_NAME) or {}
    props.update({k: str(v) for k, v in overrides.items()})
    return load_catalog(DEFAULT_CATALOG_NAME, **props)


class IcebergSource:
    """An Iceberg table in a pyiceberg catalog.

    Args:
        identifier: ``"namespace.table"`` or a tuple of names.
        catalog: a pyiceberg ``Catalog``; :func:`default_catalog` when None.
    """

    def __init__(self, identifier: str | tuple[str, ...], *, catalog: Any = None) -> None:
        self.identifier = identifier
        self.catalog = catalog if catalog is not None else default_catalog()
        self._catalog_pid = os.getpid()
        self._snapshots: dict[int, Snapshot] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # A catalog holds connections that must not cross into another process: it is
        # re-created from its class, name and properties there (see _catalog_here).
        state = self.__dict__.copy()
        state["catalog"] = (type(self.catalog), self.catalog.name, dict(self.catalog.properties))
        state["_catalog_pid"] = None
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _catalog_here(self) -> Any:
        """This process's catalog: a forked DataLoader worker opens its own connections."""
        if self._catalog_pid != os.getpid():
            cls, name, props = (self.catalog if isinstance(self.catalog, tuple) else
                                (type(self.catalog), self.catalog.name, self.catalog.properties))
            self.catalog = cls(name, **props)
            self._catalog_pid = os.getpid()
        return self.catalog

    def __repr__(self) -> str:
        return f"IcebergSource({self.identifier!r})"

    def load_table(self) -> Any:
        """The table's current metadata (main process only)."""
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        catalog = self._catalog_here()
        try:
            return catalog.load_table(self.identifier)
        except (NoSuchTableError, NoSuchNamespaceError) as exc:
            raise SourceNotFoundError(
                f"no Iceberg table {self.identifier!r} in catalog {catalog.name!r}: {exc}"
            ) from exc

    def latest_version(self) -> int | None:
        """The current snapshot id, None for a table without snapshots."""
        current = self.load_table().current_snapshot()
        return None if current is None else int(current.snapshot_id)

    def snapshot(self, version: int | None = None) -> Snapshot:
        """Pin snapshot ``version`` (the current one when None) and list its units.

        Raises:
            SourceNotFoundError: no such table or snapshot.
            UnsupportedTableError: the snapshot has equality delete files.
            TableMetadataError: pyiceberg cannot read its manifests or delete files.
            PinnedFileMissingError: a data file of the snapshot is gone.
            RowCountMismatchError: manifest and file footer disagree.
        """
        if version is not None and version in self._snapshots:
            return self._snapshots[version]
        table = self.load_table()
        identity = TableIdentity("iceberg", local_path_or_uri(table.metadata.location),
                                 str(table.metadata.table_uuid))
        snap_meta = table.current_snapshot() if version is None else table.snapshot_by_id(version)
        if snap_meta is None and version not in (None, -1):
            known = [s.snapshot_id for s in table.metadata.snapshots][-5:]
            raise SourceNotFoundError(
                f"{identity.describe()} has no snapshot {version} (expired?); newest ids: {known}"
            )
        if snap_meta is None:  # a table created but never written (-1: a follower's pin): empty
            reader = IcebergRowGroupReader(identity, -1, table.schema(),
                                           table.metadata.name_mapping(),
                                           int(table.metadata.format_version))
            return Snapshot(identity, -1, table.schema().as_arrow(), (), {}, reader=reader)
        pinned = int(snap_meta.snapshot_id)
        storage = iceberg_storage(table.metadata.location, table.io.properties)
        reader = _reader(table, identity, pinned, snap_meta, storage)
        files = self._data_files(table, identity, pinned, reader.schema)
        units, _ = units_from_files(identity, pinned, files, storage)
        schema = _snapshot_schema(table, snap_meta)
        columns = {f.path: tuple(schema.names) for f in files}  # resolved by field id
        snap = Snapshot(identity, pinned, schema, units, columns,
                        _column_types(table, snap_meta.schema_id), reader)
        with self._lock:
            self._snapshots[pinned] = snap
        return snap

    def commit_after(self, version: int, snapshot: Snapshot,
                     columns: Sequence[str]) -> Commit | None:
        """The snapshot after ``version`` on the table's main lineage, classified."""
        table = self.load_table()
        child = _child_in_lineage(table, version, snapshot.identity)
        if child is None:
            return None
        sid, operation = int(child.snapshot_id), child.summary.operation.value
        problem = _schema_problem(table, child.schema_id, columns, snapshot.column_types)
        if problem:
            return Commit(sid, "schema", operation, detail=problem)
        if operation == "replace":
            return Commit(sid, "rearrange", operation, detail="replace changed no rows")
        if operation != "append":
            return Commit(sid, "change", operation, detail=f"{operation} snapshot")
        scan = table.incremental_append_scan(
            from_snapshot_id_exclusive=None if version == -1 else version,
            to_snapshot_id_inclusive=sid)
        try:
            tasks = list(scan.plan_files())
        except Exception as exc:
            raise TableMetadataError(
                f"{snapshot.identity.describe()} snapshot {sid} ({operation}): pyiceberg cannot "
                f"plan its appended files: {type(exc).__name__}: {exc}") from exc
        files = []
        for task in tasks:
            if task.delete_files:
                return Commit(sid, "change", operation, detail="adds delete files")
            files.append(_data_file(table, task, None))
        return Commit(sid, "append", operation, tuple(files))

    def is_after(self, version: int, until: int) -> bool:
        """Snapshot ids are not ordered; only reaching ``until`` itself ends a follow."""
        return False

    def _data_files(self, table: Any, identity: TableIdentity, pinned: int,
                    schema: Any) -> list[DataFile]:
        """Data files of snapshot ``pinned`` with their deletes and identity-partition values."""
        where = f"{identity.describe()} at snapshot {pinned}"
        try:
            tasks = list(table.scan(snapshot_id=pinned).plan_files())
        except (ValueError, NotImplementedError) as exc:
            raise _equality_deletes(table, pinned, where, exc) from exc
        except Exception as exc:
            raise TableMetadataError(
                f"{where}: pyiceberg cannot plan its files: {type(exc).__name__}: {exc}"
            ) from exc
        read: dict[str, dict[str, Any]] = {}  # delete file -> {data file: positions}
        return [_data_file(table, task, _positions(table, task, read, where), schema)
                for task in tasks]


class IcebergRowGroupReader(RowGroupReader):
    """Reads an Iceberg row group as the table's columns of the pinned snapshot's schema
    (NOTE [ reading seam ]), with pyiceberg's own projection: columns resolved by field id
    (renames, swaps, drop and re-add, int->long and float->double promotion), columns a file
    lacks read as nulls or, for identity partitions, as the manifest's value; positional
    deletes and v3 deletion vectors (resolved at pin time) drop deleted rows.

    Relies on ``pyiceberg.io.pyarrow`` (``pyarrow_to_schema``, ``_to_requested_schema``) of
    the pinned pyiceberg range; ``tests/test_tables_iceberg.py`` tests that seam.
    """

    def __init__(self, identity: TableIdentity, version: int, schema: Any,
                 name_mapping: Any, format_version: int, storage: Storage | None = None) -> None:
        super().__init__(identity, version, storage)
        self.schema = schema
        self.name_mapping = name_mapping
        self.format_version = format_version

    def _logical(self, handle: Any, unit: Unit, data_file: DataFile | None,
                 columns: list[str]) -> pa.Table:
        from pyiceberg.io.pyarrow import _to_requested_schema, pyarrow_to_schema
        from pyiceberg.schema import prune_columns
        from pyiceberg.types import ListType, MapType

        projected = self.schema.select(*columns)
        downcast = self.format_version <= 2
        file_schema = pyarrow_to_schema(handle.file.schema_arrow, self.name_mapping,
                                        downcast_ns_timestamp_to_us=downcast,
                                        format_version=self.format_version)  # type: ignore[arg-type]
        wanted = {i for i in projected.field_ids
                  if not isinstance(projected.find_type(i), MapType | ListType)}
        in_file = prune_columns(file_schema, wanted, select_full_types=False)
        names = [c.name for c in in_file.columns]
        table = handle.file.read_row_group(unit.row_group, columns=names)
        identity = dict(data_file.partition) if data_file is not None else {}
        missing = {int(k): v for k, v in identity.items()
                   if int(k) in projected.field_ids and int(k) not in file_schema.field_ids}
        if names:
            record = table.combine_chunks().to_batches()[0]
        else:  # only partition values or added columns: a batch of the row group's length
            rows = handle.row_group_rows[unit.row_group]
            record = pa.RecordBatch.from_arrays([pa.nulls(rows)], names=["__rows"])
        out = _to_requested_schema(projected, in_file, record,
                                   downcast_ns_timestamp_to_us=downcast,
                                   projected_missing_fields=missing,
                                   allow_timestamp_tz_mismatch=True)
        result: pa.Table = pa.Table.from_batches([out]).select(columns)
        return result


    def _null_source(self, handle: Any, data_file: DataFile | None, column: str) -> str | int:
        from pyiceberg.io.pyarrow import pyarrow_to_schema

        field_id = self.schema.find_field(column).field_id
        file_schema = pyarrow_to_schema(handle.file.schema_arrow, self.name_mapping,
                                        format_version=self.format_version)  # type: ignore[arg-type]
        if field_id in file_schema.field_ids:
            return str(file_schema.find_field(field_id).name)
        identity = dict(data_file.partition) if data_file is not None else {}
        return 0 if str(field_id) in identity else 1


def _reader(table: Any, identity: TableIdentity, pinned: int, snap_meta: Any,
            storage: Storage | None = None) -> IcebergRowGroupReader:
    schema = table.schemas().get(snap_meta.schema_id, table.schema())
    return IcebergRowGroupReader(identity, pinned, schema, table.metadata.name_mapping(),
                                 int(table.metadata.format_version), storage)


def _data_file(table: Any, task: Any, deletes: Deletes | None, schema: Any = None) -> DataFile:
    """A scan task's data file, with the values of its identity partitions by source field id
    (filled in when the file does not store the column)."""
    from pyiceberg.schema import build_position_accessors
    from pyiceberg.transforms import IdentityTransform

    file = task.file
    spec = table.specs().get(file.spec_id)
    partition: list[tuple[str, Any]] = []
    if spec is not None and spec.fields:
        accessors = build_position_accessors(spec.partition_type(table.schema()))
        for field in spec.fields:
            if isinstance(field.transform, IdentityTransform):
                value = accessors[field.field_id].get(file.partition)
                if value is not None:
                    partition.append((str(field.source_id), value))
    schema = schema if schema is not None else table.schema()  # null counts by its names
    counts = []
    for field_id, count in (file.null_value_counts or {}).items():
        try:
            counts.append((schema.find_column_name(field_id), int(count)))
        except ValueError:
            continue
    named = tuple(sorted((n, c) for n, c in counts if n is not None))
    return DataFile(local_path_or_uri(file.file_path), file.file_size_in_bytes,
                    file.record_count, deletes, tuple(partition), null_counts=named or None)


def _positions(table: Any, task: Any, read: dict[str, dict[str, Any]],
               where: str) -> Deletes | None:
    """Deleted rows of a task's data file from its positional delete files / deletion vectors
    (pyiceberg's ``_read_deletes``), each delete file read once per snapshot."""
    if not task.delete_files:
        return None
    from pyiceberg.io.pyarrow import _read_deletes
    from pyiceberg.manifest import DataFileContent

    chunks = []
    for delete_file in task.delete_files:
        if delete_file.content == DataFileContent.EQUALITY_DELETES:
            raise UnsupportedTableError(
                f"{where}: data file {task.file.file_path} has equality delete file "
                f"{delete_file.file_path}; equality deletes are not read. Rewrite the data "
                "files (rewrite_data_files / compaction) before training from it.")
        if delete_file.file_path not in read:
            try:
                read[delete_file.file_path] = _read_deletes(table.io, delete_file)
            except Exception as exc:
                raise TableMetadataError(
                    f"{where}: cannot read delete file {delete_file.file_path}: "
                    f"{type(exc).__name__}: {exc}") from exc
        found = read[delete_file.file_path].get(task.file.file_path)
        if found is not None:
            chunks.append(pa.chunked_array(found).to_numpy())
    import numpy as np

    return Deletes.from_positions(np.concatenate(chunks)) if chunks else None


def _equality_deletes(table: Any, pinned: int, where: str, exc: Exception) -> Exception:
    """pyiceberg refuses to plan a snapshot with equality deletes: say which file."""
    if "equality" not in str(exc).lower():
        return TableMetadataError(
            f"{where}: pyiceberg cannot plan its files: {type(exc).__name__}: {exc}")
    from pyiceberg.manifest import DataFileContent

    named = ""
    try:
        for manifest in table.snapshot_by_id(pinned).manifests(table.io):
            for entry in manifest.fetch_manifest_entry(table.io):
                if entry.data_file.content == DataFileContent.EQUALITY_DELETES:
                    named = f" ({entry.data_file.file_path})"
                    break
            if named:
                break
    except Exception:
        pass
    return UnsupportedTableError(
        f"{where} has equality delete files{named}; equality deletes are not read. Rewrite "
        "the data files (rewrite_data_files / compaction) before training from it.")


def _child_in_lineage(table: Any, version: int, identity: TableIdentity) -> Any:
    """The snapshot whose parent is ``version`` on the current lineage; None if ``version``
    is current."""
    child = None
    current = table.current_snapshot()
    while current is not None:
        if current.snapshot_id == version:
            return child
        child = current
        parent = current.parent_snapshot_id
        current = None if parent is None else table.snapshot_by_id(parent)
    if version == -1:  # pinned before the table's first snapshot: the lineage's root is next
        return child
    raise SourceChangedError(
        f"{identity.describe()}: snapshot {version} is no longer an ancestor of the current "
        "snapshot (rolled back or expired); the followed history is gone")


def _column_types(table: Any, schema_id: int) -> dict[str, str]:
    schema = table.schemas().get(schema_id, table.schema())
    return {f.name: str(f.field_type) for f in schema.fields}


def _schema_problem(table: Any, schema_id: int, columns: Sequence[str],
                    types: dict[str, str]) -> str:
    return column_change(columns, types, _column_types(table, schema_id))


def _snapshot_schema(table: Any, snap_meta: Any) -> pa.Schema:
    schemas = table.schemas()
    schema = schemas.get(snap_meta.schema_id, table.schema())
    arrow: pa.Schema = schema.as_arrow()
    return arrow
