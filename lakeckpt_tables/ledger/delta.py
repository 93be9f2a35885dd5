"""The ledger as a Delta table (the default: one ledger per checkpoint root).

A commit is the two phases of the checkpoint's 2PC in miniature: the rows are written to a
Parquet file in the table directory first (invisible: no log entry names it), then one log
commit adds that file together with an app transaction ``lakeckpt:<run>`` at version ``step``.
delta-rs refuses to rebase a commit over a concurrent commit carrying the same app id
("Concurrent transaction failed"), which is the condition NOTE [ ledger commit protocol ] in
:mod:`lakeckpt_tables.ledger.base` needs; it rebases blind appends of other runs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import os
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.schema import Field as DeltaField
from deltalake.schema import PrimitiveType
from deltalake.transaction import AddAction, CommitProperties, Transaction

from lakeckpt_tables.errors import (
    LedgerError,
    StorageError,
)
from lakeckpt_tables.io import Storage
from lakeckpt_tables.io.failures import classify, clean, gave_up, store_error
from lakeckpt_tables.io.memory import COMMIT_POOL
from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.ledger.base import LedgerBase, outcome_unknown
from lakeckpt_tables.ledger.delta_files import (
    KeptEvents,
    commit_info,
    conformed,
    footer_digest,
    ledger_dataset,
    stats,
)
from lakeckpt_tables.ledger.delta_upkeep import ORPHAN_GRACE_HOURS, DeltaUpkeep
from lakeckpt_tables.ledger.records import CheckpointRecord, few_rows_first
from lakeckpt_tables.ledger.spec import LedgerSpec

__all__ = ["ORPHAN_GRACE_HOURS", "DeltaLedger"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# Columns given min/max statistics in each add action, so that readers filtering on a run or
# a kind of record can skip files. numRecords is there because without it count() undercounts.


class DeltaLedger(DeltaUpkeep, LedgerBase[AddAction]):
    """A ledger kept in a Delta table, created on first use.

    Args:
        uri: table location (local path or object store URI), or the
            :class:`~lakeckpt_tables.io.Storage` rooted at it: the one store through which the
            log (delta-rs) and the data files (pyarrow) are read and written.
        storage_options: storage options of ``uri`` when it is a string (NOTE [ storage
            options ] in :mod:`lakeckpt_tables.io.options`).
        create: create the table when absent.

    Raises:
        LedgerError: the location holds a Delta table that is not a ledger, or a ledger of
            another format version.
        StorageError: the store failed (named with the URI and the kind).
    """

    def __init__(self, uri: str | Storage, *, storage_options: Mapping[str, str] | None = None,
                 create: bool = True) -> None:
        super().__init__()
        self._store = uri if isinstance(uri, Storage) else Storage(uri, storage_options)
        self._uri = self._store.uri
        self._options = self._store.delta_options()
        self._table = (_open_or_create(self._store) if create
                       else _open(self._store, self.describe()))
        _check_format(self._table, self.describe())
        if create:
            self._table = _log_checkpoints(_add_columns(self._table, self._store), self._store)
        self._base = self._store.fs_path("")
        self._verified: set[str] = set()  # data files whose footer matched its digest
        self._events = KeptEvents()  # NOTE [ event rows kept ] in ledger/delta_files.py

    def describe(self) -> str:
        """Where the ledger lives, for error messages."""
        return f"delta:{self._uri}"

    @property
    def spec(self) -> LedgerSpec:
        """Where the ledger lives, as a value."""
        return LedgerSpec("delta", self._uri)

    def repair_missing(self) -> list[str]:
        """Drop from the log the data files that no longer exist (deltalake's FSCK): their
        records are lost, the rest stay; a damaged file that exists is kept for inspection.

        Returns:
            The files dropped (empty when none is missing).
        """
        with self._lock:
            self._refresh()
            removed = self._table.repair(dry_run=False).get("files_removed", [])
            self._refresh()
            return sorted(str(f) for f in removed)

    def _refresh(self) -> None:
        # The handle does not advance by itself, not even after our own commits.
        self._log_call("read", self._table.update_incremental)

    def _log_call(self, action: str, call: Callable[[], T]) -> T:
        """A call of delta-rs on the log, its failure named (NOTE [ store failures ]):
        delta-rs has retried for the budget already (``retry_timeout``)."""
        try:
            return call()
        except OSError as e:
            raise gave_up(self._uri, f"{action} the ledger at", e, self._store.retry_seconds,
                          redact=self._store.redact) from e

    def _select(self, equal: Mapping[str, str]) -> pa.Table:
        conditions = [pc.field(name) == v for name, v in equal.items()]
        return self._read_where(functools.reduce(operator.and_, conditions)
                                if conditions else None)

    def _event_rows(self) -> pa.Table:
        """Every event row of the handle's snapshot, reading only the files added since the
        last read (NOTE [ event rows kept ] in ``ledger/delta_files.py``): kept by file."""
        paths = [self._path(uri) for uri in self._table.file_uris()]
        where = pc.field(s.RECORD) == s.RECORD_EVENT
        return self._events.rows(paths, lambda new: self._read_where(where, paths=new))

    def _read_where(self, where: pc.Expression | None, columns: list[str] | None = None, *,
                    paths: list[str] | None = None) -> pa.Table:
        """The handle's rows matching ``where`` (all when None), with ``columns`` (all in
        :data:`LEDGER_SCHEMA` when None), from ``paths`` (every live data file when None)."""
        if paths is None:
            paths = [self._path(uri) for uri in self._table.file_uris()]
        suspect = self._suspect_footers(paths)
        trusted = [p for p in paths if p not in suspect]

        def read() -> pa.Table:
            rows = ledger_dataset(trusted, self._fs).to_table(filter=where, columns=columns)
            if suspect:  # NOTE [ footer digest ]: no statistics used, filtered here
                whole = ledger_dataset(sorted(suspect), self._fs).to_table()
                whole = whole if where is None else whole.filter(where)
                rows = pa.concat_tables([rows, whole if columns is None
                                         else whole.select(columns)])
            return conformed(rows) if columns is None else rows
        return self._reading(paths, read)

    def _path(self, file_uri: str) -> str:
        """A data file (as delta-rs names it) as the ledger's filesystem names it."""
        return self._store.fs_path(file_uri)

    def _last_step(self, run_id: str) -> int | None:
        # Each checkpoint commit sets the run's app transaction version to its step, and
        # steps only grow (a retired step is committed again at most), so the version is the
        # run's last step: no data read needed.
        return self._table.transaction_version(_app_id(run_id))

    def _owner(self, run_id: str) -> str | None:
        token = self._table.transaction_version(_owner_app_id(run_id))
        return None if token is None else str(token)

    def _prepare(self, rows: pa.Table) -> list[AddAction]:
        """Phase 1 of a commit: its rows as data files; a large commit's as a few parts
        encoded in parallel threads (NOTE [ parallel ledger parts ])."""
        parts = _parts(rows)
        if len(parts) == 1:
            return [self._write_file(rows)]
        with ThreadPoolExecutor(len(parts), thread_name_prefix="lakeckpt-ledger") as pool:
            futures = [pool.submit(self._write_file, part) for part in parts]
        written = [f.result() for f in futures if f.exception() is None]
        failures = [e for f in futures if (e := f.exception()) is not None]
        if failures:
            self._discard(written)  # nothing names them
            raise failures[0]
        return written

    def _write_file(self, rows: pa.Table, *, data_change: bool = True) -> AddAction:
        """One data file of ``rows``, named after its footer's digest, written with one PUT."""
        buffer = pa.BufferOutputStream(memory_pool=COMMIT_POOL)  # NOTE [ commit memory ]
        with pq.ParquetWriter(buffer, rows.schema, write_page_checksum=True,
                              use_dictionary=_DICTIONARY, compression=_COMPRESSION,
                              memory_pool=COMMIT_POOL) as writer:
            for group in few_rows_first(rows):  # NOTE [ few rows first ] in records.py
                writer.write_table(group, row_group_size=_ROW_GROUP_ROWS)
        data = buffer.getvalue()
        # NOTE [ footer digest ]: the name carries the footer's digest (see _footer_digest)
        path = f"lakeckpt-{uuid.uuid4().hex}-{footer_digest(data)}.parquet"
        where = self._data_path(path)

        def write() -> None:  # one PUT of a new name: retrying it is harmless
            with self._fs.open_output_stream(where) as out:
                out.write(data)
        try:
            self._retrying("write", write)
        except OSError as e:
            raise store_error(self._uri, "write the ledger at", e,
                              redact=self._store.redact) from e
        return AddAction(
            path=path,
            size=data.size,
            partition_values={},
            modification_time=int(time.time() * 1000),
            data_change=data_change,
            stats=stats(rows, pq.read_metadata(pa.BufferReader(data))),
        )

    def _publish(
        self,
        prepared: list[AddAction],
        *,
        run_id: str,
        checkpoint: CheckpointRecord | None,
        owner: str | None = None,
    ) -> bool:
        transactions = []
        if checkpoint is not None:
            transactions.append(Transaction(app_id=_app_id(run_id), version=checkpoint.step))
        if owner is not None:
            # a claim and an owned commit carry the same app id: delta-rs refuses to rebase
            # one over the other, so the loser settles against the winner
            transactions.append(Transaction(app_id=_owner_app_id(run_id), version=int(owner)))
        properties = CommitProperties(
            custom_metadata=commit_info(run_id, checkpoint),
            app_transactions=transactions or None,
        )
        try:
            self._table.create_write_transaction(
                prepared, mode="append", schema=s.LEDGER_SCHEMA, commit_properties=properties
            )
        except CommitFailedError:
            # delta-rs raises this only when it did not write the log entry: a concurrent
            # commit took the version, and rebasing over it was refused or ran out of tries.
            return False
        except (DeltaError, OSError) as e:
            cause = StorageError(self._store.redact(clean(str(e))), uri=self._uri,
                                 kind=classify(e))
            raise outcome_unknown(self.describe(), run_id, checkpoint, cause) from e
        return True

    def _discard(self, prepared: list[AddAction]) -> None:
        for action in prepared:
            # A file we fail to delete is an orphan, which maintenance removes.
            with contextlib.suppress(OSError):
                self._fs.delete_file(self._data_path(action.path))


