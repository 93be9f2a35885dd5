"""The run registry, write side: a CheckpointManager keeps its run's entry up to date.

The entry's shape is :mod:`lakeckpt_tables.ledger.registry`, its readers
:mod:`lakeckpt_tables.audit.registry`. The manager registers its run when it first writes it
(a restore's claim or a commit; status ``running``; rank 0 only; a read-only restore never
does), updates it after every commit (``latest``; ``best`` for a checkpoint tagged ``best``; the
table and version read), marks it ``failed`` when the process ends on an
uncaught exception and ``finished`` when it ends normally (a SIGKILLed run stays ``running``
until it is resumed or marked with :func:`set_status`). ``LAKECKPT_REGISTRY=off`` turns
registration off.

The registry is for audits and must never stop training: an update that cannot be written (a
read-only catalog, a full disk, an unreachable database) is one warning line per run, without
a traceback, and later failures of that run are logged at debug level. Updates are applied by
one background thread, in order: importing pyiceberg and SQLAlchemy and opening the catalog cost
seconds, which must not stall a training step. :func:`flush` waits for them (it runs at exit).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import sys
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from lakeckpt_tables.checkpoint._failures import describe_failure
from lakeckpt_tables.ledger import Ledger, LedgerSpec
from lakeckpt_tables.ledger import registry as r

__all__ = ["RunRegistration", "flush", "for_run", "set_status"]

log = logging.getLogger(__name__)


def for_run(run_id: str, ledger: Ledger, *, root: str, config_hash: str,
            config: Mapping[str, Any] | None) -> RunRegistration | None:
    """The registration of a manager's run (rank 0), or None when turned off."""
    if os.environ.get("LAKECKPT_REGISTRY", "").lower() in ("0", "off", "false", "no"):
        return None
    return RunRegistration(run_id, ledger=ledger.spec, root=root, config_hash=config_hash,
                           config=config)


def set_status(catalog: Any, run_id: str, ledger: LedgerSpec | str,
               status: r.Status) -> None:
    """Set a registered run's status (e.g. ``finished`` from a job's epilogue)."""
    catalog = r.load_catalog(catalog)
    catalog.update_namespace_properties(r.namespace_of(run_id, str(ledger)), updates={
        r.P_STATUS: status, r.P_UPDATED: _now()})


class RunRegistration:
    """One run's entry in the catalog, kept up to date by its CheckpointManager (rank 0).

    Args:
        run_id: the run.
        ledger: where the run's ledger lives.
        root: the checkpoint root.
        config_hash: hash of the run configuration.
        config: the run configuration; its ``experiment`` key names the experiment.
        catalog: where to register; the default catalog when None.
    """

    def __init__(self, run_id: str, *, ledger: LedgerSpec, root: str, config_hash: str,
                 config: Mapping[str, Any] | None = None, catalog: Any = None) -> None:
        self.run_id = run_id
        self.ledger = ledger
        self._catalog = catalog
        self._namespace = r.namespace_of(run_id, str(ledger))
        self._warned = False
        self.current: r.Status = "running"
        self._update({
            r.P_RUN: run_id, r.P_LEDGER: str(ledger), r.P_ROOT: root, r.P_CONFIG: config_hash,
            r.P_EXPERIMENT: str((config or {}).get("experiment", "")),
            r.P_STATUS: "running", r.P_UPDATED: _now()}, create=True)
        _watch_for_failure(self)

    def committed(self, record: Any) -> None:
        """After a commit: ``latest`` (and ``best``) and the table version read."""
        updates = {r.P_LATEST: record.checkpoint_id, r.P_LATEST_STEP: str(record.step),
                   r.P_UPDATED: _now()}
        if record.source is not None:
            updates.update({r.P_TABLE: record.source.location, r.P_TABLE_FORMAT:
                            record.source.format, r.P_VERSION: str(record.source_version)})
        if "best" in record.tags:
            updates.update({r.P_BEST: record.checkpoint_id, r.P_BEST_STEP: str(record.step)})
        self.current = "running"
        updates[r.P_STATUS] = self.current
        self._update(updates)

    def branched(self, parent_run: str, parent_step: int) -> None:
        """The run starts from ``parent_run``'s checkpoint at ``parent_step``."""
        self._update({r.P_PARENT: f"{parent_run}@{parent_step}", r.P_UPDATED: _now()})

    def status(self, status: r.Status) -> None:
        """Set the run's status."""
        self.current = status
        self._update({r.P_STATUS: status, r.P_UPDATED: _now()})

    def _update(self, updates: dict[str, str], *, create: bool = False) -> None:
        _worker().put((self, dict(updates), create))

    def _apply(self, updates: dict[str, str], create: bool) -> None:
        from pyiceberg.exceptions import NoSuchNamespaceError

        try:
            catalog = r.load_catalog(self._catalog)
            self._catalog = catalog
            if create:
                catalog.create_namespace_if_not_exists((r.NAMESPACE,))
                catalog.create_namespace_if_not_exists(self._namespace)
            catalog.update_namespace_properties(self._namespace, updates=updates)
        except NoSuchNamespaceError:
            log.info("run %s: its registry entry was removed; not re-created", self.run_id)
        except Exception as exc:  # the registry is for audits: it must never stop training
            level = logging.DEBUG if self._warned else logging.WARNING
            self._warned = True
            log.log(level, "run %s: the run registry cannot be written, training goes on "
                    "(`lakeckpt runs` will not show this run's latest state): %s",
                    self.run_id, " ".join(describe_failure(exc).split())[:500])


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
