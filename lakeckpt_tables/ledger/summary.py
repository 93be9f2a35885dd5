"""Per-file consumption summaries: what ``progress`` reads instead of every consumption row.

NOTE [ consumption summaries ]
A ledger of 100,000 checkpoints holds 6.4 million consumption rows; summing them for every
``progress`` query takes seconds. Progress needs only per-checkpoint totals, so when the ledger
is compacted (``lakeckpt maintain``) the compacted data file gets a *summary*: one row per
(run, checkpoint, segment, epoch) with the rows and records consumed, written beside it as
``_lakeckpt_summary/<data file name>``. Data files are immutable, so a summary stays right
for as long as its data file is live; a reader takes the summary of every live file that has
one and sums the rows of the others (the few commits since the last maintain). A summary is
derived data: one that is missing, unreadable or not about its file (name and size are
stamped in its metadata) is ignored and the file's rows are summed instead. The directory
starts with ``_`` so Delta's VACUUM leaves it alone; ``gc`` removes summaries of files that are
no longer live.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq

from lakeckpt_tables.ledger import schema as s

__all__ = ["SUMMARY_DIR", "SUMMARY_SCHEMA", "consumed", "read_summary", "summarize",
           "summary_path", "write_summary"]

SUMMARY_DIR: Final = "_lakeckpt_summary"
"""Directory, inside the ledger table, holding one summary per compacted data file."""

SUMMARY_SCHEMA: Final = pa.schema([
    (s.RUN_ID, pa.string()), (s.CHECKPOINT_ID, pa.string()), (s.STEP, pa.int64()),
    (s.SOURCE_KEY, pa.string()), (s.SEGMENT, pa.int64()), (s.EPOCH, pa.int64()),
    (s.COMMITTED_AT, pa.timestamp("us", tz="UTC")), ("records", pa.int64()), (s.ROWS, pa.int64()),
    (s.TOKENS, pa.int64()),
])
"""Consumption totals per (run, checkpoint, step, source key, segment, epoch); ``tokens`` null
for readers of rows. A summary written before ``source_key`` or ``tokens`` has another schema
and is not used (its file's rows are summed)."""

_KEYS = (s.RUN_ID, s.CHECKPOINT_ID, s.STEP, s.SOURCE_KEY, s.SEGMENT, s.EPOCH)
_OF_FILE = b"lakeckpt.summary.of"
_OF_BYTES = b"lakeckpt.summary.bytes"


def summarize(rows: pa.Table) -> pa.Table:
    """The consumption totals of ledger rows (rows of other kinds are ignored).

    Args:
        rows: ledger rows with at least the summary's key columns, ``record``, ``rows``,
            ``tokens`` and ``committed_at``.

    Returns:
        A table in :data:`SUMMARY_SCHEMA`.
    """
    if s.RECORD in rows.column_names:
        rows = rows.filter(pc.field(s.RECORD) == s.RECORD_CONSUMPTION)
    if not rows.num_rows:
        return SUMMARY_SCHEMA.empty_table()
    grouped = rows.select([*_KEYS, s.COMMITTED_AT, s.ROWS, s.TOKENS]).group_by(
        list(_KEYS), use_threads=False).aggregate(
        [(s.COMMITTED_AT, "min"), (s.ROWS, "count"), (s.ROWS, "sum"), (s.TOKENS, "sum")])
    return pa.table({
        **{k: grouped[k] for k in _KEYS},
        s.COMMITTED_AT: grouped[f"{s.COMMITTED_AT}_min"],
        "records": grouped[f"{s.ROWS}_count"], s.ROWS: grouped[f"{s.ROWS}_sum"],
        s.TOKENS: grouped[f"{s.TOKENS}_sum"],
    }).cast(SUMMARY_SCHEMA)


def summary_path(base: str, data_file: str) -> str:
    """Where the summary of ``data_file`` (a path relative to the table) lives."""
    name = data_file.rsplit("/", 1)[-1]
    return f"{base}/{SUMMARY_DIR}/{name}" if base else f"{SUMMARY_DIR}/{name}"


def write_summary(fs: pa_fs.FileSystem, base: str, data_file: str, size: int,
                  summary: pa.Table) -> None:
    """Write the summary of ``data_file`` (``size`` bytes) beside the table's data.

    Raises:
        OSError: it could not be written (the caller may go on without it).
    """
    where = summary_path(base, data_file)
    fs.create_dir(where.rsplit("/", 1)[0], recursive=True)
    stamped = summary.replace_schema_metadata({
        _OF_FILE: data_file.rsplit("/", 1)[-1].encode(), _OF_BYTES: str(size).encode()})
    pq.write_table(stamped, where, filesystem=fs, write_page_checksum=True)


def read_summary(fs: pa_fs.FileSystem, base: str, data_file: str, size: int) -> pa.Table | None:
    """The summary of ``data_file`` if one was written for exactly that file, else None."""
    where = summary_path(base, data_file)
    try:
        table = pq.read_table(where, filesystem=fs, page_checksum_verification=True)
    except (OSError, pa.ArrowException):
        return None  # missing or damaged: derived data, the caller sums the rows instead
    meta = table.schema.metadata or {}
    if meta.get(_OF_FILE) != data_file.rsplit("/", 1)[-1].encode() or \
            meta.get(_OF_BYTES) != str(size).encode() or \
            not table.schema.remove_metadata().equals(SUMMARY_SCHEMA):
        return None
    return table.replace_schema_metadata(None)


SUMMED_COLUMNS: Final = tuple(c for c in SUMMARY_SCHEMA.names if c in s.LEDGER_SCHEMA.names)
"""The columns of consumption rows :func:`summarize` needs: the summary's own."""


def consumed(files: Iterable[tuple[str, int]],
             summary_of: Callable[[str, int], pa.Table | None],
             rows_of: Callable[[list[str], list[str]], pa.Table]) -> pa.Table:
    """Consumption totals of a ledger's live data files, in :data:`SUMMARY_SCHEMA`: each
    file's summary where ``maintain`` wrote one, else summed from its rows.

    Args:
        files: the live data files, (path, size in bytes).
        summary_of: the summary of one file, None if it has no valid one.
        rows_of: the consumption rows of these files, with these columns.
    """
    parts, unsummarized = [], []
    for path, size in files:
        summary = summary_of(path, size)
        if summary is None:
            unsummarized.append(path)
        else:
            parts.append(summary)
    if unsummarized:
        parts.append(summarize(rows_of(unsummarized, list(SUMMED_COLUMNS))))
    return pa.concat_tables(parts) if parts else SUMMARY_SCHEMA.empty_table()
