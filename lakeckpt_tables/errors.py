"""Every error lakeckpt-tables raises on purpose.

One root, :class:`LakeckptError`, and a handful of subclasses, each saying what is wrong and
what to do. Messages name the table, version, file or run involved.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "CheckpointIntegrityError",
    "CheckpointWriteError",
    "CommitConflictError",
    "CommitStateUnknownError",
    "EmptySourceError",
    "LakeckptError",
    "LedgerCorruptError",
    "LedgerError",
    "PinnedFileMissingError",
    "RowCountMismatchError",
    "RunFencedError",
    "SourceChangedError",
    "SourceNotFoundError",
    "StateMismatchError",
    "UnknownColumnError",
    "UnsupportedTableError",
]


class LakeckptError(Exception):
    """Root of all errors raised by lakeckpt-tables."""


class SourceNotFoundError(LakeckptError):
    """The table (path, URI or catalog identifier) or the version asked for does not exist."""


class UnsupportedTableError(LakeckptError):
    """The table uses a feature whose rows cannot be read correctly from data files alone."""


class EmptySourceError(LakeckptError):
    """The pinned snapshot holds no rows, so there is nothing to train on."""


class UnknownColumnError(LakeckptError):
    """A requested column is not in the table's schema."""


class RowCountMismatchError(LakeckptError):
    """Table metadata and a data file's Parquet footer disagree on how many rows the file holds."""


class PinnedFileMissingError(LakeckptError):
    """A data file of the pinned snapshot is gone (vacuum, snapshot expiry)."""


class SourceChangedError(LakeckptError):
    """A followed table committed what the reader cannot honour (a delete, an overwrite, a
    schema change) under the chosen policy."""


class StateMismatchError(LakeckptError):
    """Reader state belongs to another table, run configuration or format version, or is corrupt."""


class LedgerError(LakeckptError):
    """The ledger table is missing, of another format version, or inconsistent."""


class CommitConflictError(LedgerError):
    """Another writer committed first (e.g. the same run and step); nothing of ours landed."""


class CommitStateUnknownError(LedgerError):
    """The ledger commit may or may not have landed; check the ledger before retrying."""


class CheckpointError(LakeckptError):
    """A checkpoint could not be saved or restored."""


class CheckpointIntegrityError(CheckpointError):
    """A checkpoint's files do not match the checksums recorded in the ledger."""


class RunFencedError(CommitConflictError):
    """Another job restored (took over) the run: this job may no longer commit to it."""


class LedgerCorruptError(LedgerError):
    """A ledger file is missing, truncated or damaged, or a record fails its checksum."""


class CheckpointWriteError(CheckpointError):
    """Writing a checkpoint's files failed (disk full, permissions...); nothing was committed."""
