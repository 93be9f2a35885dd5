"""What an audit reads: one ledger version, opened read-only, from a root, a spec or an object.

Read commands never write. :func:`~lakeckpt_tables.ledger.open_ledger` creates a missing
ledger (a run needs one); here a missing ledger is an error and nothing is created. Every
read lists the live files of ONE version as the table format's own reader does (deltalake,
pyiceberg; or, for a local Iceberg ledger of a SQL catalog, its metadata read directly:
NOTE [ direct iceberg read ] in :mod:`lakeckpt_tables.audit.iceberg_direct`), so a compaction
that left its replaced files on disk is never double counted, and every view of a connection
sees the same commit.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pa_ds
import pyarrow.fs as pa_fs

from lakeckpt_tables.errors import LakeckptError, LedgerCorruptError, LedgerError, StorageError
from lakeckpt_tables.io import Storage
from lakeckpt_tables.io.failures import clean, gave_up
from lakeckpt_tables.ledger import schema as s

__all__ = ["LedgerSnapshot", "damage_error", "read_ledger"]


class LedgerSnapshot:
    """The rows of one ledger at one version, read lazily where the format allows.

    A Delta ledger's snapshot holds a lazy dataset over the version's live files: a query
    reads only the record kinds, runs and columns it asks for (a compacted ledger is sorted by
    record kind, run and step, so row-group statistics skip the rest), and per-checkpoint
    consumption totals come from the summaries ``maintain`` writes
    (NOTE [ consumption summaries ]). Other ledgers hold their rows in memory.

    Attributes:
        where: the ledger's spec (``delta:<uri>`` or ``iceberg:<ns.table>``).
        version: the Delta version or Iceberg snapshot id read (None: an empty Iceberg table).
        dataset: the lazy dataset of a Delta ledger, None when the rows are in memory.
    """

    def __init__(self, where: str, version: int | None, rows: pa.Table | None = None,
                 catalog: Any = None, *, dataset: pa_ds.Dataset | None = None,
                 consumed: Callable[[], pa.Table] | None = None,
                 damaged: Callable[[Exception], LakeckptError] | None = None,
                 load_catalog: Callable[[], Any] | None = None) -> None:
        if (rows is None) == (dataset is None):
            raise ValueError("a ledger snapshot holds either rows or a dataset")
        self.where, self.version, self.dataset = where, version, dataset
        self._catalog, self._load_catalog = catalog, load_catalog
        self._rows = rows
        self._consumed = consumed
        self._damaged = damaged

    @property
    def catalog(self) -> Any:
        """The pyiceberg catalog of an Iceberg ledger (to find Iceberg sources), loaded on
        first use when the ledger was read without it (NOTE [ direct iceberg read ])."""
        if self._catalog is None and self._load_catalog is not None:
            self._catalog, self._load_catalog = self._load_catalog(), None
        return self._catalog

    @functools.cached_property
    def rows(self) -> pa.Table:
        """Every row, in :data:`~lakeckpt_tables.ledger.LEDGER_SCHEMA` (read on first use)."""
        if self._rows is not None:
            return self._rows
        return self.scan()

    def scan(self, filter: pc.Expression | None = None,
             columns: list[str] | None = None) -> pa.Table:
        """The rows matching ``filter``, with ``columns`` (all by default).

        Raises:
            LedgerCorruptError: a page of a ledger file fails its checksum.
        """
        if self.dataset is None:
            rows = self.rows if filter is None else self.rows.filter(filter)
            return rows if columns is None else rows.select(columns)
        try:
            return self.dataset.to_table(filter=filter, columns=columns)
        except (OSError, pa.ArrowException) as e:
            raise self.damage(e) from e

    def damage(self, cause: Exception) -> LakeckptError:
        """The named error for a failed read of this ledger: which file, and the way out."""
        if self._damaged is not None:
            return self._damaged(cause)
        return LedgerCorruptError(f"ledger {self.where} version {self.version} could not be "
                                  f"read: {' '.join(str(cause).split())}")

    def consumed(self) -> pa.Table:
        """Consumption totals per (run, checkpoint, step, segment, epoch), in
        :data:`~lakeckpt_tables.ledger.summary.SUMMARY_SCHEMA`."""
        if self._consumed is not None:
            return self._consumed()
        from lakeckpt_tables.ledger.summary import summarize

        return summarize(self.rows)


def read_ledger(target: Any, *, catalog: Any = None,
                storage_options: Mapping[str, str] | None = None) -> LedgerSnapshot:
    """Read one consistent version of the ledger ``target`` names, creating nothing.

    Args:
        target: a checkpoint root (its ``_ledger`` directory, or the ledger directory
            itself), ``"delta:<uri>"``, ``"iceberg:<namespace.table>"``, or a ledger object.
        catalog: the pyiceberg catalog of an ``iceberg:`` spec (an object, or a name or SQL
            catalog URI to load); the default catalog when None.
        storage_options: storage options of the ledger's store (NOTE [ storage options ] in
            :mod:`lakeckpt_tables.io.options`); for an Iceberg ledger, of its catalog's
            warehouse (NOTE [ iceberg ledger store ] in :mod:`lakeckpt_tables.ledger.iceberg`).

    Returns:
        The ledger's rows at its newest version.

    Raises:
        LedgerError: no ledger there (nothing is created), or it cannot be read.
        StorageError: the store failed (named with the URI and the kind).
    """
    from lakeckpt_tables.ledger import DEFAULT_LEDGER_DIR

    if not isinstance(target, str | os.PathLike):
        return _from_object(target)
    text = os.fspath(target)
    kind, _, rest = text.partition(":")
    if kind == "iceberg" and rest:
        return _iceberg(rest, catalog, storage_options)
    if kind == "delta" and rest:
        return _delta(rest, storage_options)
    root = text.rstrip("/")
    candidates = [f"{root}/{DEFAULT_LEDGER_DIR}", root]
    for uri in candidates:
        if _is_delta(Storage(uri, storage_options)):
            return _delta(uri, storage_options)
    if "://" not in root and not os.path.exists(root):
        raise LedgerError(f"{root} does not exist: give a checkpoint root, 'delta:<uri>' or "
                          "'iceberg:<namespace.table>' (nothing was created)")
    raise LedgerError(f"no ledger under {root}: expected a Delta table at "
                      f"{candidates[0]}; for an Iceberg ledger pass 'iceberg:<namespace.table>' "
                      "(nothing was created)")


def _is_delta(store: Storage) -> bool:
    """Whether a Delta table is at the store's root; a failing store is named, never taken
    for "no ledger here" (NOTE [ store failures ] in :mod:`lakeckpt_tables.io.failures`)."""
    from deltalake import DeltaTable

    try:
        return bool(DeltaTable.is_deltatable(store.uri, store.delta_options()))
    except OSError as e:
        raise gave_up(store.uri, "look for a ledger at", e, store.retry_seconds,
                      redact=store.redact) from e


def _delta(uri: str, storage_options: Mapping[str, str] | None) -> LedgerSnapshot:
    from deltalake.exceptions import DeltaError

    store = Storage(uri, storage_options)
    if not _is_delta(store):
        raise LedgerError(f"no Delta ledger at {uri} (nothing was created)")
    from lakeckpt_tables.ledger.delta import DeltaLedger

    try:
        # DeltaLedger checks the format version and reads the files of one loaded version:
        # the log says which are live, so files a compaction replaced are not read.
        ledger = DeltaLedger(store, create=False)
        version, files = ledger.loaded_files()
    except DeltaError as e:
        raise LedgerError(f"ledger delta:{uri} could not be read: "
                          f"{store.redact(clean(str(e)))}") from e
    paths = [path for path, _ in files]
    if not ledger.check_files(files):
        return LedgerSnapshot(f"delta:{uri}", version, ledger.read_files(paths))
    return LedgerSnapshot(f"delta:{uri}", version,
                          dataset=ledger.dataset(paths),
                          consumed=functools.partial(ledger.consumed, files),
                          damaged=functools.partial(ledger.damaged, paths))


def damage_error(target: Any, cause: Exception, *,
                 storage_options: Mapping[str, str] | None = None) -> LakeckptError:
    """The named error for a query that failed reading a lazily scanned ledger: the damaged
    data file found file by file (a Delta ledger's pages are checked as they are scanned, so
    damage surfaces inside DuckDB, which cannot say which file it was reading), or the
    store's failure."""
    from deltalake.exceptions import DeltaError

    from lakeckpt_tables.ledger.delta import DeltaLedger

    where = os.fspath(target) if isinstance(target, str | os.PathLike) else None
    if where is not None and not where.startswith("iceberg:"):
        uri = where.removeprefix("delta:")
        from lakeckpt_tables.ledger import DEFAULT_LEDGER_DIR

        for candidate in (f"{uri.rstrip('/')}/{DEFAULT_LEDGER_DIR}", uri):
            try:
                ledger = DeltaLedger(candidate, storage_options=storage_options, create=False)
            except (LedgerError, StorageError, DeltaError, OSError):  # not a ledger there
                continue
            _, files = ledger.loaded_files()
            return ledger.damaged([path for path, _ in files], cause)
    return LedgerCorruptError(f"ledger {target} could not be read: {cause}")


