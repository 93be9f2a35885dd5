"""The source table a ledger's checkpoints name, opened again for an audit.

A checkpoint names its source by format, location and table id. A Delta table opens from its
location with the audit's storage options. An Iceberg table lives in a catalog under an
identifier the ledger does not keep, so it is found by location (or table id) among the tables
of, in order: the catalog the audit was told (``source_catalog``), the catalog the ledger
records for the source (a ``source`` event's ``catalog`` name), the ledger's own catalog, and
the default catalog.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from lakeckpt_tables.errors import LakeckptError, SourceNotFoundError

__all__ = ["delta_options", "ledger_options", "ledger_uri", "open_source", "recorded_catalogs"]


def delta_options(uri: str | None, options: Mapping[str, str] | None) -> dict[str, str] | None:
    """``options`` (as a ``CheckpointManager`` or a ``DeltaSource`` takes them) as delta-rs
    options for the Delta table at ``uri``, every setting explicit (no environment fallback)."""
    if options is None or uri is None:
        return None
    from lakeckpt_tables.io import Storage

    return Storage(uri, options).delta_options()


def ledger_options(target: Any, options: Mapping[str, str] | None) -> dict[str, str] | None:
    """``options`` as :func:`~lakeckpt_tables.audit.target.read_ledger` takes them for
    ``target``: a Delta ledger's as delta-rs options, an Iceberg ledger's as given (they
    configure its catalog's warehouse store)."""
    uri = ledger_uri(target)
    if uri is None:
        return None if options is None else dict(options)
    return delta_options(uri, options)


def ledger_uri(target: Any) -> str | None:
    """The URI a string target names (a root or ``delta:<uri>``); None for other targets."""
    if not isinstance(target, str | os.PathLike):
        return None
    text = os.fspath(target)
    if text.startswith("iceberg:"):
        return None
    return text.removeprefix("delta:")


def open_source(fmt: str, location: str, *, catalog: Any = None,
                table_id: str | None = None,
                storage_options: Mapping[str, str] | None = None,
                source_catalog: Any = None, recorded_catalog: str | None = None) -> Any:
    """A :class:`~lakeckpt_tables.DeltaSource` or :class:`~lakeckpt_tables.IcebergSource`.

    Args:
        fmt: ``"delta"`` or ``"iceberg"``.
        location: the table's root URI, as the ledger recorded it.
        catalog: the ledger's catalog (an Iceberg ledger's), searched for an Iceberg table
            after ``source_catalog`` and ``recorded_catalog``.
        table_id: the Iceberg table uuid, matched when the location differs (a moved table).
        storage_options: storage options of a Delta source (as ``DeltaSource`` takes them).
        source_catalog: the catalog holding an Iceberg source (object, name or SQLAlchemy
            URI), searched first.
        recorded_catalog: the catalog the ledger records for the source: its name, or
            ``name/namespace.table`` when the identifier is recorded too (tried first).

    Raises:
        SourceNotFoundError: no such table (for Iceberg: none at that location in any catalog
            searched).
    """
    if fmt == "delta":
        from lakeckpt_tables.sources.delta import DeltaSource

        return DeltaSource(location, storage_options=dict(storage_options)
                           if storage_options is not None else None)
    if fmt != "iceberg":
        raise SourceNotFoundError(f"source format {fmt!r} of {location} is not known")
    from lakeckpt_tables.sources.iceberg import IcebergSource

    searched = []
    hint = recorded_catalog.split("/", 1)[1] if recorded_catalog and "/" in recorded_catalog \
        else None
    for candidate in _catalogs(source_catalog, recorded_catalog, catalog):
        searched.append(repr(candidate.name))
        identifier = _find(candidate, location, table_id, hint)
        if identifier is not None:
            return IcebergSource(".".join(identifier), catalog=candidate)
    raise SourceNotFoundError(
        f"no Iceberg table at {location} in catalog {' or '.join(dict.fromkeys(searched))}: "
        "name the catalog holding the run's source table (--source-catalog NAME|URI on the "
        "command line, source_catalog= in Python)")


def _catalogs(source_catalog: Any, recorded: str | None, ledger_catalog: Any) -> Iterable[Any]:
    """The catalogs to search, first to last; each loaded only when reached."""
    from lakeckpt_tables.audit.registry import load_catalog

    if source_catalog is not None:
        # told explicitly: the only one searched, so a wrong name is not hidden by a fallback
        if isinstance(source_catalog, str) and "://" in source_catalog:
            yield from _sql_catalogs(source_catalog)
        else:
            yield load_catalog(source_catalog)
        return
    seen: set[str] = set()
    if recorded:
        try:
            found = load_catalog(recorded.split("/", 1)[0])
        except LakeckptError:
            found = None  # not configured where the audit runs: the next ones
        if found is not None:
            seen.add(found.name)
            yield found
    if ledger_catalog is not None and ledger_catalog.name not in seen:
        seen.add(ledger_catalog.name)
        yield ledger_catalog
    from lakeckpt_tables.sources.iceberg import DEFAULT_CATALOG_NAME

    if DEFAULT_CATALOG_NAME not in seen:
        yield load_catalog(None)


def _sql_catalogs(uri: str) -> Iterable[Any]:
    """Every catalog a SQL catalog database at ``uri`` holds: a pyiceberg SQL catalog sees
    only the tables of its own name, and a URI does not say which name wrote them."""
    from pyiceberg.catalog.sql import SqlCatalog

    from lakeckpt_tables.audit.registry import load_catalog

    first = load_catalog(uri)
    yield first
    try:
        import sqlalchemy

        with first.engine.connect() as connection:
            names = [r[0] for r in connection.execute(sqlalchemy.text(
                "SELECT DISTINCT catalog_name FROM iceberg_tables"))]
    except Exception:  # not pyiceberg's schema (or no table yet): only the catalog loaded
        return
    for name in sorted(set(names) - {first.name}):
        yield SqlCatalog(name, uri=uri)


def _find(catalog: Any, location: str, table_id: str | None,
          hint: str | None = None) -> tuple[str, ...] | None:
    """The identifier of the table at ``location`` (or with ``table_id``): the recorded
    ``hint`` first, else every table of the catalog's namespaces."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    from lakeckpt_tables.sources.base import local_path_or_uri

    def matches(identifier: Any) -> bool:
        table = catalog.load_table(identifier)
        return (local_path_or_uri(table.metadata.location) == location
                or str(table.metadata.table_uuid) == table_id)

    if hint:
        try:
            if matches(hint):
                return tuple(hint.split("."))
        except (NoSuchTableError, NoSuchNamespaceError, ValueError):
            pass  # renamed or dropped since: search
    for namespace in catalog.list_namespaces():
        for identifier in catalog.list_tables(namespace):
            if matches(identifier):
                return tuple(identifier)
    return None



def recorded_catalogs(scan: Callable[[Any, list[str]], Any]) -> dict[str, str]:
    """Source location (and table id) -> the catalog name the ledger's ``source`` events
    record for it.

    Args:
        scan: reads the ledger rows matching a filter, with the given columns (a
            ``LedgerSnapshot.scan``).
    """
    import json

    import pyarrow.compute as pc

    from lakeckpt_tables.ledger import schema as s

    found: dict[str, str] = {}
    events = scan((pc.field(s.RECORD) == s.RECORD_EVENT) & (pc.field(s.EVENT) == "source"),
                  [s.DETAIL])
    for text in events[s.DETAIL].to_pylist():
        detail = json.loads(text or "{}")
        if detail.get("catalog"):
            # "catalog" or "catalog/namespace.table" when the identifier is recorded too
            name = str(detail["catalog"])
            if detail.get("identifier"):
                name = f"{name}/{detail['identifier']}"
            for key in ("location", "table_id"):
                if detail.get(key):
                    found[str(detail[key])] = name
    return found
