"""Apache Iceberg tables through pyiceberg, called in the main process only."""

from __future__ import annotations

import os
import threading
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import pyarrow as pa

from lakeckpt_tables.errors import SourceNotFoundError, UnsupportedTableError
from lakeckpt_tables.sources.base import DataFile, Snapshot, local_path_or_uri, units_from_files
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
    props.update(Config().get_catalog_config(DEFAULT_CATALOG_NAME) or {})
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
        self._snapshots: dict[int, Snapshot] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"IcebergSource({self.identifier!r})"

    def load_table(self) -> Any:
        """The table's current metadata (main process only)."""
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            return self.catalog.load_table(self.identifier)
        except (NoSuchTableError, NoSuchNamespaceError) as exc:
            raise SourceNotFoundError(
                f"no Iceberg table {self.identifier!r} in catalog {self.catalog.name!r}: {exc}"
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
        if snap_meta is None and version is not None:
            known = [s.snapshot_id for s in table.metadata.snapshots][-5:]
            raise SourceNotFoundError(
                f"{identity.describe()} has no snapshot {version} (expired?); newest ids: {known}"
            )
        if snap_meta is None:  # a table created but never written: empty
            return Snapshot(identity, -1, table.schema().as_arrow(), (), {})
        pinned = int(snap_meta.snapshot_id)
        files = self._data_files(table, identity, pinned)
        units, columns = units_from_files(identity, pinned, files)
        schema = _snapshot_schema(table, snap_meta)
        snap = Snapshot(identity, pinned, schema, units, columns)
        with self._lock:
            self._snapshots[pinned] = snap
        return snap

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


def _snapshot_schema(table: Any, snap_meta: Any) -> pa.Schema:
    schemas = table.schemas()
    schema = schemas.get(snap_meta.schema_id, table.schema())
    arrow: pa.Schema = schema.as_arrow()
    return arrow