def _iceberg(identifier: str, catalog: Any,
             storage_options: Mapping[str, str] | None = None) -> LedgerSnapshot:
    from lakeckpt_tables.audit.registry import load_catalog
    from lakeckpt_tables.sources.iceberg import (
        DEFAULT_CATALOG_NAME,
        default_catalog,
        default_catalog_uri,
    )

    load: Callable[[], Any] | None = None
    if catalog is None:
        load = default_catalog
    elif isinstance(catalog, str):
        load = functools.partial(load_catalog, catalog)
    # read without pyiceberg where it can be (NOTE [ direct iceberg read ]), else loaded
    uri = default_catalog_uri() if catalog in (None, DEFAULT_CATALOG_NAME) else catalog
    direct = _iceberg_direct(identifier, uri, load) if load and isinstance(uri, str) else None
    if direct is not None:
        return direct
    if load is not None:
        catalog = load()
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    from lakeckpt_tables.ledger.iceberg import with_store

    warehouse = catalog.properties.get("warehouse")
    if storage_options and warehouse:
        catalog = with_store(catalog, Storage(warehouse, storage_options))
    where = f"iceberg:{identifier} (catalog {catalog.name})"
    try:
        table = catalog.load_table(identifier)
    except (NoSuchTableError, NoSuchNamespaceError) as e:
        raise LedgerError(f"no ledger {where} (nothing was created): {e}") from e
    _check_format(table.properties.get(s.FORMAT_PROPERTY), where)
    current = table.current_snapshot()
    if current is None:
        return LedgerSnapshot(f"iceberg:{identifier}", None, s.LEDGER_SCHEMA.empty_table(),
                              catalog)
    from lakeckpt_tables.ledger.iceberg_files import IcebergFiles, snapshot_files

    try:
        # lazy, as a Delta ledger's, unless delete files need pyiceberg's own scan
        files, lazy = snapshot_files(table, current.snapshot_id), IcebergFiles.of(table)
        if files is not None and lazy is not None:
            return LedgerSnapshot(f"iceberg:{identifier}", int(current.snapshot_id),
                                  catalog=catalog, dataset=lazy.dataset(files),
                                  consumed=functools.partial(lazy.consumed, files))
        rows = table.scan(snapshot_id=current.snapshot_id).to_arrow()
    except OSError as e:
        raise LedgerError(f"ledger {where} could not be read: {e}") from e
    return LedgerSnapshot(f"iceberg:{identifier}", int(current.snapshot_id), _conform(rows),
                          catalog)