def _open_or_create(store: Storage) -> DeltaTable:
    where = f"delta:{store.uri}"
    options = store.delta_options()
    try:
        exists = DeltaTable.is_deltatable(store.uri, options)
    except OSError as e:
        raise gave_up(store.uri, "open the ledger at", e, store.retry_seconds,
                      redact=store.redact) from e
    if not exists:
        # CommitFailedError: another process created it between our check and our create.
        with contextlib.suppress(CommitFailedError):
            try:
                DeltaTable.create(
                    store.uri,
                    s.LEDGER_SCHEMA,
                    mode="ignore",
                    name="lakeckpt_ledger",
                    description="lakeckpt-tables ledger: checkpoints, consumption and events",
                    configuration={s.FORMAT_PROPERTY: str(s.LEDGER_FORMAT_VERSION),
                                   _CHECKPOINT_INTERVAL: _LOG_CHECKPOINT_EVERY},
                    storage_options=options,
                    raise_if_key_not_exists=False,
                )
            except OSError as e:
                raise gave_up(store.uri, "create the ledger at", e, store.retry_seconds,
                              redact=store.redact) from e
    return _open(store, where)


def _open(store: Storage, where: str) -> DeltaTable:
    try:
        return DeltaTable(store.uri, storage_options=store.delta_options())
    except OSError as e:
        raise gave_up(store.uri, "open the ledger at", e, store.retry_seconds,
                      redact=store.redact) from e
    except DeltaError as e:
        raise LedgerError(f"ledger {where} could not be opened or created: "
                          f"{store.redact(clean(str(e)))}") from e


