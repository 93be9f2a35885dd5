"""The Delta ledger's data files: how they are named, read, checked and summed.

NOTE [ footer digest ] is how a file's name vouches for its footer; reads verify page checksums
(:func:`ledger_dataset`) and conform rows to the ledger's schema (:func:`conformed`), and any
failure is either the store's (named as such, NOTE [ store failures ] in
:mod:`lakeckpt_tables.io.failures`) or damage of one named file (:meth:`DeltaFiles.damaged`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pa_ds
import pyarrow.fs as pa_fs
import pyarrow.parquet as pq
from deltalake import DeltaTable

from lakeckpt_tables.errors import (
    LakeckptError,
    LedgerCorruptError,
    StorageError,
    StoreUnavailableError,
)
from lakeckpt_tables.io import Storage
from lakeckpt_tables.io.failures import classify, clean, retrying, store_error
from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.ledger.records import CheckpointRecord
from lakeckpt_tables.ledger.summary import consumed, read_summary

__all__ = ["DeltaFiles", "KeptEvents", "commit_info", "conformed", "footer_digest",
           "ledger_dataset", "stats"]

log = logging.getLogger("lakeckpt_tables.ledger.delta")
T = TypeVar("T")


class DeltaFiles:
    """The data-file side of a :class:`~lakeckpt_tables.ledger.DeltaLedger` (a mixin): the
    live files of the loaded version, their reads, checks and consumption totals."""

    _store: Storage
    _uri: str
    _base: str
    _table: DeltaTable
    _lock: Any
    _verified: set[str]

    def describe(self) -> str:
        raise NotImplementedError

    @property
    def _fs(self) -> pa_fs.FileSystem:
        return self._store.filesystem

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
        return ledger_dataset(paths, self._fs)

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
                self._retrying("read", lambda: self._checkfooter_digest(path))  # noqa: B023
            except ValueError as e:
                log.warning("ledger %s: data file %s: %s; it is read whole, its statistics "
                            "unused", self.describe(), path, e)
                suspect.add(path)
                continue
            except (OSError, pa.ArrowException) as e:
                raise self.damaged([path], e) from e
            self._verified.add(path)
        return suspect

    def _checkfooter_digest(self, path: str) -> None:
        want = named_digest(path)
        if want is None:
            return
        with self._fs.open_input_file(path) as f:
            size = f.size()
            length = int.from_bytes(bytes(f.read_at(8, size - 8))[:4], "little")
            footer = bytes(f.read_at(length, size - 8 - length))
        if digest(footer) != want:
            raise ValueError("its footer (schema and row-group statistics, which no page "
                             "checksum covers) does not match the digest in its name")

    def read_files(self, paths: list[str]) -> pa.Table:
        """Every row of these data files, in :data:`LEDGER_SCHEMA`.

        Raises:
            LedgerCorruptError: one cannot be read (named, with the way out).
        """
        return self._reading(paths, lambda: conformed(ledger_dataset(paths, self._fs).to_table()))

    def consumed(self, files: list[tuple[str, int]]) -> pa.Table:
        """Per-checkpoint consumption totals of these data files (``SUMMARY_SCHEMA``): from
        each file's summary where ``maintain`` wrote one, else summed from its rows.

        Raises:
            LedgerCorruptError: a file without a summary cannot be read.
        """
        def rows_of(paths: list[str], columns: list[str]) -> pa.Table:
            scan = ledger_dataset(paths, self._fs)
            return self._reading(paths, lambda: scan.to_table(
                columns=columns, filter=pc.field(s.RECORD) == s.RECORD_CONSUMPTION))

        return consumed(files, lambda path, size: read_summary(
            self._fs, self._base, self._relative(path), size), rows_of)

    def _relative(self, path: str) -> str:
        """A data file's path relative to the table (as add actions name it)."""
        return path[len(self._base) + 1:] if path.startswith(self._base + "/") else path

    def _data_path(self, relative: str) -> str:
        """A data file named relative to the table, as the ledger's filesystem names it."""
        return f"{self._base}/{relative}"

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
        if store_failure(cause):
            return store_error(self._uri, "read the ledger at", cause, redact=self._store.redact)
        for path in paths:
            try:
                conformed(ledger_dataset([path], self._fs).to_table())
            except (OSError, pa.ArrowException, ValueError) as e:
                if store_failure(e):
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


class KeptEvents:
    """The event rows of the Delta ledger's data files read so far, by file.

    NOTE [ event rows kept ]
    Retention reads the run's tag events at every save (``lakeckpt tag`` may have spared a
    checkpoint meanwhile), and each read opened every data file of the ledger: ~0.6 ms a file
    locally (a request each on object storage), 47 ms at 80 files and growing until the next
    compaction. Data files are immutable (new content, new name), so the event rows of the
    files read are kept and a read opens only the files added since. When a file read before
    is no longer live (compaction or repair replaced it), everything is read again: what is
    kept is always exactly the rows of live files. An Iceberg ledger keeps them by snapshot
    instead (``EventRows`` in ``ledger/iceberg_files.py``).
    """

    def __init__(self) -> None:
        self._read: frozenset[str] = frozenset()
        self._rows = s.LEDGER_SCHEMA.empty_table()

    def rows(self, live: Sequence[str], read: Callable[[list[str]], pa.Table]) -> pa.Table:
        """The event rows of the ``live`` data files, calling ``read`` for the rows of the
        files not read before."""
        if not self._read <= frozenset(live):
            self._read, self._rows = frozenset(), s.LEDGER_SCHEMA.empty_table()
        new = [key for key in live if key not in self._read]
        if new:
            self._rows = pa.concat_tables([self._rows, read(new)])
            self._read = self._read.union(new)
        return self._rows


