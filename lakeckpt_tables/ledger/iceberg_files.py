"""The Iceberg ledger's data files, read lazily: what audits read instead of the whole table.

``progress`` and ``verify`` on a ledger of a million records must not load every row
(issue 23): like a Delta ledger's, an Iceberg ledger's snapshot is scanned as a lazy dataset
over its live data files (a compacted ledger is sorted by record kind, run and step, so a
filtered read skips the rest by row-group statistics), and per-checkpoint consumption totals
come from the summaries a compaction writes beside its files (NOTE [ consumption summaries ]),
here under the table's location.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pa_ds
import pyarrow.fs as pa_fs
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table

from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.ledger.summary import consumed, read_summary, write_summary

__all__ = ["IcebergFiles", "snapshot_files"]


def snapshot_files(table: Table, snapshot_id: int) -> list[tuple[str, int]] | None:
    """The live data files of a snapshot, (location, bytes); None when its rows are more than
    its data files (delete files), which only pyiceberg's own scan reads right."""
    out = []
    for task in table.scan(snapshot_id=snapshot_id).plan_files():
        if task.delete_files:
            return None
        out.append((task.file.file_path, int(task.file.file_size_in_bytes)))
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
                                                        self._relative(path), size), rows_of)

    def summarize(self, location: str, size: int, summary: pa.Table) -> None:
        """Write the consumption summary of a compacted data file.

        Raises:
            OSError: it could not be written (the caller may go on without it).
        """
        write_summary(self._fs, self._base, self._relative(self.path(location)), size,
                      summary)

    def _relative(self, path: str) -> str:
        return path[len(self._base) + 1:] if path.startswith(self._base + "/") else path
