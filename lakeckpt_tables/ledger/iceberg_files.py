"""The Iceberg ledger's data files, read lazily: what audits read instead of the whole table.

``progress`` and ``verify`` on a ledger of a million records must not load every row
(issue 23): like a Delta ledger's, an Iceberg ledger's snapshot is scanned as a lazy dataset
over its live data files (a compacted ledger is sorted by record kind, run and step, so a
filtered read skips the rest by row-group statistics), and per-checkpoint consumption totals
come from the summaries a compaction writes beside its files (NOTE [ consumption summaries ]),
here under the table's location. The event rows read are kept by snapshot (:class:`EventRows`),
and the snapshots' lineage and the files that cannot be read are found here too.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pa_ds
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq
from pyiceberg.expressions import EqualTo, Reference
from pyiceberg.expressions.literals import literal
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation, Snapshot

from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.ledger.summary import (
    SUMMARY_DIR,
    consumed,
    read_summary,
    summary_path,
    write_summary,
)

__all__ = ["ORPHAN_GRACE_HOURS", "EventRows", "IcebergFiles", "IcebergUpkeep", "lineage",
           "snapshot_files", "unreadable"]

ORPHAN_GRACE_HOURS = 24
"""Files younger than this are kept whatever they are: a commit may be writing them."""

_SWEPT = ("data", "metadata", SUMMARY_DIR)
"""The folders of the table's location the sweep looks in (the table's own, nothing else)."""


def snapshot_files(table: Table, snapshot_id: int) -> list[tuple[str, int]] | None:
    """The live data files of a snapshot, (location, bytes); None when its rows are more than
    its data files (delete files), which only pyiceberg's own scan reads right."""
    out = []
    for task in table.scan(snapshot_id=snapshot_id).plan_files():
        if task.delete_files:
            return None
        out.append((task.file.file_path, int(task.file.file_size_in_bytes)))
    return out


def lineage(metadata: TableMetadata) -> Iterator[Snapshot]:
    """The current snapshot, then its parents, newest first, until one is missing (expired).

    Walks an id index: pyiceberg's ``ancestors_of`` scans the snapshot list at every step.
    """
    by_id = {snapshot.snapshot_id: snapshot for snapshot in metadata.snapshots}
    snapshot_id = metadata.current_snapshot_id
    while snapshot_id is not None and (snapshot := by_id.get(snapshot_id)) is not None:
        yield snapshot
        snapshot_id = snapshot.parent_snapshot_id


class EventRows:
    """The event rows of an Iceberg ledger as of the last snapshot read (NOTE [ event rows
    kept ] in ``ledger/reads.py``): when only appends were committed since, a read scans just
    the data files they added (an incremental append scan plans only their manifests);
    after any other commit (compaction, repair, expired history) the whole table again."""

    def __init__(self) -> None:
        self._snapshot: int | None = None
        self._rows = s.LEDGER_SCHEMA.empty_table()

    def rows(self, table: Table) -> pa.Table:
        """Every event row of the table's current snapshot.

        Raises:
            OSError, pyarrow.ArrowException, ValueError: a file cannot be read.
        """
        current = table.metadata.current_snapshot_id
        if current == self._snapshot:
            return self._rows
        where = EqualTo(Reference(s.RECORD), literal(s.RECORD_EVENT))
        if current is None:
            rows = s.LEDGER_SCHEMA.empty_table()
        elif self._snapshot is not None and _appends_since(table.metadata, self._snapshot):
            added = table.incremental_append_scan(from_snapshot_id_exclusive=self._snapshot,
                                                  to_snapshot_id_inclusive=current,
                                                  row_filter=where).to_arrow()
            rows = pa.concat_tables([self._rows, _conformed(added)])
        else:
            rows = _conformed(table.scan(row_filter=where).to_arrow())
        self._snapshot, self._rows = current, rows
        return rows


def _appends_since(metadata: TableMetadata, snapshot_id: int) -> bool:
    """Whether ``snapshot_id`` is an ancestor of the current snapshot and every commit after it
    an append (which adds data files and removes none)."""
    for snapshot in lineage(metadata):
        if snapshot.snapshot_id == snapshot_id:
            return True
        if snapshot.summary is None or snapshot.summary.operation != Operation.APPEND:
            return False
    return False


def _conformed(rows: pa.Table) -> pa.Table:
    return rows.select(s.LEDGER_SCHEMA.names).cast(s.LEDGER_SCHEMA)


def unreadable(table: Table) -> list[tuple[str, Exception]]:
    """The live data files that cannot be read whole (missing, truncated, damaged)."""
    out: list[tuple[str, Exception]] = []
    for task in table.scan().plan_files():
        path = task.file.file_path
        try:
            with table.io.new_input(path).open() as stream:
                rows = pq.read_table(pa.BufferReader(stream.read()))
            rows.select(s.LEDGER_SCHEMA.names).cast(s.LEDGER_SCHEMA)
        except (OSError, pa.ArrowException, ValueError, KeyError) as e:
            out.append((path, e))
    return out


