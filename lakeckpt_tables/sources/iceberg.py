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

from lakeckpt_tables.errors import SourceChangedError, SourceNotFoundError, UnsupportedTableError
from lakeckpt_tables.io import iceberg_storage
from lakeckpt_tables.sources.base import (
    DataFile,
    RowGroupReader,
    Snapshot,
    local_path_or_uri,
    units_from_files,
)
from lakeckpt_tables.sources.commits import Commit, column_change
from lakeckpt_tables.types import TableIdentity

__all__ = ["DEFAULT_CATALOG_NAME", "IcebergSource", "default_catalog"]

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
            UnsupportedTableError: the snapshot has delete files.
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
            return Snapshot(identity, -1, table.schema().as_arrow(), (), {})
        pinned = int(snap_meta.snapshot_id)
        files = self._data_files(table, identity, pinned)
        storage = iceberg_storage(table.metadata.location, table.io.properties)
        units, columns = units_from_files(identity, pinned, files, storage)
        schema = _snapshot_schema(table, snap_meta)
        snap = Snapshot(identity, pinned, schema, units, columns,
                        _column_types(table, snap_meta.schema_id),
                        RowGroupReader(identity, pinned, storage))
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
        files = []
        for task in scan.plan_files():
            if task.delete_files:
                return Commit(sid, "change", operation, detail="adds delete files")
            files.append(DataFile(local_path_or_uri(task.file.file_path),
                                  task.file.file_size_in_bytes, task.file.record_count))
        return Commit(sid, "append", operation, tuple(files))

    def is_after(self, version: int, until: int) -> bool:
        """Snapshot ids are not ordered; only reaching ``until`` itself ends a follow."""
        return False

    def _data_files(self, table: Any, identity: TableIdentity, pinned: int) -> list[DataFile]:
        files = []
        for task in table.scan(snapshot_id=pinned).plan_files():
            if task.delete_files:
                raise UnsupportedTableError(
                    f"{identity.describe()} at snapshot {pinned}: data file {task.file.file_path} "
                    f"has {len(task.delete_files)} delete file(s) (merge-on-read deletes). "
                    "Rewrite the data files (copy-on-write compaction) before training from it."
                )
            files.append(DataFile(local_path_or_uri(task.file.file_path),
                                  task.file.file_size_in_bytes, task.file.record_count))
        return files


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
