"""Delta Lake tables through deltalake (delta-rs), called in the main process only.

NOTE [ fork safety ]: deltalake's tokio runtime panics in a forked child that uses it after the
parent did, so this module resolves snapshots to plain file paths in the main process and the
DataLoader workers read those files with pyarrow alone.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

import pyarrow as pa

from lakeckpt_tables.errors import SourceNotFoundError, StorageError, UnsupportedTableError
from lakeckpt_tables.io import Storage
from lakeckpt_tables.sources.base import (
    DataFile,
    RowGroupReader,
    Snapshot,
    local_path_or_uri,
    units_from_files,
)
from lakeckpt_tables.sources.commits import Commit, read_delta_commit
from lakeckpt_tables.types import TableIdentity

__all__ = ["DeltaSource"]

_COLUMN_MAPPING_KEY = "delta.columnMapping.mode"
_DV_FEATURE = "deletionVectors"


class DeltaSource:
    """A Delta table, by path or URI.

    Args:
        uri: table root, a local path or a URI delta-rs understands.
        storage_options: for object stores; the log (delta-rs), the data files and follow
            mode's log polling all go through them, and nothing falls back to ``AWS_*``
            environment variables when they are given (:class:`~lakeckpt_tables.io.Storage`).
    """

    def __init__(self, uri: str, *, storage_options: dict[str, str] | None = None) -> None:
        self.uri = str(uri)
        self.storage_options = dict(storage_options or {})
        self._storage = Storage(self.uri, storage_options or None)
        self._snapshots: dict[int, Snapshot] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"DeltaSource({self.uri!r})"

    def _open(self, version: int | None) -> Any:
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError, TableNotFoundError

        if version is not None and version < 0:  # delta-rs raises OverflowError for these
            raise SourceNotFoundError(f"Delta table {self.uri} has no version {version}: "
                                      "versions start at 0")
        try:
            return DeltaTable(self.uri, version=version,
                              storage_options=self._storage.delta_options())
        except TableNotFoundError as exc:
            raise SourceNotFoundError(
                f"no Delta table at {self.uri}: {exc}. Check the path or URI."
            ) from exc
        except OSError as exc:  # the store failed (delta-rs has retried)
            raise StorageError(
                f"Delta table {self.uri}: the store failed: {self._storage.redact(str(exc))}. "
                "Check the endpoint and credentials in storage_options, then retry") from exc
        except DeltaError as exc:
            if version is None:
                raise
            latest = DeltaTable(self.uri,
                                storage_options=self._storage.delta_options()).version()
            raise SourceNotFoundError(
                f"Delta table {self.uri} has no version {version} (latest is {latest}, "
                f"older ones may be vacuumed): {exc}"
            ) from exc

    def latest_version(self) -> int:
        """The newest committed version."""
        return int(self._open(None).version())

    def snapshot(self, version: int | None = None) -> Snapshot:
        """Pin ``version`` (the latest when None) and list its units.

        Raises:
            SourceNotFoundError: no table at ``uri``, or no such version.
            UnsupportedTableError: deletion vectors, column mapping or partition columns.
            PinnedFileMissingError: a data file of the version is gone.
            RowCountMismatchError: the log and a file footer disagree.
        """
        if version is not None and version in self._snapshots:
            return self._snapshots[version]
        dt = self._open(version)
        pinned = int(dt.version())
        with self._lock:
            if pinned in self._snapshots:
                return self._snapshots[pinned]
        identity = TableIdentity("delta", local_path_or_uri(dt.table_uri), str(dt.metadata().id))
        _refuse_unsupported(dt, identity, pinned)
        files = _data_files(dt, identity.location)
        units, columns = units_from_files(identity, pinned, files, self._storage)
        schema = pa.schema(dt.schema().to_arrow())
        types = {f["name"]: json.dumps(f["type"])
                 for f in json.loads(dt.schema().to_json())["fields"]}
        snap = Snapshot(identity, pinned, schema, units, columns, types,
                        RowGroupReader(identity, pinned, self._storage))
        with self._lock:
            self._snapshots[pinned] = snap
        return snap

    def commit_after(self, version: int, snapshot: Snapshot,
                     columns: Sequence[str]) -> Commit | None:
        """Commit ``version + 1`` from the log JSON (fork-safe: no deltalake); None if absent."""
        return read_delta_commit(snapshot.identity.location, version + 1, list(columns),
                                 snapshot.column_types, self._storage)

    def is_after(self, version: int, until: int) -> bool:
        return version > until


def _data_files(dt: Any, root: str) -> list[DataFile]:
    adds = pa.table(dt.get_add_actions(flatten=True))
    paths = adds.column("path").to_pylist()
    sizes = adds.column("size_bytes").to_pylist()
    rows = adds.column("num_records").to_pylist() if "num_records" in adds.column_names else None
    out = []
    for i, rel in enumerate(paths):
        full = rel if "://" in rel else f"{root}/{unquote(rel)}"
        out.append(DataFile(full, sizes[i], None if rows is None else rows[i]))
    return out


def _refuse_unsupported(dt: Any, identity: TableIdentity, version: int) -> None:
    where = f"{identity.describe()} at version {version}"
    mode = dt.metadata().configuration.get(_COLUMN_MAPPING_KEY, "none")
    if mode not in ("none", None):
        raise UnsupportedTableError(
            f"{where} uses column mapping ({_COLUMN_MAPPING_KEY}={mode}): Parquet column names "
            "differ from the table's, so files cannot be read alone. Rewrite the table without "
            "column mapping."
        )
    features = dt.protocol().reader_features or []
    if _DV_FEATURE in features and _has_deletion_vectors(dt):
        raise UnsupportedTableError(
            f"{where} has deletion vectors: some rows in its data files are deleted. Purge them "
            "(REORG TABLE ... APPLY (PURGE)) before training from it."
        )
    partitions = dt.metadata().partition_columns
    if partitions:
        raise UnsupportedTableError(
            f"{where} is partitioned by {partitions}: partition values are not stored in its "
            "data files. Train from an unpartitioned copy for now."
        )


def _has_deletion_vectors(dt: Any) -> bool:
    adds = pa.table(dt.get_add_actions(flatten=True))
    dv_columns = [c for c in adds.column_names if c.lower().startswith("deletion")]
    return any(adds.column(c).null_count < len(adds) for c in dv_columns)
