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
import hashlib
import json
import logging
import operator
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pa_ds
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, CommitProperties, Transaction

from lakeckpt_tables.errors import (
    CommitStateUnknownError,
    LakeckptError,
    LedgerCorruptError,
    LedgerError,
    StorageError,
    StoreUnavailableError,
)
from lakeckpt_tables.io import Storage
from lakeckpt_tables.io.failures import classify, clean, gave_up, retrying, store_error
from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.ledger.base import LedgerBase, outcome_unknown
from lakeckpt_tables.ledger.records import CheckpointRecord
from lakeckpt_tables.ledger.summary import (
    SUMMARY_DIR,
    SUMMARY_SCHEMA,
    read_summary,
    summarize,
    summary_path,
    write_summary,
)

__all__ = ["ORPHAN_GRACE_HOURS", "DeltaLedger"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# Columns given min/max statistics in each add action, so that readers filtering on a run or
# a kind of record can skip files. numRecords is there because without it count() undercounts.


ORPHAN_GRACE_HOURS = 24
"""Files younger than this are never orphans: a commit may be writing them."""


class DeltaLedger(LedgerBase[AddAction]):
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
        self._base = self._store.fs_path("")
        self._verified: set[str] = set()  # data files whose footer matched its digest

    @property
    def _fs(self) -> pa_fs.FileSystem:
        return self._store.filesystem

    def describe(self) -> str:
        """Where the ledger lives, for error messages."""
        return f"delta:{self._uri}"

    def compact(self) -> None:
        """Rewrite the ledger's files into one and checkpoint the log.

        NOTE [ delta ledger compaction ]
        delta-rs's OPTIMIZE lets two concurrent compactions that remove the same files both
        land (each adds its own rewritten copy: every row twice), and it ignores app
        transactions. So the rewrite is an overwrite of exactly the snapshot read, which
        delta-rs's conflict checker refuses if anything was committed since: of two
        concurrent compactions the second gives way, and a compaction racing a ledger commit
        either gives way or makes that commit lose its race and settle again. No row is ever
        lost or doubled. The replaced files stay on disk until a VACUUM.

        Raises:
            LedgerCorruptError: a ledger file cannot be read (nothing was changed).
            CommitStateUnknownError: the rewrite may or may not have landed.
        """
        with self._lock:
            self._refresh()
            if len(self._table.file_uris()) > 1:
                # sorted and cut in small row groups, so that a read of one kind of record or
                # one run skips the rest by row-group statistics
                rows = self._read().sort_by([(c, "ascending") for c in _COMPACT_ORDER])
                prepared = self._prepare(rows, data_change=False)
                self._summarize(prepared, rows)
                properties = CommitProperties(custom_metadata={COMPACTION_PROPERTY: "true"})
                try:
                    self._table.create_write_transaction(
                        [prepared], mode="overwrite", schema=s.LEDGER_SCHEMA,
                        commit_properties=properties)
                except CommitFailedError:
                    self._discard(prepared)
                    with contextlib.suppress(OSError):
                        self._fs.delete_file(summary_path(self._base, prepared.path))
                    log.info("ledger %s: a concurrent commit won over compaction; giving way",
                             self.describe())
                    return
                except (DeltaError, OSError) as e:
                    raise CommitStateUnknownError(
                        f"ledger {self.describe()}: the compaction may or may not have landed "
                        f"({e}); its rows are the same either way, compact again later") from e
                self._refresh()
            self._log_call("checkpoint", self._table.create_checkpoint)

    def _summarize(self, prepared: AddAction, rows: pa.Table) -> None:
        """Write the consumption summary of a compacted file (NOTE [ consumption summaries ])."""
        try:
            write_summary(self._fs, self._base, prepared.path, prepared.size, summarize(rows))
        except OSError as e:  # derived data: readers sum the file's rows without it
            log.warning("ledger %s: no consumption summary for %s (%s)", self.describe(),
                        prepared.path, e)

    def loaded_files(self) -> tuple[int, list[tuple[str, int]]]:
        """The loaded version and its live data files (path as :meth:`dataset` takes it,
        size in bytes), without refreshing."""
        with self._lock:
            actions = pa.table(self._table.get_add_actions(flatten=True))
            version = int(self._table.version())
        paths = [self._data_path(p) for p in actions["path"].to_pylist()]
        return version, list(zip(paths, actions["size_bytes"].to_pylist(), strict=True))

    def dataset(self, paths: list[str]) -> pa_ds.Dataset:
        """A lazy dataset over these data files, in :data:`LEDGER_SCHEMA` (page checksums
        verified as it is scanned)."""
        return _dataset(paths, self._fs)

    def check_files(self, files: list[tuple[str, int]]) -> bool:
        """Check that every data file is there, at its logged size, with a readable footer.

        Returns:
            True when every file stores the ledger's exact column types and has a footer
            that can be trusted (NOTE [ footer digest ]), so that filters can be pushed into a
            scan; False when one was rewritten by another writer (e.g. a delta-rs DELETE
            writes ``string_view``), which only a full read casts, or fails its digest.

        Raises:
            LedgerCorruptError: one is not (named, with the way out).
        """
        exact = True
        for path, size in files:
            try:
                found = self._fs.get_file_info(path).size
                if found != size:
                    raise OSError(f"{found} bytes on disk, the log says {size}")
                exact = exact and not self._suspect_footers([path])
                stored = pq.read_schema(path, filesystem=self._fs)
            except (OSError, pa.ArrowException) as e:
                raise self.damaged([path], e) from e
            exact = exact and all(
                f.name not in stored.names or stored.field(f.name).type == f.type
                for f in s.LEDGER_SCHEMA)
        return exact

    def _suspect_footers(self, paths: list[str]) -> set[str]:
        """The data files whose footer does not match the digest their name carries (checked
        once per file and process: data files are immutable).

        NOTE [ footer digest ]
        Page checksums cover page data, not the footer, and the footer's row-group
        statistics decide which row groups a filtered read skips: one flipped bit in a
        statistic ("run" -> "rwn") made a checkpoint and its consumption records silently
        invisible to every read filtered on the run (found by ``lakeckpt chaos``). So the
        ledger names each file it writes after a digest of its footer. A file whose footer
        does not match is read whole, its statistics unused, and its rows are judged by their
        own checksums (a rewritten record is then skipped by restore like any damaged one).
        Files of other writers (or older ledgers) carry no digest and are trusted, as before.
        """
        suspect = set()
        for path in paths:
            if path in self._verified:
                continue
            try:
                self._retrying("read", lambda: self._check_footer_digest(path))  # noqa: B023
            except ValueError as e:
                log.warning("ledger %s: data file %s: %s; it is read whole, its statistics "
                            "unused", self.describe(), path, e)
                suspect.add(path)
                continue
            except (OSError, pa.ArrowException) as e:
                raise self.damaged([path], e) from e
            self._verified.add(path)
        return suspect

    def _check_footer_digest(self, path: str) -> None:
        want = _named_digest(path)
        if want is None:
            return
        with self._fs.open_input_file(path) as f:
            size = f.size()
            length = int.from_bytes(bytes(f.read_at(8, size - 8))[:4], "little")
            footer = bytes(f.read_at(length, size - 8 - length))
        if _digest(footer) != want:
            raise ValueError("its footer (schema and row-group statistics, which no page "
                             "checksum covers) does not match the digest in its name")

    def read_files(self, paths: list[str]) -> pa.Table:
        """Every row of these data files, in :data:`LEDGER_SCHEMA`.

        Raises:
            LedgerCorruptError: one cannot be read (named, with the way out).
        """
        return self._reading(paths, lambda: _conformed(_dataset(paths, self._fs).to_table()))

    def consumed(self, files: list[tuple[str, int]]) -> pa.Table:
        """Per-checkpoint consumption totals of these data files (``SUMMARY_SCHEMA``): from
        each file's summary where ``maintain`` wrote one, else summed from its rows.

        Raises:
            LedgerCorruptError: a file without a summary cannot be read.
        """
        parts, unsummarized = [], []
        for path, size in files:
            summary = read_summary(self._fs, self._base, self._relative(path), size)
            if summary is None:
                unsummarized.append(path)
            else:
                parts.append(summary)
        if unsummarized:
            columns = [s.RUN_ID, s.CHECKPOINT_ID, s.STEP, s.SEGMENT, s.EPOCH, s.COMMITTED_AT,
                       s.ROWS]
            rows = self._reading(unsummarized, lambda: _dataset(unsummarized, self._fs).to_table(
                columns=columns, filter=pc.field(s.RECORD) == s.RECORD_CONSUMPTION))
            parts.append(summarize(rows))
        return pa.concat_tables(parts) if parts else SUMMARY_SCHEMA.empty_table()

    def _relative(self, path: str) -> str:
        """A data file's path relative to the table (as add actions name it)."""
        return path[len(self._base) + 1:] if path.startswith(self._base + "/") else path

    def _data_path(self, relative: str) -> str:
        """A data file named relative to the table, as the ledger's filesystem names it."""
        return f"{self._base}/{relative}"

    def remove_orphans(self, *, older_than_hours: int = ORPHAN_GRACE_HOURS,
                       dry_run: bool = False) -> list[str]:
        """Remove the ledger's orphan files: data files no log entry names (written by a
        commit that crashed or lost its race and could not clean up), and summaries of files
        no longer live. Nothing else: live files, and files a compaction replaced that the log
        still names (Delta's VACUUM decides about those), are kept.

        A file younger than ``older_than_hours`` is kept whatever it is: a commit may be
        writing it right now (a commit attempt takes seconds; a day is far beyond any).

        Args:
            older_than_hours: the grace period.
            dry_run: list, remove nothing.

        Returns:
            The removed files, relative to the table.
        """
        with self._lock:
            self._refresh()
            unnamed = set(self._table.vacuum(
                retention_hours=older_than_hours, dry_run=True,
                enforce_retention_duration=False, full=True))
            # the files the log names as removed (a compaction's replaced files) are VACUUM's
            # business, not ours: only files never committed are orphans
            tombstones = set(self._table.vacuum(retention_hours=0, dry_run=True,
                                                enforce_retention_duration=False))
            live = {self._relative(path).rsplit("/", 1)[-1] for path, _ in self.loaded_files()[1]}
        orphans = sorted(unnamed - tombstones)
        orphans += self._stale_summaries(live, older_than_hours)
        for path in orphans if not dry_run else ():
            with contextlib.suppress(FileNotFoundError):
                self._fs.delete_file(self._data_path(path))
        return orphans

    def _stale_summaries(self, live: set[str], older_than_hours: int) -> list[str]:
        where = self._data_path(SUMMARY_DIR)
        selector = pa_fs.FileSelector(where, allow_not_found=True)
        cutoff = time.time() - older_than_hours * 3600
        return sorted(f"{SUMMARY_DIR}/{info.base_name}"
                      for info in self._fs.get_file_info(selector)
                      if info.base_name not in live and info.mtime is not None
                      and info.mtime.timestamp() <= cutoff)

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

    def _read(
        self,
        *,
        record: str | None = None,
        run_id: str | None = None,
        checkpoint_id: str | None = None,
    ) -> pa.Table:
        wanted = {s.RECORD: record, s.RUN_ID: run_id, s.CHECKPOINT_ID: checkpoint_id}
        conditions = [pc.field(name) == v for name, v in wanted.items() if v is not None]
        where = functools.reduce(operator.and_, conditions) if conditions else None
        paths = [self._path(uri) for uri in self._table.file_uris()]
        suspect = self._suspect_footers(paths)
        trusted = [p for p in paths if p not in suspect]

        def read() -> pa.Table:
            rows = _dataset(trusted, self._fs).to_table(filter=where)
            if suspect:  # NOTE [ footer digest ]: no statistics used, filtered here
                whole = _dataset(sorted(suspect), self._fs).to_table()
                rows = pa.concat_tables([rows, whole if where is None else whole.filter(where)])
            return _conformed(rows)
        return self._reading(paths, read)

    def _reading(self, paths: list[str], read: Callable[[], pa.Table]) -> pa.Table:
        """``read()`` of these data files, retried while the store fails transiently
        (NOTE [ retry budget ]); any other failure named by :meth:`damaged`.

        A row that is null where the ledger's schema allows none (a flipped bit in a
        definition level or in the footer's schema) is damage too.
        """
        try:
            return self._retrying("read", read)
        except StoreUnavailableError:
            raise
        except (OSError, pa.ArrowException, ValueError) as e:
            raise self.damaged(paths, e) from e

    def _retrying(self, action: str, call: Callable[[], T]) -> T:
        return retrying(call, budget=self._store.retry_seconds, uri=self._uri,
                        action=f"{action} the ledger at", redact=self._store.redact)

    def damaged(self, paths: list[str], cause: Exception) -> LakeckptError:
        """The named error for ledger files that cannot be read, found file by file: the
        file that is missing, truncated or damaged, or the store's failure (which is not
        damage: NOTE [ store failures ])."""
        if _store_failure(cause):
            return store_error(self._uri, "read the ledger at", cause, redact=self._store.redact)
        for path in paths:
            try:
                _conformed(_dataset([path], self._fs).to_table())
            except (OSError, pa.ArrowException, ValueError) as e:
                if _store_failure(e):
                    return store_error(self._uri, "read the ledger at", e,
                                       redact=self._store.redact)
                return LedgerCorruptError(
                    f"ledger {self.describe()}: data file {path} is missing, truncated or "
                    f"damaged ({self._store.redact(clean(str(e)))}). The way out: move the "
                    f"file aside (keep it for inspection) and run DeltaTable({self._uri!r})"
                    ".repair(), which drops it from the log; its records are lost, and restore "
                    "falls back to the newest checkpoint the ledger still holds", file=path
                )
        return LedgerCorruptError(f"ledger {self.describe()} could not be read: "
                                  f"{self._store.redact(clean(str(cause)))}")

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

    def _prepare(self, rows: pa.Table, *, data_change: bool = True) -> AddAction:
        buffer = pa.BufferOutputStream()
        pq.write_table(rows, buffer, write_page_checksum=True, row_group_size=_ROW_GROUP_ROWS)
        data = buffer.getvalue()
        # NOTE [ footer digest ]: the name carries the footer's digest (see _footer_digest)
        path = f"lakeckpt-{uuid.uuid4().hex}-{_footer_digest(data)}.parquet"
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
            stats=_stats(rows),
        )

    def _publish(
        self,
        prepared: AddAction,
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
            custom_metadata=_commit_info(run_id, checkpoint),
            app_transactions=transactions or None,
        )
        try:
            self._table.create_write_transaction(
                [prepared], mode="append", schema=s.LEDGER_SCHEMA, commit_properties=properties
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

    def _discard(self, prepared: AddAction) -> None:
        # A file we fail to delete is an orphan, which maintenance removes.
        with contextlib.suppress(OSError):
            self._fs.delete_file(self._data_path(prepared.path))


_DIGEST_CHARS = 16


def _digest(footer: bytes) -> str:
    return hashlib.sha256(footer).hexdigest()[:_DIGEST_CHARS]


def _footer_digest(data: pa.Buffer) -> str:
    """Digest of a Parquet file's footer (its last ``8 + length`` bytes hold it)."""
    raw = data.to_pybytes()
    length = int.from_bytes(raw[-8:-4], "little")
    return _digest(raw[-8 - length:-8])


def _named_digest(path: str) -> str | None:
    """The footer digest a ledger file's name carries, None for names without one."""
    stem = path.rsplit("/", 1)[-1].removesuffix(".parquet")
    parts = stem.split("-")
    if len(parts) == 3 and parts[0] == "lakeckpt" and len(parts[2]) == _DIGEST_CHARS:
        return parts[2]
    return None


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
                    configuration={s.FORMAT_PROPERTY: str(s.LEDGER_FORMAT_VERSION)},
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


def _check_format(table: DeltaTable, where: str) -> None:
    found = table.metadata().configuration.get(s.FORMAT_PROPERTY)
    if found != str(s.LEDGER_FORMAT_VERSION):
        raise LedgerError(
            f"ledger {where} has format version {found or 'none (not a ledger)'}, "
            f"this lakeckpt-tables reads format version {s.LEDGER_FORMAT_VERSION}"
        )


_COMPACT_ORDER = (s.RECORD, s.RUN_ID, s.STEP)
_ROW_GROUP_ROWS = 65_536

COMPACTION_PROPERTY = "lakeckpt.compaction"
"""Commit metadata key marking the rewrite made by :meth:`DeltaLedger.compact`."""


def _app_id(run_id: str) -> str:
    return f"lakeckpt:{run_id}"


def _owner_app_id(run_id: str) -> str:
    return f"lakeckpt-owner:{run_id}"


def _conformed(rows: pa.Table) -> pa.Table:
    """The rows in :data:`LEDGER_SCHEMA`.

    Raises:
        ValueError: a column of the schema that allows no nulls holds one (damage).
    """
    return rows.select(s.LEDGER_SCHEMA.names).cast(s.LEDGER_SCHEMA)


def _store_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is the store failing (not the ledger's files being damaged)."""
    return isinstance(exc, StorageError) or classify(exc) in _STORE_KINDS


_STORE_KINDS = frozenset({"bucket missing", "access denied", "unreachable", "unavailable"})


def _dataset(paths: list[str], fs: pa_fs.FileSystem) -> pa_ds.Dataset:
    options = pa_ds.ParquetFragmentScanOptions(page_checksum_verification=True)
    return pa_ds.dataset(paths, schema=s.LEDGER_SCHEMA, filesystem=fs,
                         format=pa_ds.ParquetFileFormat(default_fragment_scan_options=options))


def _commit_info(run_id: str, checkpoint: CheckpointRecord | None) -> dict[str, object]:
    """Commit metadata shown by ``DESCRIBE HISTORY``: which run and checkpoint a commit is."""
    info: dict[str, object] = {"lakeckpt.run": run_id, s.FORMAT_PROPERTY: s.LEDGER_FORMAT_VERSION}
    if checkpoint is not None:
        info["lakeckpt.step"] = checkpoint.step
        info["lakeckpt.checkpoint"] = checkpoint.checkpoint_id
    return info


def _stats(rows: pa.Table) -> str:
    """Delta add-action statistics: row count, nulls, and min/max of every primitive column.

    Readers that prune files by statistics (deltalake's ``to_pyarrow_dataset``, hence DuckDB
    over it) drop a file whose filtered column has no min/max, so every column that can carry
    them does.
    """
    lows: dict[str, object] = {}
    highs: dict[str, object] = {}
    nulls: dict[str, int] = {}
    for field in rows.schema:
        column = rows[field.name]
        if pa.types.is_nested(field.type):
            continue
        nulls[field.name] = column.null_count
        if column.null_count == len(column):
            continue
        bounds = pc.min_max(column).as_py()
        lows[field.name] = _stat(bounds["min"], up=False)
        highs[field.name] = _stat(bounds["max"], up=True)
    return json.dumps({"numRecords": rows.num_rows, "minValues": lows, "maxValues": highs,
                       "nullCount": nulls})


def _stat(value: object, *, up: bool) -> object:
    """A statistic as Delta writes it; timestamps at millisecond precision, widened outward."""
    if not isinstance(value, datetime):
        return value
    millis = value.replace(microsecond=value.microsecond // 1000 * 1000)
    if up and millis != value:
        millis += timedelta(milliseconds=1)
    return millis.strftime("%Y-%m-%dT%H:%M:%S.") + f"{millis.microsecond // 1000:03d}Z"