def _add_columns(table: DeltaTable, store: Storage) -> DeltaTable:
    """A ledger created before :data:`~lakeckpt_tables.ledger.schema.ADDED_COLUMNS` gains them
    (nullable; its rows read them as null). A concurrent opener adding them too is fine."""
    have = {f.name for f in table.schema().fields}
    missing = [DeltaField(name, PrimitiveType("long" if pa.types.is_int64(
                   s.LEDGER_SCHEMA.field(name).type) else "string"), nullable=True)
               for name in s.ADDED_COLUMNS if name not in have]
    if not missing:
        return table
    try:
        table.alter.add_columns(missing)
    except (CommitFailedError, DeltaError) as e:
        table = _open(store, f"delta:{store.uri}")
        if not {f.name for f in missing} <= {f.name for f in table.schema().fields}:
            raise LedgerError(f"ledger delta:{store.redact(store.uri)} lacks columns "
                              f"{[f.name for f in missing]} and adding them failed: "
                              f"{store.redact(clean(str(e)))}") from e
        return table
    return _open(store, f"delta:{store.uri}")


_CHECKPOINT_INTERVAL = "delta.checkpointInterval"
_LOG_CHECKPOINT_EVERY = "10"
"""Commits between two checkpoints of the ledger's log.

NOTE [ log checkpoints ]
Every save refreshes the ledger's handle and commits to its log, and delta-rs replays the log
from its last checkpoint for both: at 50 commits past one, each refresh took 6.7 ms and each
commit 12.4 ms (1.8 and 3.8 ms at 10), ~20 ms more per save, until compaction wrote the next
checkpoint (every 100 saves). So delta-rs writes one every 10 commits (its post-commit hook),
a Parquet file of the log's state, and both stay flat.
"""


