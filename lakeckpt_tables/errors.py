"""Every error lakeckpt-tables raises on purpose.

One root, :class:`LakeckptError`, and a handful of subclasses, each saying what is wrong and
what to do. Messages name the table, version, file or run involved.
"""

from __future__ import annotations

__all__ = [
    "STORE_KINDS",
    "AuditError",
    "CallbackMissingError",
    "CheckpointError",
    "CheckpointIntegrityError",
    "CheckpointWriteError",
    "CommitConflictError",
    "CommitStateUnknownError",
    "DataFileError",
    "DataFileStoreError",
    "DeletionUntraceableError",
    "EmptySourceError",
    "EosInDocumentWarning",
    "FilterError",
    "LakeckptError",
    "LedgerCorruptError",
    "LedgerError",
    "LoaderStateLostError",
    "MixtureError",
    "MixtureStateError",
    "NullValuesError",
    "PackingError",
    "PinnedFileMissingError",
    "ProcessGroupError",
    "ResumePathError",
    "RowCountMismatchError",
    "RunFencedError",
    "SharedRendezvousStoreWarning",
    "SourceArgumentError",
    "SourceChangedError",
    "SourceFileChangedError",
    "SourceNotFoundError",
    "StateMismatchError",
    "StorageError",
    "StorageOptionsError",
    "StorageRootNotSharedError",
    "StoreUnavailableError",
    "TableMetadataError",
    "UncommittedCheckpointError",
    "UncommittedCheckpointWarning",
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


class DeletionUntraceableError(SourceChangedError):
    """``deletes="honor"``: which pinned rows the table deleted cannot be told exactly (a
    pinned file rewritten with no ``deletes_key`` naming its rows, a key that is not unique)."""


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


class StorageError(LakeckptError):
    """An object store or file system could not be reached or refused a request.

    Attributes:
        uri: the root or file involved ("" when unknown).
        kind: what went wrong, one of :data:`STORE_KINDS` ("failed" when unclassified).
    """

    def __init__(self, message: str, *, uri: str = "", kind: str = "failed") -> None:
        super().__init__(message)
        self.uri = uri
        self.kind = kind

    def __reduce__(self) -> tuple[object, ...]:  # keeps uri and kind across processes
        return (_rebuild_store_error, (type(self), str(self), self.uri, self.kind))


class StorageRootNotSharedError(CheckpointError):
    """The ranks of a job do not see the same checkpoint root (per-node local disks?)."""


class DataFileError(LakeckptError):
    """A data file of the pinned snapshot cannot be opened, read or converted; the message names
    the table, version, file and, where one is at fault, the column and its physical type."""


class SourceFileChangedError(RowCountMismatchError):
    """A data file's size or row groups differ from the pinned snapshot's record of them: it was
    rewritten or replaced in place, and its rows are not delivered."""


class TableMetadataError(LakeckptError):
    """The table's log, manifests or delete files cannot be read (the message names the table,
    the version and the underlying error)."""


class AuditError(LakeckptError):
    """An audit question cannot be answered as asked: a predicate that is not valid SQL over the
    table's columns, a checkpoint or run the ledger does not hold."""


class NullValuesError(UnsupportedTableError):
    """A selected column holds nulls torch cannot represent, and the null policy refuses them
    (the message names table, version, file, column, type and null count)."""


class FilterError(LakeckptError):
    """A row filter cannot be evaluated on the table (unknown column, not a boolean)."""


class RunFencedError(CommitConflictError):
    """Another job restored (took over) the run: this job may no longer commit to it."""


class LedgerCorruptError(LedgerError):
    """A ledger file is missing, truncated or damaged, or a record fails its checksum.

    ``file`` is the damaged ledger data file when one is to blame (the one to move aside before
    ``repair()``), else None.
    """

    def __init__(self, message: str, *, file: str | None = None) -> None:
        super().__init__(message)
        self.file = file


class CheckpointWriteError(CheckpointError):
    """Writing a checkpoint's files failed (disk full, permissions...); nothing was committed."""


class ResumePathError(StateMismatchError):
    """A resume path cannot honour this reader state; the message names the one that can."""


class ProcessGroupError(LakeckptError):
    """The environment says several ranks but no torch.distributed process group is set up."""


class PackingError(LakeckptError):
    """Packing cannot give fixed-length token sequences as asked: ``seq_len`` below 2, a packing
    column that is not a list of integers, null token lists, a bad ``last`` policy."""


class EosInDocumentWarning(UserWarning):
    """``eos_id`` occurs inside documents, so document ends are ambiguous (warned once per
    process; every occurrence is counted)."""


class MixtureError(LakeckptError):
    """A mixture is not well defined: weights not positive, or naming other sources than the
    mixture has, or an unknown ``on_exhausted`` policy."""


class MixtureStateError(StateMismatchError):
    """A mixture state does not fit this mixture: it names a source the mixture lacks, lacks
    one it has, or a source's table identity changed."""


class SourceArgumentError(LakeckptError, ValueError):
    """A source was given an identifier, path or URI that cannot name a table (the message shows
    the expected form)."""


class CheckpointRestoreError(CheckpointError):
    """A restore cannot proceed (the model or optimizer does not fit the checkpoint, the
    checkpoint asked for is not restorable, a required checkpoint is absent); the message names
    the cause, and nothing was loaded, claimed or recorded."""


class RunInUseError(CheckpointError):
    """Another live job owns the run and the manager was asked to refuse, not fence it
    (``takeover="refuse"``); the message names the owner and how to take over deliberately."""


class UncommittedCheckpointError(CheckpointRestoreError):
    """A resume was asked of a trainer checkpoint the ledger never committed (a crash between
    the trainer's save and the ledger commit, or a save without the integration's callback);
    the message names the committed checkpoint to resume from instead. Nothing was changed."""


class UncommittedCheckpointWarning(UserWarning):
    """Trainer checkpoints newer than the run's last ledger commit are present; they are not
    resumed from (the message names them and the checkpoint resumed)."""


class SharedRendezvousStoreWarning(UserWarning):
    """torchrun's elastic agent restarts workers in place (``--max-restarts`` > 0) with its
    rendezvous store shared with them: torch 2.13's restarted process group can then race for a
    dead worker's address (pytorch/pytorch#135712). Set ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``
    for torchrun."""


class LoaderStateLostError(CheckpointError):
    """The trainer's loader is not the ``StatefulDataLoader`` over a ``LakeDataset`` the
    integration saves the state of (re-wrapped, re-instantiated, or another rank's state
    given): resuming would replay or restart the data. The message names what to change."""


class CallbackMissingError(CheckpointError):
    """A trainer integration's callback is installed on some ranks but not on others: the
    ranks with it would wait for the others in every save's collectives. Raised at the start of
    training, after a bounded wait, naming the ranks without it and the callback to add."""


STORE_KINDS = ("bucket missing", "access denied", "unreachable", "unavailable", "not found",
               "store full", "failed")
"""The kinds of :class:`StorageError`: what a platform engineer acts on."""


class StoreUnavailableError(StorageError):
    """The store kept failing (throttled, 5xx, dropped or stalled connections) for the whole
    retry budget; nothing was committed. Retry once the store is back."""


class StorageOptionsError(StorageError):
    """Storage options cannot be parsed (the message names the problem, never a value)."""


class DataFileStoreError(DataFileError, StorageError):
    """The store failed while a data file of the pinned snapshot was read: both a
    :class:`DataFileError` (names table, version and file) and a :class:`StorageError`
    (carries the URI and the kind)."""

    @classmethod
    def wrap(cls, where: str, path: str, error: StorageError) -> DataFileStoreError:
        """``error`` of the store, said of data file ``path`` of ``where`` (table, version)."""
        return cls(f"{where}: data file {path} cannot be read: {error}",
                   uri=error.uri or path, kind=error.kind)


def _rebuild_store_error(cls: type[StorageError], message: str, uri: str,
                         kind: str) -> StorageError:
    return cls(message, uri=uri, kind=kind)