class IcebergFiles:
    """The data files of one Iceberg ledger table as pyarrow reads them: through the
    table's FileIO's filesystem (None from :meth:`of` when that FileIO is not pyarrow's)."""

    def __init__(self, fs: pa_fs.FileSystem, io: PyArrowFileIO, base: str) -> None:
        self._fs, self._io, self._base = fs, io, base

    @classmethod
    def of(cls, table: Table) -> IcebergFiles | None:
        io = table.io
        if not isinstance(io, PyArrowFileIO):
            return None
        scheme, netloc, base = io.parse_location(table.location(), io.properties)
        return cls(io.fs_by_scheme(scheme, netloc), io, base.rstrip("/"))

    @property
    def fs(self) -> pa_fs.FileSystem:
        """The filesystem the table's files are read with."""
        return self._fs

    @property
    def base(self) -> str:
        """The table's location, as :attr:`fs` names it."""
        return self._base

    def path(self, location: str) -> str:
        """A data file's location as the filesystem names it."""
        return self._io.parse_location(location, self._io.properties)[2]

    def dataset(self, files: list[tuple[str, int]]) -> pa_ds.Dataset:
        """A lazy dataset over these data files, in :data:`LEDGER_SCHEMA`."""
        return pa_ds.dataset([self.path(f) for f, _ in files], schema=s.LEDGER_SCHEMA,
                             filesystem=self._fs, format="parquet")

    def consumed(self, files: list[tuple[str, int]]) -> pa.Table:
        """Per-checkpoint consumption totals of these data files (``SUMMARY_SCHEMA``)."""
        by_path = {self.path(f): f for f, _ in files}

        def rows_of(paths: list[str], columns: list[str]) -> pa.Table:
            return self.dataset([(by_path[p], 0) for p in paths]).to_table(
                columns=columns, filter=pc.field(s.RECORD) == s.RECORD_CONSUMPTION)

        return consumed([(self.path(f), size) for f, size in files],
                        lambda path, size: read_summary(self._fs, self._base,
                                                        self.relative(path), size), rows_of)

    def summarize(self, location: str, size: int, summary: pa.Table) -> None:
        """Write the consumption summary of a compacted data file.

        Raises:
            OSError: it could not be written (the caller may go on without it).
        """
        write_summary(self._fs, self._base, self.relative(self.path(location)), size,
                      summary)

    def relative(self, path: str) -> str:
        """A path of :attr:`fs` relative to the table's location."""
        return path[len(self._base) + 1:] if path.startswith(self._base + "/") else path


class IcebergUpkeep:
    """Removal of an Iceberg ledger's unreferenced files (a mixin of
    :class:`~lakeckpt_tables.ledger.IcebergLedger`)."""

    _table: Table
    _lock: threading.RLock

    def _refresh(self) -> None:
        raise NotImplementedError

    def remove_orphans(self, *, older_than_hours: int = ORPHAN_GRACE_HOURS,
                       dry_run: bool = False) -> list[str]:
        """Remove the files under the table's location that no snapshot it keeps names: data
        files a compaction replaced (the snapshots that named them expired) and their
        summaries, a crashed commit's files, manifests of expired snapshots. Metadata files
        the log names, and files younger than ``older_than_hours`` (a commit may be writing
        them), are kept.

        Returns:
            The removed files, relative to the table's location (empty when the table's
            FileIO is not pyarrow's: nothing is removed then).
        """
        with self._lock:
            self._refresh()
            files = IcebergFiles.of(self._table)
            if files is None:
                return []
            kept = {files.path(location) for location in _referenced(self._table)}
        kept |= {summary_path(files.base, files.relative(path)) for path in kept}
        cutoff = time.time() - older_than_hours * 3600
        removed = []
        for folder in _SWEPT:
            selector = pa_fs.FileSelector(f"{files.base}/{folder}", recursive=True,
                                          allow_not_found=True)
            for info in files.fs.get_file_info(selector):
                if (info.type == pa_fs.FileType.File and info.path not in kept
                        and info.mtime is not None and info.mtime.timestamp() <= cutoff):
                    removed.append(info.path)
        for path in removed if not dry_run else ():
            with contextlib.suppress(FileNotFoundError):
                files.fs.delete_file(path)
        return sorted(files.relative(path) for path in removed)


def _referenced(table: Table) -> set[str]:
    """Every file the table's metadata names: its metadata files, and each kept snapshot's
    manifest list, manifests and live data and delete files (an entry marked deleted names a
    file of an older snapshot: reachable only while that one is kept)."""
    meta = table.metadata
    names = {table.metadata_location, *(entry.metadata_file for entry in meta.metadata_log)}
    for snapshot in meta.snapshots:
        names.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            names.add(manifest.manifest_path)
            names.update(entry.data_file.file_path for entry in
                         manifest.fetch_manifest_entry(table.io, discard_deleted=True))
    return names