def _log_checkpoints(table: DeltaTable, store: Storage) -> DeltaTable:
    """A ledger created before NOTE [ log checkpoints ] gains the interval when opened (not
    one whose interval somebody set). A concurrent opener setting it too is fine."""
    if _CHECKPOINT_INTERVAL in table.metadata().configuration:
        return table
    with contextlib.suppress(CommitFailedError, DeltaError, OSError):  # only speed at stake
        table.alter.set_table_properties({_CHECKPOINT_INTERVAL: _LOG_CHECKPOINT_EVERY})
    return _open(store, f"delta:{store.uri}")


def _check_format(table: DeltaTable, where: str) -> None:
    found = table.metadata().configuration.get(s.FORMAT_PROPERTY)
    if found != str(s.LEDGER_FORMAT_VERSION):
        raise LedgerError(
            f"ledger {where} has format version {found or 'none (not a ledger)'}, "
            f"this lakeckpt-tables reads format version {s.LEDGER_FORMAT_VERSION}"
        )


def _app_id(run_id: str) -> str:
    return f"lakeckpt:{run_id}"


def _owner_app_id(run_id: str) -> str:
    return f"lakeckpt-owner:{run_id}"


_ROW_GROUP_ROWS = 65_536
_PART_ROWS = _ROW_GROUP_ROWS
_MAX_PARTS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                          else os.cpu_count() or 1))  # the cores this process may use


def _parts(rows: pa.Table) -> list[pa.Table]:
    """A commit's rows cut into the parts written in parallel, in order.

    NOTE [ parallel ledger parts ]
    At 256 ranks x 8 workers a commit holds ~262,000-523,000 consumption rows, and encoding
    them as Parquet (~20 MB) was the largest cost of rank 0's commit (~100 ms). pyarrow's
    writer encodes a file on one thread but releases the GIL, so a commit of two row groups
    or more is written as up to ``_MAX_PARTS`` files (one per core, at most 4; a row group or
    more each) at once, all added by the one log commit: atomic as before, and a reader sees
    the commit's rows or none. A part that fails deletes the others (nothing names them); a
    crash leaves orphans, as a crash after the one file did, which maintenance removes.
    Small commits stay one file; compaction merges the parts like any small files.
    """
    count = min(_MAX_PARTS, rows.num_rows // _PART_ROWS)  # parts of a row group or more
    if count <= 1:
        return [rows]
    size = -(-rows.num_rows // count)
    return [rows.slice(start, size) for start in range(0, rows.num_rows, size)]
# checksums are distinct hex strings: a dictionary or snappy only costs time on them (half the
# write of a 262,000-row commit) and saves nothing
_DICTIONARY = [name for name in s.LEDGER_SCHEMA.names if name != s.CHECKSUM]
_COMPRESSION = {name: "none" if name == s.CHECKSUM else "snappy" for name in s.LEDGER_SCHEMA.names}
