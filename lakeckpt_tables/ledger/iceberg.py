"""The ledger as an Iceberg table in a catalog (one ledger per catalog namespace).

A commit is one pyiceberg append whose snapshot summary names the run, step and checkpoint.
The check that the step is new and the append are kept atomic by a table requirement that the
catalog validates under its compare-and-swap of the metadata pointer: see
NOTE [ ledger commit protocol ] in :mod:`lakeckpt_tables.ledger.base` and
NOTE [ iceberg run requirement ] below.

Only catalogs that validate requirements in-process work (pyiceberg's SQL, Hive, Glue...
catalogs, all through ``Catalog._update_and_stage_table``); a REST catalog would have to
serialise the custom requirement and cannot.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    CommitStateUnknownException,
    NoSuchNamespaceError,
    NoSuchTableError,
    ValidationException,
)
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThanOrEqual,
    LessThanOrEqual,
    Reference,
)
from pyiceberg.expressions.literals import literal
from pyiceberg.io.pyarrow import _dataframe_to_data_files
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import ValidatableTableRequirement
from pyiceberg.types import LongType, StringType
from sqlalchemy.exc import SQLAlchemyError

from lakeckpt_tables.errors import CommitConflictError, LedgerCorruptError, LedgerError
from lakeckpt_tables.io import Storage
from lakeckpt_tables.io.memory import COMMIT_POOL
from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.ledger.base import LedgerBase, outcome_unknown
from lakeckpt_tables.ledger.compaction import ORDER, Slice, fragmented, sorted_files
from lakeckpt_tables.ledger.iceberg_files import (
    EventRows,
    IcebergFiles,
    IcebergUpkeep,
    lineage,
    unreadable,
)
from lakeckpt_tables.ledger.records import CheckpointRecord, few_rows_first
from lakeckpt_tables.ledger.spec import LedgerSpec
from lakeckpt_tables.ledger.summary import summarize

__all__ = ["IcebergLedger", "with_store"]

RUN_PROPERTY = "lakeckpt.run"
"""Snapshot summary key naming the run of a checkpoint commit."""
STEP_PROPERTY = "lakeckpt.step"
"""Snapshot summary key holding the step of a checkpoint commit."""
CHECKPOINT_PROPERTY = "lakeckpt.checkpoint"
"""Snapshot summary key holding the checkpoint id of a checkpoint commit."""
OWNER_PROPERTY = "lakeckpt.owner"
"""Snapshot summary key naming the job that owns the run after a claim or owned commit."""
EVENTS_PROPERTY = "lakeckpt.events"
"""Snapshot summary key naming the run of an events-only commit (deliberately not RUN_PROPERTY:
events never conflict with checkpoints)."""
COMPACTION_PROPERTY = "lakeckpt.compaction"
"""Snapshot summary key marking the rewrite made by :meth:`IcebergLedger.compact`."""
REPAIR_PROPERTY = "lakeckpt.repair"
"""Snapshot summary key marking the commit of :meth:`IcebergLedger.repair`."""

# Errors after which an Iceberg commit certainly did not land (pyiceberg itself deletes the
# commit's manifests on these, and only on these).
_NOT_LANDED = (CommitFailedException, ValidationException)
# Errors after which nobody knows: the catalog may have swapped the pointer.
_UNKNOWN = (CommitStateUnknownException, SQLAlchemyError, OSError)


class _AssertNoCommitSince(ValidatableTableRequirement):
    """Table requirement: nothing (of one run, if given) was committed after a snapshot.

    NOTE [ iceberg run requirement ]
    pyiceberg retries a commit that lost the compare-and-swap by rebasing it onto the new
    snapshot, and on a retry it drops the ``AssertRefSnapshotId`` requirement the append
    carried. A check made against the old snapshot would then be silently bypassed, and two
    committers of one run could both land. This requirement is kept across retries and is
    validated by the catalog against the metadata it swaps from, so an append of another run
    is still rebased while one of the same run fails with ``ValidationException`` (which
    pyiceberg does not retry).
    """

    type: Literal["lakeckpt-assert-no-commit-since"] = Field(
        default="lakeckpt-assert-no-commit-since"
    )
    snapshot_id: int | None
    run_id: str | None = None

    # pydantic's BaseModel has a deprecated classmethod of the same name; pyiceberg's own
    # requirements shadow it the same way.
    def validate(self, base_metadata: TableMetadata | None) -> None:  # type: ignore[override]
        """Raise ValidationException if the lineage since ``snapshot_id`` holds a rival commit."""
        if base_metadata is None:
            raise ValidationException("Requirement failed: the ledger table is gone")
        for snapshot in lineage(base_metadata):
            if snapshot.snapshot_id == self.snapshot_id:
                return
            if self.run_id is None or _summary(snapshot, RUN_PROPERTY) == self.run_id:
                raise ValidationException(
                    f"Requirement failed: expected no commit of run {self.run_id!r} after "
                    f"snapshot {self.snapshot_id}, found snapshot {snapshot.snapshot_id} "
                    f"(step {_summary(snapshot, STEP_PROPERTY)})"
                )
        if self.snapshot_id is not None:
            raise ValidationException(
                f"Requirement failed: snapshot {self.snapshot_id} is no longer in the history"
            )


class IcebergLedger(IcebergUpkeep, LedgerBase[list[DataFile]]):
    """A ledger kept in an Iceberg table, created (with its namespace) on first use.

    Args:
        identifier: ``namespace.table``.
        catalog: the pyiceberg catalog holding it (a ``SqlCatalog`` on SQLite or PostgreSQL).
        storage: the store of the table's warehouse, whose options configure the FileIO
            that reads and writes the ledger's files and metadata (NOTE [ iceberg ledger
            store ]); None: the catalog's own properties do.

    Raises:
        LedgerError: the identifier has no namespace, or names a table that is not a ledger
            or is a ledger of another format version.
    """

    def __init__(self, identifier: str, *, catalog: Catalog,
                 storage: Storage | None = None) -> None:
        super().__init__()
        self._identifier = identifier
        self._catalog = with_store(catalog, storage)
        self._table = _open_or_create(self._catalog, identifier, self.describe())
        _check_format(self._table, self.describe())
        self._table = _add_columns(self._table)
        self._events = EventRows()  # NOTE [ event rows kept ] in ledger/delta_files.py

    def describe(self) -> str:
        """Where the ledger lives, for error messages."""
        return f"iceberg:{self._identifier} (catalog {self._catalog.name})"

    @property
    def spec(self) -> LedgerSpec:
        """Where the ledger lives, as a value."""
        return LedgerSpec("iceberg", self._identifier, self._catalog.name)

    def compact(self) -> None:
        """Rewrite the data files into few large ones (in bounded memory, each with its
        consumption summary: :mod:`~lakeckpt_tables.ledger.compaction`), then expire the
        snapshots before the rewrite. A ledger already compacted is not rewritten.

        pyiceberg has no rewrite-data-files action, so the rewrite is an overwrite that
        deletes exactly the files it read, guarded so that it fails rather than drop a row
        committed meanwhile. Expiring the older snapshots keeps the metadata file, which every
        commit rewrites, from growing with every checkpoint ever made; it drops their
        summaries, so the next commit of each run settles against the data instead. The
        replaced files stay on disk for orphan-file maintenance.

        Raises:
            CommitConflictError: a concurrent commit landed during the rewrite; nothing was
                changed, and compacting again later will do.
        """
        with self._lock:
            self._refresh()
            current = self._table.current_snapshot()
            if current is None:
                return
            old_files = [task.file for task in self._table.scan().plan_files()]
            if fragmented([f.record_count for f in old_files]):
                self._rewrite(current.snapshot_id, old_files)
                current = self._table.current_snapshot()
            if current is not None:
                cutoff = datetime.fromtimestamp(current.timestamp_ms / 1000, UTC)
                self._table.maintenance.expire_snapshots().older_than(cutoff).commit()

    def _refresh(self) -> None:
        self._table.refresh()

    def _select(self, equal: Mapping[str, str]) -> pa.Table:
        conditions: list[BooleanExpression] = [
            EqualTo(term=Reference(name), value=literal(v)) for name, v in equal.items()]
        where = functools.reduce(And, conditions) if conditions else AlwaysTrue()
        try:
            rows = self._table.scan(row_filter=where).to_arrow()
            # a null where the schema allows none is damage too (a flipped bit)
            return rows.select(s.LEDGER_SCHEMA.names).cast(s.LEDGER_SCHEMA)
        except (OSError, pa.ArrowException, ValueError) as e:
            raise self._damaged(e) from e

    def _event_rows(self) -> pa.Table:
        """Every event row of the current snapshot, kept by snapshot (:class:`EventRows`)."""
        try:
            return self._events.rows(self._table)
        except (OSError, pa.ArrowException, ValueError) as e:
            raise self._damaged(e) from e

    def _damaged(self, cause: Exception) -> LedgerCorruptError:
        """The named error for a ledger data file that cannot be read, found file by file."""
        for path, e in unreadable(self._table):
            return LedgerCorruptError(
                f"ledger {self.describe()}: data file {path} is missing, truncated or damaged "
                f"({' '.join(str(e).split())}). The way out: keep a copy of the file for "
                f"inspection and run IcebergLedger({self._identifier!r}, catalog=...).repair(), "
                "which drops it from the table; its records are lost, and restore falls back "
                "to the newest checkpoint the ledger still holds", file=path
            )
        return LedgerCorruptError(f"ledger {self.describe()} could not be read: {cause}")

    def repair_missing(self) -> list[str]:
        """:meth:`repair` for data files that no longer exist only; a damaged file that exists
        is kept for inspection."""
        return self.repair(missing_only=True)

    def repair(self, *, missing_only: bool = False) -> list[str]:
        """Drop the data files that cannot be read from the table (the way out of a
        :class:`LedgerCorruptError`): their records are lost, the rest stay.

        Returns:
            The paths dropped (empty when every file reads).

        Raises:
            CommitConflictError: a concurrent commit landed meanwhile; repair again.
        """
        with self._lock:
            self._refresh()
            current = self._table.current_snapshot()
            bad = {path for path, e in unreadable(self._table)
                   if not missing_only or isinstance(e, FileNotFoundError)}
            if current is None or not bad:
                return []
            files = [task.file for task in self._table.scan().plan_files()
                     if task.file.file_path in bad]
            transaction = self._table.transaction()
            _require(transaction, _AssertNoCommitSince(snapshot_id=current.snapshot_id))
            with transaction.update_snapshot(
                    snapshot_properties={REPAIR_PROPERTY: "true"}).overwrite() as rewrite:
                for data_file in files:
                    rewrite.delete_data_file(data_file)
            try:
                transaction.commit_transaction()
            except _NOT_LANDED as e:
                raise CommitConflictError(
                    f"ledger {self.describe()}: repair lost to a concurrent commit and changed "
                    f"nothing; repair again ({e})") from e
            return sorted(bad)

    def _sorted_files(self, snapshot_id: int) -> list[DataFile]:
        """The snapshot's rows rewritten in bounded memory (:mod:`~lakeckpt_tables.ledger.
        compaction`), each new file with its consumption summary where one file holds a whole
        part (NOTE [ consumption summaries ])."""
        files = IcebergFiles.of(self._table)
        written: list[DataFile] = []
        try:
            keys = self._table.scan(selected_fields=ORDER, snapshot_id=snapshot_id).to_arrow()
            for rows in sorted_files(keys, lambda cut: self._table.scan(
                    row_filter=_slice(cut), snapshot_id=snapshot_id).to_arrow()):
                rows = rows.select(s.LEDGER_SCHEMA.names).cast(s.LEDGER_SCHEMA)
                part = _data_files(self._table, rows)
                written += part
                if files is not None and len(part) == 1:
                    with contextlib.suppress(OSError):  # derived data: rows are summed instead
                        files.summarize(part[0].file_path, part[0].file_size_in_bytes,
                                        summarize(rows))
        except BaseException:
            self._discard(written)
            raise
        return written

    def _last_step(self, run_id: str) -> int | None:
        # The newest snapshot summary of the run holds its last step. Without one (a new run,
        # or one whose snapshots compact() expired) the data decides.
        for snapshot in lineage(self._table.metadata):
            if _summary(snapshot, RUN_PROPERTY) == run_id:
                step = int(_summary(snapshot, STEP_PROPERTY) or -1)
                return None if step < 0 else step
        steps = self._read(record=s.RECORD_CHECKPOINT, run_id=run_id)[s.STEP]
        return pc.max(steps).as_py() if len(steps) else None

    def _owner(self, run_id: str) -> str | None:
        # The newest snapshot of the run names its owner; without one (compact() expired
        # them) the newest row of the run that names an owner does.
        for snapshot in lineage(self._table.metadata):
            if _summary(snapshot, RUN_PROPERTY) == run_id:
                return _summary(snapshot, OWNER_PROPERTY)
        rows = self._read(run_id=run_id).filter(pc.field(s.OWNER).is_valid())
        if not len(rows):
            return None
        newest = rows.sort_by([(s.COMMITTED_AT, "descending")])[s.OWNER][0]
        return str(newest.as_py())

    def _prepare(self, rows: pa.Table) -> list[DataFile]:
        """A commit's rows as data files, its checkpoint and events in a file apart (NOTE
        [ few rows first ] in records.py)."""
        written: list[DataFile] = []
        try:
            for part in few_rows_first(rows):
                written += _data_files(self._table, part)
        except BaseException:
            self._discard(written)  # nothing names them
            raise
        return written

    def _publish(
        self,
        prepared: list[DataFile],
        *,
        run_id: str,
        checkpoint: CheckpointRecord | None,
        owner: str | None = None,
    ) -> bool:
        transaction = self._table.transaction()
        if checkpoint is None and owner is None:
            summary = {EVENTS_PROPERTY: run_id}
        else:
            since = self._table.metadata.current_snapshot_id
            _require(transaction, _AssertNoCommitSince(snapshot_id=since, run_id=run_id))
            if checkpoint is not None:
                summary = _checkpoint_summary(checkpoint)
            else:  # a claim: a commit of the run that keeps its last step
                last = self._last_step(run_id)
                summary = {RUN_PROPERTY: run_id, STEP_PROPERTY: str(-1 if last is None else last)}
            if owner is not None:
                summary[OWNER_PROPERTY] = owner
        with transaction.update_snapshot(snapshot_properties=summary).fast_append() as append:
            for data_file in prepared:
                append.append_data_file(data_file)
        try:
            transaction.commit_transaction()
        except _NOT_LANDED:
            return False
        except _UNKNOWN as e:
            raise outcome_unknown(self.describe(), run_id, checkpoint, e) from e
        return True

    def _discard(self, prepared: list[DataFile]) -> None:
        for data_file in prepared:
            # A file we fail to delete is an orphan, which maintenance removes.
            with contextlib.suppress(OSError):
                self._table.io.delete(data_file.file_path)

    def _rewrite(self, snapshot_id: int, old_files: list[DataFile]) -> None:
        new_files = self._sorted_files(snapshot_id)
        transaction = self._table.transaction()
        _require(transaction, _AssertNoCommitSince(snapshot_id=snapshot_id))
        summary = {COMPACTION_PROPERTY: "true"}
        with transaction.update_snapshot(snapshot_properties=summary).overwrite() as rewrite:
            for data_file in old_files:
                rewrite.delete_data_file(data_file)
            for data_file in new_files:
                rewrite.append_data_file(data_file)
        try:
            transaction.commit_transaction()
        except _NOT_LANDED as e:
            self._discard(new_files)
            raise CommitConflictError(
                f"ledger {self.describe()}: compaction lost to a concurrent commit and changed "
                f"nothing; compact again later ({e})"
            ) from e


def with_store(catalog: Catalog, storage: Storage | None) -> Catalog:
    """The catalog, its FileIO configured by ``storage``'s options.

    NOTE [ iceberg ledger store ]
    One store, one set of options (issue 22): a run's storage options reach the Iceberg
    ledger as they reach the Delta one. pyiceberg reads and writes a table's metadata through
    its catalog's FileIO and the data files and manifests through the table's, both built from
    the catalog's properties, so the ledger gets a copy of the catalog whose properties are
    the storage's options as FileIO properties (``s3.endpoint``, ``s3.access-key-id``...) over
    the catalog's own. The catalog given is left as it is. A local store, or one without
    options, leaves the catalog's properties alone.
    """
    if storage is None or storage.is_local or not storage.has_options:
        return catalog
    properties = {**catalog.properties, **storage.iceberg_properties()}
    return type(catalog)(catalog.name, **properties)


def _data_files(table: Table, rows: pa.Table) -> list[DataFile]:
    """``rows`` written as data files of ``table``, which no snapshot names yet.

    Written here rather than by Table.append so that the files are known to us: pyiceberg
    deletes the manifests of a failed commit but leaves its data files behind. Its writer
    converts the rows a record batch at a time, in Python: the sealed rows of 256 ranks are 256
    chunks (283 ms for 262,000 rows), one chunk after a copy (128 ms).
    """
    rows = rows.combine_chunks(memory_pool=COMMIT_POOL)  # NOTE [ commit memory ]
    return list(_dataframe_to_data_files(table_metadata=table.metadata, df=rows, io=table.io))


def _slice(cut: Slice) -> BooleanExpression:
    record, run_id, first, last = cut
    return And(EqualTo(s.RECORD, record), EqualTo(s.RUN_ID, run_id),
               GreaterThanOrEqual(s.STEP, first), LessThanOrEqual(s.STEP, last))


def _open_or_create(catalog: Catalog, identifier: str, where: str) -> Table:
    namespace = Catalog.namespace_from(identifier)
    if not namespace:
        raise LedgerError(f"ledger {where}: the identifier needs a namespace, e.g. 'ml.ledger'")
    # loaded first: creating needs a warehouse location, which a catalog opened only to reach
    # an existing ledger (``lakeckpt maintain --catalog sqlite:///...``) need not have
    with contextlib.suppress(NoSuchTableError, NoSuchNamespaceError):
        return catalog.load_table(identifier)
    catalog.create_namespace_if_not_exists(namespace)
    return catalog.create_table_if_not_exists(
        identifier,
        schema=s.LEDGER_SCHEMA,
        properties={s.FORMAT_PROPERTY: str(s.LEDGER_FORMAT_VERSION)},
    )


def _add_columns(table: Table) -> Table:
    """A ledger created before :data:`~lakeckpt_tables.ledger.schema.ADDED_COLUMNS` gains them
    (optional columns; older rows read them as null)."""
    have = set(table.schema().column_names)
    missing = [name for name in s.ADDED_COLUMNS if name not in have]
    if not missing:
        return table
    try:
        with table.update_schema() as update:
            for name in missing:
                int64 = pa.types.is_int64(s.LEDGER_SCHEMA.field(name).type)
                update.add_column(name, LongType() if int64 else StringType())
    except CommitFailedException:  # another opener added them first
        table.refresh()
    return table


def _check_format(table: Table, where: str) -> None:
    found = table.properties.get(s.FORMAT_PROPERTY)
    if found != str(s.LEDGER_FORMAT_VERSION):
        raise LedgerError(
            f"ledger {where} has format version {found or 'none (not a ledger)'}, "
            f"this lakeckpt-tables reads format version {s.LEDGER_FORMAT_VERSION}"
        )


def _require(transaction: Transaction, requirement: _AssertNoCommitSince) -> None:
    """Add a requirement to a transaction before anything is staged in it.

    pyiceberg has no public way to do this; ``_stage`` is what its own update builders use.
    Its type lists pyiceberg's requirement classes only, hence the ignore.
    """
    transaction._stage((), (requirement,))  # type: ignore[arg-type]


def _checkpoint_summary(record: CheckpointRecord) -> dict[str, str]:
    return {
        RUN_PROPERTY: record.run_id,
        STEP_PROPERTY: str(record.step),
        CHECKPOINT_PROPERTY: record.checkpoint_id,
    }


def _summary(snapshot: Snapshot, key: str) -> str | None:
    return snapshot.summary.get(key) if snapshot.summary is not None else None