_DIGEST_CHARS = 16


def digest(footer: bytes) -> str:
    return hashlib.sha256(footer).hexdigest()[:_DIGEST_CHARS]


def footer_digest(data: pa.Buffer) -> str:
    """Digest of a Parquet file's footer (its last ``8 + length`` bytes hold it)."""
    length = int.from_bytes(data.slice(data.size - 8, 4).to_pybytes(), "little")
    return digest(data.slice(data.size - 8 - length, length).to_pybytes())


def named_digest(path: str) -> str | None:
    """The footer digest a ledger file's name carries, None for names without one."""
    stem = path.rsplit("/", 1)[-1].removesuffix(".parquet")
    parts = stem.split("-")
    if len(parts) == 3 and parts[0] == "lakeckpt" and len(parts[2]) == _DIGEST_CHARS:
        return parts[2]
    return None


def conformed(rows: pa.Table) -> pa.Table:
    """The rows in :data:`LEDGER_SCHEMA`.

    Raises:
        ValueError: a column of the schema that allows no nulls holds one (damage).
    """
    return rows.select(s.LEDGER_SCHEMA.names).cast(s.LEDGER_SCHEMA)


def store_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is the store failing (not the ledger's files being damaged)."""
    return isinstance(exc, StorageError) or classify(exc) in _STORE_KINDS


_STORE_KINDS = frozenset({"bucket missing", "access denied", "unreachable", "unavailable"})


def ledger_dataset(paths: list[str], fs: pa_fs.FileSystem) -> pa_ds.Dataset:
    options = pa_ds.ParquetFragmentScanOptions(page_checksum_verification=True)
    return pa_ds.dataset(paths, schema=s.LEDGER_SCHEMA, filesystem=fs,
                         format=pa_ds.ParquetFileFormat(default_fragment_scan_options=options))


def commit_info(run_id: str, checkpoint: CheckpointRecord | None) -> dict[str, object]:
    """Commit metadata shown by ``DESCRIBE HISTORY``: which run and checkpoint a commit is."""
    info: dict[str, object] = {"lakeckpt.run": run_id, s.FORMAT_PROPERTY: s.LEDGER_FORMAT_VERSION}
    if checkpoint is not None:
        info["lakeckpt.step"] = checkpoint.step
        info["lakeckpt.checkpoint"] = checkpoint.checkpoint_id
    return info


def stats(rows: pa.Table, footer: pq.FileMetaData | None = None) -> str:
    """Delta add-action statistics: row count, nulls, and min/max of every primitive column.

    Readers that prune files by statistics (deltalake's ``to_pyarrow_dataset``, hence DuckDB
    over it) drop a file whose filtered column has no min/max, so every column that can carry
    them does. The bounds are taken from ``footer``, the written file's row-group statistics,
    where it has them (the Parquet writer computed them: no second pass over a large commit's
    ~20 MB of rows), else from the rows.
    """
    known = _footer_bounds(rows.schema, footer) if footer is not None else {}
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
        low, high = known.get(field.name) or pc.min_max(column).as_py().values()
        lows[field.name] = _stat(low, up=False)
        highs[field.name] = _stat(high, up=True)
    return json.dumps({"numRecords": rows.num_rows, "minValues": lows, "maxValues": highs,
                       "nullCount": nulls})


def _footer_bounds(schema: pa.Schema, footer: pq.FileMetaData) -> dict[str, tuple[Any, Any]]:
    """(min, max) of each top-level column whose every row group has them (or holds only
    nulls) in a Parquet footer; floats are left to the rows (NaN and -0.0 order)."""
    bounds: dict[str, tuple[Any, Any]] = {}
    groups = [footer.row_group(i) for i in range(footer.num_row_groups)]
    for i in range(footer.num_columns):
        name = footer.schema.column(i).path
        if name not in schema.names or pa.types.is_nested(schema.field(name).type) \
                or pa.types.is_floating(schema.field(name).type):
            continue
        found = []
        for group in groups:
            chunk = group.column(i).statistics
            if chunk is not None and chunk.has_min_max:
                found.append((chunk.min, chunk.max))
            elif chunk is None or chunk.null_count != group.num_rows:
                break  # no bounds for values this group holds
        else:
            if found:
                bounds[name] = (min(b[0] for b in found), max(b[1] for b in found))
    return bounds


def _stat(value: object, *, up: bool) -> object:
    """A statistic as Delta writes it; timestamps at millisecond precision, widened outward."""
    if not isinstance(value, datetime):
        return value
    millis = value.replace(microsecond=value.microsecond // 1000 * 1000)
    if up and millis != value:
        millis += timedelta(milliseconds=1)
    return millis.strftime("%Y-%m-%dT%H:%M:%S.") + f"{millis.microsecond // 1000:03d}Z"
