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
    SourceArgumentError,
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
from lakeckpt_tables.sources.lazy import checked_units
from lakeckpt_tables.types import TableIdentity, Unit

__all__ = ["DEFAULT_CATALOG_NAME", "IcebergRowGroupReader", "IcebergSource", "default_catalog"]

DEFAULT_CATALOG_NAME = "lakeckpt"
_NAME_MAPPING = "schema.name-mapping.default"


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


def default_catalog_uri() -> str | None:
    """default_catalog's URI unless pyiceberg is configured (NOTE [ direct iceberg read ])."""
    if any(name.lower().startswith("pyiceberg_") for name in os.environ) or any(
            (Path(d) / ".pyiceberg.yaml").exists() for d in (Path.home(), Path.cwd())):
        return None
    props = _default_catalog_properties()
    return props["uri"] if set(props) == {"type", "uri", "warehouse"} and \
        props["type"] == "sql" else None


_ADDED_DELETES = ("added-delete-files", "added-position-delete-files",
                  "added-equality-delete-files", "added-position-deletes",
                  "added-equality-deletes")
"""Snapshot summary fields counting the delete files (or deletes) a snapshot adds."""


class IcebergSource:
    """An Iceberg table in a pyiceberg catalog.

    Args:
        identifier: ``"namespace.table"`` or a tuple of names.
        catalog: a pyiceberg ``Catalog``; :func:`default_catalog` when None.
        units: ``"row_groups"`` (every file's footer read when pinned) or ``"files"`` (each
            data file one unit, its manifest's ``record_count`` its rows, its footer read by
            the reader that reads it: NOTE [ lazy footers ] in ``sources/lazy.py``).
    """

    def __init__(self, identifier: str | tuple[str, ...], *, catalog: Any = None,
                 units: str = "row_groups") -> None:
        self.identifier = _checked_identifier(identifier)
        self.units = checked_units(units, f"IcebergSource({self.identifier!r})")
        self.catalog = catalog if catalog is not None else default_catalog()
        self._catalog_pid = os.getpid()
        self._snapshots: dict[tuple[int, int | None], Snapshot] = {}  # (version, schema_id)
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

    def with_units(self, units: str) -> IcebergSource:
        """This table pinned with ``units`` (a reader state's: NOTE [ lazy footers ])."""
        if units == self.units:
            return self
        return IcebergSource(self.identifier, catalog=self._catalog_here(), units=units)

    def load_table(self) -> Any:
        """The table's current metadata (main process only)."""
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError, ValidationError

        catalog = self._catalog_here()
        try:
            return catalog.load_table(self.identifier)
        except (NoSuchTableError, NoSuchNamespaceError) as exc:
            raise SourceNotFoundError(
                f"no Iceberg table {self.identifier!r} in catalog {catalog.name!r}: {exc}"
            ) from exc
        except FileNotFoundError as exc:
            raise SourceNotFoundError(
                f"Iceberg table {self.identifier!r} in catalog {catalog.name!r}: its metadata "
                f"file is gone: {exc}. Restore it, or point the catalog at a metadata file "
                "that exists") from exc
        except (ValidationError, ValueError, KeyError, TypeError) as exc:  # pydantic's too
            raise TableMetadataError(
                f"Iceberg table {self.identifier!r} in catalog {catalog.name!r}: pyiceberg "
                f"cannot read its metadata: {type(exc).__name__}: {str(exc)[:500]}") from exc

    def latest_version(self) -> int | None:
        """The current snapshot id, None for a table without snapshots."""
        current = self.load_table().current_snapshot()
        return None if current is None else int(current.snapshot_id)

    def snapshot(self, version: int | None = None, *,
                 schema_id: int | None = None) -> Snapshot:
        """Pin snapshot ``version`` (the current one when None) and list its units.

        Its rows are read with the table's current schema when ``version`` is None, with the
        snapshot's own otherwise, or with schema ``schema_id`` when given (a reader state's):
        NOTE [ schema read ] in ``sources/base.py``.

        Raises:
            SourceNotFoundError: no such table, snapshot or schema.
            UnsupportedTableError: the snapshot has equality delete files.
            TableMetadataError: pyiceberg cannot read its metadata, manifests or delete files,
                or a data file's location is relative and not found where pyiceberg looks.
            PinnedFileMissingError: a data file of the snapshot is gone.
            RowCountMismatchError: manifest and file footer disagree.
        """
        if version is not None and (version, schema_id) in self._snapshots:
            return self._snapshots[(version, schema_id)]
        table = self.load_table()
        identity = TableIdentity("iceberg", _location(table.metadata.location),
                                 str(table.metadata.table_uuid))
        snap_meta = table.current_snapshot() if version is None else table.snapshot_by_id(version)
        if snap_meta is None and version not in (None, -1):
            known = [s.snapshot_id for s in table.metadata.snapshots][-5:]
            raise SourceNotFoundError(
                f"{identity.describe()} has no snapshot {version} (expired?); newest ids: {known}"
            )
        pinned = -1 if snap_meta is None else int(snap_meta.snapshot_id)
        where = f"{identity.describe()} at snapshot {pinned}"
        schema = _schema_read(table, snap_meta, version, schema_id, where)
        own = None if snap_meta is None else snap_meta.schema_id
        recorded = None if own is not None and schema.schema_id == own else schema.schema_id
        storage = iceberg_storage(table.metadata.location, table.io.properties)
        reader = IcebergRowGroupReader(identity, pinned, schema, _name_mapping(table, where),
                                       int(table.metadata.format_version), storage)
        types = {f.name: str(f.field_type) for f in schema.fields}
        arrow = schema.as_arrow()
        if snap_meta is None:  # a table created but never written (-1: a follower's pin): empty
            return Snapshot(identity, -1, arrow, (), {}, types, reader, recorded,
                            self.units == "files")
        files = self._data_files(table, identity, pinned, schema)
        units, _ = units_from_files(identity, pinned, files, storage, self.units)
        columns = {f.path: tuple(schema.column_names) for f in files}  # resolved by field id
        snap = Snapshot(identity, pinned, arrow, units, columns, types, reader, recorded,
                        self.units == "files")
        with self._lock:
            self._snapshots[(pinned, recorded)] = snap
            if version is not None:  # asked as (version, the snapshot's own schema id)
                self._snapshots[(pinned, schema_id)] = snap
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
        summary = child.summary
        added = {k: int(summary.get(k) or 0) for k in _ADDED_DELETES if summary.get(k)}
        if any(added.values()):
            # an append scan lists data files only: rows this snapshot deletes would be missed
            return Commit(sid, "change", operation,
                          detail=f"the snapshot adds delete files ({added})")
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
        reader = snapshot.reader
        schema = reader.schema if isinstance(reader, IcebergRowGroupReader) else None
        for task in tasks:
            if task.delete_files:
                return Commit(sid, "change", operation, detail="adds delete files")
            files.append(_data_file(table, task, None, schema))  # statistics by pinned names
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
        try:
            files = [_data_file(table, task, _positions(table, task, read, where), schema)
                     for task in tasks]
        except (ValueError, KeyError, TypeError) as exc:  # malformed partitions or statistics
            raise TableMetadataError(
                f"{where}: its manifests cannot be read: {type(exc).__name__}: {exc}") from exc
        for task, data_file in zip(tasks, files, strict=True):
            _check_relative(task.file.file_path, data_file.path, where)
        return files


