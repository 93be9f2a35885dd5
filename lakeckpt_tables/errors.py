"""Every error lakeckpt-tables raises on purpose.

One root, :class:`LakeckptError`, and a handful of subclasses, each saying what is wrong and
what to do. Messages name the table, version, file or run involved.
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "CheckpointIntegrityError",
    "CommitConflictError",
    "CommitStateUnknownError",
    "EmptySourceError",
    "LakeckptError",
    "LedgerError",
    "PinnedFileMissingError",
    "ProcessGroupError",
    "ResumePathError",
    "RowCountMismatchError",
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


class ResumePathError(StateMismatchError):
    """A resume path cannot honour this reader state; the message names the one that can."""


class ProcessGroupError(LakeckptError):
    """The environment says several ranks but no torch.distributed process group is set up."""