def _iceberg_direct(identifier: str, uri: str,
                    load: Callable[[], Any]) -> LedgerSnapshot | None:
    """The ledger read without pyiceberg, or None (NOTE [ direct iceberg read ]); its catalog
    is loaded by ``load`` when a source lookup needs it. Read as ``IcebergFiles`` reads it: a
    lazy dataset of the live files, consumption totals from their summaries."""
    if "://" not in uri:
        return None
    from lakeckpt_tables.audit.iceberg_direct import read_direct

    found = read_direct(identifier, uri)
    if found is None or found.properties.get(s.FORMAT_PROPERTY) != str(s.LEDGER_FORMAT_VERSION):
        return None  # pyiceberg's path reads it, or names what is wrong
    from lakeckpt_tables.ledger.summary import consumed, read_summary

    fs, base = pa_fs.LocalFileSystem(), found.base

    def dataset(paths: list[str]) -> pa_ds.Dataset:
        return pa_ds.dataset(paths, schema=s.LEDGER_SCHEMA, filesystem=fs, format="parquet")

    def summary_of(path: str, size: int) -> pa.Table | None:
        relative = path[len(base) + 1:] if path.startswith(base + "/") else path
        return read_summary(fs, base, relative, size)

    def totals() -> pa.Table:
        return consumed(found.files, summary_of, lambda paths, columns: dataset(paths).to_table(
            columns=columns, filter=pc.field(s.RECORD) == s.RECORD_CONSUMPTION))

    return LedgerSnapshot(f"iceberg:{identifier}", found.snapshot_id,
                          dataset=dataset([path for path, _ in found.files]), consumed=totals,
                          load_catalog=load)


def _from_object(ledger: Any) -> LedgerSnapshot:
    describe = getattr(ledger, "describe", None)
    to_arrow = getattr(ledger, "to_arrow", None)
    if describe is None or to_arrow is None:
        raise LedgerError(f"{ledger!r} is neither a checkpoint root, a ledger spec nor a ledger")
    where = describe()
    catalog = getattr(ledger, "_catalog", None)
    # to_arrow refreshes once and reads that one snapshot
    return LedgerSnapshot(where.split(" (catalog")[0], None, _conform(to_arrow()), catalog)


def _check_format(found: str | None, where: str) -> None:
    if found != str(s.LEDGER_FORMAT_VERSION):
        raise LedgerError(f"ledger {where} has format version {found or 'none (not a ledger)'}, "
                          f"this lakeckpt-tables reads format version {s.LEDGER_FORMAT_VERSION}")


def _conform(rows: pa.Table) -> pa.Table:
    """The rows in LEDGER_SCHEMA; columns a newer writer added are kept at the end."""
    missing = [f for f in s.LEDGER_SCHEMA if f.name not in rows.column_names]
    for field in missing:
        rows = rows.append_column(field.name, pa.nulls(rows.num_rows, field.type))
    known = rows.select(s.LEDGER_SCHEMA.names).cast(s.LEDGER_SCHEMA)
    for name in rows.column_names:
        if name not in s.LEDGER_SCHEMA.names:
            known = known.append_column(name, rows[name])
    return known
