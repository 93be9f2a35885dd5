"""Runs registered in a pyiceberg SQL catalog, so audits find every run across roots.

Each run is one namespace ``lakeckpt_runs.<run>`` of the catalog (the embedded SQLite catalog
by default, PostgreSQL in a deployment), its properties say what the run is: run id,
experiment, config hash, ledger, source table and version, status and the ``best`` and
``latest`` checkpoints. Namespace properties are rows in the catalog's database: registering
writes no file, and works the same for Delta and Iceberg ledgers.

``CheckpointManager`` registers its run when created (status ``running``; rank 0 only),
updates it after every commit (``latest``; ``best`` for a checkpoint tagged ``best``; the
table and version read), marks it ``failed`` when the process ends on an uncaught exception
and ``finished`` when it ends normally (a SIGKILLed run stays ``running`` until it is resumed
or marked with :func:`set_status`). A registry that cannot be reached never fails training: it
is logged. ``LAKECKPT_REGISTRY=off`` turns registration off.

Updates are applied by one background thread, in order: importing pyiceberg and SQLAlchemy
and opening the catalog cost seconds, which must not stall a training step. :func:`flush`
waits for them (it runs at exit too).
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import queue
import re
import sys
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Literal

from lakeckpt_tables.errors import LedgerError

__all__ = [
    "NAMESPACE",
    "RunRegistration",
    "flush",
    "for_manager",
    "load_catalog",
    "registered_ledgers",
    "registered_runs",
    "set_status",
]

log = logging.getLogger(__name__)

NAMESPACE = "lakeckpt_runs"
"""Parent namespace of the registered runs."""

Status = Literal["running", "finished", "failed"]

P_RUN = "run_id"
P_EXPERIMENT = "experiment"
P_CONFIG = "config_hash"
P_LEDGER = "ledger"
P_ROOT = "root"
P_TABLE = "table_uri"
P_TABLE_FORMAT = "table_format"
P_VERSION = "table_version"
P_STATUS = "status"
P_LATEST = "latest"
P_LATEST_STEP = "latest_step"
P_BEST = "best"
P_BEST_STEP = "best_step"
P_UPDATED = "updated_at"
PROPERTIES = (P_RUN, P_EXPERIMENT, P_CONFIG, P_LEDGER, P_ROOT, P_TABLE_FORMAT, P_TABLE,
              P_VERSION, P_STATUS, P_LATEST, P_LATEST_STEP, P_BEST, P_BEST_STEP, P_UPDATED)
"""The properties of a registered run, in display order."""


def load_catalog(catalog: Any = None) -> Any:
    """A pyiceberg catalog: given, by name, by SQLAlchemy URI, or the default one.

    Args:
        catalog: None or ``"lakeckpt"`` for the default embedded catalog; a catalog name
            pyiceberg knows (``~/.pyiceberg.yaml``, ``PYICEBERG_CATALOG__<NAME>__*``); a
            ``sqlite:///`` or ``postgresql+psycopg://`` URI for a SQL catalog there; or a
            catalog object, returned as is.

    Raises:
        LedgerError: the catalog cannot be loaded.
    """
    if catalog is not None and not isinstance(catalog, str):
        return catalog
    from lakeckpt_tables.sources.iceberg import DEFAULT_CATALOG_NAME, default_catalog

    try:
        if catalog is None or catalog == DEFAULT_CATALOG_NAME:
            return default_catalog()  # its configuration may change: not cached
        if "://" in catalog:
            from pyiceberg.catalog.sql import SqlCatalog

            return SqlCatalog(DEFAULT_CATALOG_NAME, uri=catalog)
        from pyiceberg.catalog import load_catalog as pyiceberg_load

        return pyiceberg_load(catalog)
    except Exception as e:  # pyiceberg raises ValueError, SQLAlchemy errors, OSError...
        raise LedgerError(f"catalog {catalog!r} cannot be loaded: {e}") from e


def _namespace(run_id: str, ledger: str) -> tuple[str, str]:
    # a run id may hold dots (namespace separators): keep it readable, make it unique per ledger
    digest = hashlib.sha256(ledger.encode()).hexdigest()[:8]
    return NAMESPACE, f"{re.sub(r'[^A-Za-z0-9_-]', '_', run_id)}-{digest}"


def registered_runs(catalog: Any = None) -> list[dict[str, str]]:
    """Every run registered in ``catalog``, as property dicts, by run id."""
    from pyiceberg.exceptions import NoSuchNamespaceError

    catalog = load_catalog(catalog)
    try:
        children = catalog.list_namespaces(NAMESPACE)
    except NoSuchNamespaceError:
        return []
    runs = []
    for namespace in children:
        props = dict(catalog.load_namespace_properties(namespace))
        if P_RUN in props:
            runs.append({k: props.get(k, "") for k in PROPERTIES})
    return sorted(runs, key=lambda r: (r[P_RUN], r[P_LEDGER]))


def registered_ledgers(catalog: Any = None) -> list[str]:
    """The distinct ledgers of the runs registered in ``catalog``."""
    return sorted({r[P_LEDGER] for r in registered_runs(catalog) if r[P_LEDGER]})


def set_status(catalog: Any, run_id: str, ledger: str, status: Status) -> None:
    """Set a registered run's status (e.g. ``finished`` from a job's epilogue)."""
    catalog = load_catalog(catalog)
    catalog.update_namespace_properties(_namespace(run_id, ledger), updates={
        P_STATUS: status, P_UPDATED: _now()})


def for_manager(manager: Any, config: Mapping[str, Any] | None) -> RunRegistration | None:
    """The registration of a CheckpointManager's run (rank 0), or None when turned off."""
    if os.environ.get("LAKECKPT_REGISTRY", "").lower() in ("0", "off", "false", "no"):
        return None
    if manager.ledger is None:
        return None
    ledger = manager.ledger.describe().split(" (catalog ")[0]
    return RunRegistration(manager.run_id, ledger=ledger, root=manager.root,
                           config_hash=manager.config_hash, config=config)