def _checked_identifier(identifier: Any) -> str | tuple[str, ...]:
    """``identifier`` if it names a table in a namespace, as pyiceberg needs."""
    parts = (identifier.split(".") if isinstance(identifier, str) else
             list(identifier) if isinstance(identifier, tuple | list) else None)
    if parts is None or len(parts) < 2 or not all(isinstance(p, str) and p for p in parts):
        raise SourceArgumentError(
            f"IcebergSource(identifier={identifier!r}): an Iceberg table is named "
            "'namespace.table' (or a tuple ('namespace', 'table')), e.g. "
            "IcebergSource('default.tokens'); for a Delta table by path use DeltaSource(path)")
    return identifier if isinstance(identifier, str) else tuple(parts)


class IcebergRowGroupReader(RowGroupReader):
    """Reads an Iceberg row group as the columns of the schema read (NOTE [ schema read ],
    NOTE [ reading seam ]), with pyiceberg's own projection: columns resolved by field id
    (renames, swaps, drop and re-add, int->long, float->double and decimal widening), columns a file
    lacks read as nulls or, for identity partitions, as the manifest's value; positional
    deletes and v3 deletion vectors (resolved at pin time) drop deleted rows.

    Relies on ``pyiceberg.io.pyarrow`` (``pyarrow_to_schema``, ``_to_requested_schema``) of
    the pinned pyiceberg range; ``tests/test_tables_iceberg*.py`` and
    ``tests/test_tables_evolution.py`` test that seam.
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


def _schema_read(table: Any, snap_meta: Any, version: int | None, schema_id: int | None,
                 where: str) -> Any:
    """The pyiceberg schema a snapshot's rows are read with (NOTE [ schema read ]): as
    ``scan()`` (current schema) when ``version`` is None, as ``scan(snapshot_id=version)``
    (the snapshot's own; the current one when it records none) otherwise."""
    schemas = table.schemas()
    if schema_id is not None:
        if schema_id not in schemas:
            raise SourceNotFoundError(
                f"{where}: the table has no schema {schema_id} (the reader state's); its "
                f"schemas are {sorted(schemas)}. Start a new run, or restore the table metadata")
        return schemas[schema_id]
    if version is None or snap_meta is None or snap_meta.schema_id is None:
        return table.schema()
    return schemas.get(snap_meta.schema_id, table.schema())


def _name_mapping(table: Any, where: str) -> Any:
    """The table's ``schema.name-mapping.default`` (how files without field ids are read)."""
    from pyiceberg.exceptions import ValidationError

    try:
        return table.metadata.name_mapping()
    except (ValidationError, ValueError) as exc:  # pydantic's, or JSON that does not parse
        text = table.metadata.properties.get(_NAME_MAPPING, "")
        raise TableMetadataError(
            f"{where}: table property {_NAME_MAPPING!r} is not a name mapping in the Iceberg "
            f"spec's shape (a JSON list of {{\"field-id\", \"names\", \"fields\"}} objects): "
            f"{text[:200]!r}: {type(exc).__name__}: {str(exc)[:300]}. Fix or remove the "
            "property (ALTER TABLE ... SET/UNSET TBLPROPERTIES)") from exc


def _location(location: str) -> str:
    """A table or file location as pyiceberg's FileIO resolves it: a location without a
    scheme is a local path, relative ones resolved against the current directory
    (``PyArrowFileIO.parse_location`` calls ``os.path.abspath``)."""
    if "://" not in location and not location.startswith("/"):
        return os.path.abspath(location)
    return local_path_or_uri(location)


def _check_relative(location: str, path: str, where: str) -> None:
    """A relative data-file location not found where pyiceberg looks is named as such, not as
    a file gone."""
    if location != path and "://" not in location and not location.startswith("/") \
            and not os.path.exists(path):
        raise TableMetadataError(
            f"{where}: data file location {location!r} in the table metadata is relative; "
            f"pyiceberg resolves it against the current directory ({os.getcwd()}), and "
            f"{path} does not exist. Run from the directory the table's locations are "
            "relative to, or rewrite the table metadata with absolute locations")


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
    return DataFile(_location(file.file_path), file.file_size_in_bytes,
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