class RunRegistration:
    """One run's entry in the catalog, kept up to date by its CheckpointManager (rank 0).

    Args:
        run_id: the run.
        ledger: the run's ledger spec (``delta:<uri>`` or ``iceberg:<ns.table>``).
        root: the checkpoint root.
        config_hash: hash of the run configuration.
        config: the run configuration; its ``experiment`` key names the experiment.
        catalog: where to register; the default catalog when None.
    """

    def __init__(self, run_id: str, *, ledger: str, root: str, config_hash: str,
                 config: Mapping[str, Any] | None = None, catalog: Any = None) -> None:
        self.run_id = run_id
        self.ledger = ledger
        self._catalog = catalog
        self._namespace = _namespace(run_id, ledger)
        self.current: Status = "running"
        self._initial = {
            P_RUN: run_id, P_LEDGER: ledger, P_ROOT: root, P_CONFIG: config_hash,
            P_EXPERIMENT: str((config or {}).get("experiment", "")), P_STATUS: "running",
            P_UPDATED: _now()}
        self._update(self._initial, create=True)
        _watch_for_failure(self)

    def committed(self, record: Any) -> None:
        """After a commit: ``latest`` (and ``best``) and the table version read."""
        updates = {P_LATEST: record.checkpoint_id, P_LATEST_STEP: str(record.step),
                   P_UPDATED: _now()}
        if record.source is not None:
            updates.update({P_TABLE: record.source.location, P_TABLE_FORMAT:
                            record.source.format, P_VERSION: str(record.source_version)})
        if "best" in record.tags:
            updates.update({P_BEST: record.checkpoint_id, P_BEST_STEP: str(record.step)})
        self.current = "running"
        updates[P_STATUS] = self.current
        self._update(updates)

    def status(self, status: Status) -> None:
        """Set the run's status."""
        self.current = status
        self._update({P_STATUS: status, P_UPDATED: _now()})

    def _update(self, updates: dict[str, str], *, create: bool = False) -> None:
        _worker().put((self, dict(updates), create))

    def _apply(self, updates: dict[str, str], create: bool) -> None:
        from pyiceberg.exceptions import NoSuchNamespaceError

        try:
            catalog = load_catalog(self._catalog)
            self._catalog = catalog
            if create:
                catalog.create_namespace_if_not_exists((NAMESPACE,))
                catalog.create_namespace_if_not_exists(self._namespace)
            catalog.update_namespace_properties(self._namespace, updates=updates)
        except NoSuchNamespaceError:
            log.info("run %s: its registry entry was removed; not re-created", self.run_id)
        except Exception:  # the registry is for audits: it must never stop training
            log.warning("run %s: could not update its entry in the run registry",
                        self.run_id, exc_info=True)


_QUEUE: queue.Queue[tuple[RunRegistration, dict[str, str], bool]] | None = None
_QUEUE_LOCK = threading.Lock()


def _worker() -> queue.Queue[tuple[RunRegistration, dict[str, str], bool]]:
    global _QUEUE
    with _QUEUE_LOCK:
        if _QUEUE is None:
            _QUEUE = queue.Queue()
            threading.Thread(target=_drain, args=(_QUEUE,), name="lakeckpt-registry",
                             daemon=True).start()
        return _QUEUE


def _drain(updates: queue.Queue[tuple[RunRegistration, dict[str, str], bool]]) -> None:
    while True:
        registration, changes, create = updates.get()
        try:
            registration._apply(changes, create)
        finally:
            updates.task_done()


def flush(timeout: float = 30.0) -> bool:
    """Wait until every registry update of this process is applied; False on timeout."""
    pending = _QUEUE
    if pending is None:
        return True
    done = threading.Event()

    def wait() -> None:
        pending.join()
        done.set()

    threading.Thread(target=wait, daemon=True).start()
    return done.wait(timeout)


_WATCHED: list[RunRegistration] = []


def _watch_for_failure(registration: RunRegistration) -> None:
    """Mark runs of this process ``failed`` if it ends on an uncaught exception, ``finished``
    if it ends normally."""
    if not _WATCHED:
        previous = sys.excepthook
        atexit.register(_finish_all)

        def hook(kind: type[BaseException], value: BaseException,
                 tb: TracebackType | None) -> None:
            for reg in _WATCHED:
                if reg.current == "running":
                    reg.status("failed")
            previous(kind, value, tb)

        sys.excepthook = hook
    _WATCHED.append(registration)


def _finish_all() -> None:
    for reg in _WATCHED:
        if reg.current == "running":
            reg.status("finished")
    flush()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
