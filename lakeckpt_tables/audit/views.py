"""``connect``: a DuckDB connection whose views answer progress and audit questions in SQL.

DuckDB cannot download its delta or iceberg extensions here, and reading a ledger's Parquet
files by globbing would count twice the rows a compaction rewrote. So each ledger is read once,
through its table format's reader, at one version (:mod:`lakeckpt_tables.audit.target`), and
registered as the Arrow table ``ledger``; the views are plain SQL shipped in ``catalog/*.sql``
and documented column by column in ``catalog/README.md``.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from lakeckpt_tables.audit.sources import (
    delta_options,
    ledger_options,
    open_source,
    recorded_catalogs,
)
from lakeckpt_tables.audit.target import LedgerSnapshot, read_ledger
from lakeckpt_tables.errors import AuditError, LakeckptError, LedgerError, StorageError
from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.ledger.summary import SUMMARY_SCHEMA

__all__ = ["VIEWS", "connect", "connect_snapshots", "stale_threshold"]

VIEWS = ("checkpoints", "consumption", "events", "progress", "runs", "recoveries",
         "follow_lag", "deletions")
"""The views of a connection (see ``catalog/README.md``)."""

_ORDER = ("checkpoint_status", "run_activity", *VIEWS)
"""The order their SQL is run in (later ones use earlier ones; ``_checkpoint_status`` and
``_run_activity`` are internal: the status of every checkpoint, and whether each run is still
committing)."""

STALE_FACTOR = "lakeckpt_stale_factor"
STALE_MIN_S = "lakeckpt_stale_min_s"
"""DuckDB variables of the stale threshold (``run_activity.sql``): a run is stale when its
last commit is older than ``max(factor * median save interval, min_s)`` seconds."""

DEFAULT_STALE_FACTOR = 3.0
DEFAULT_STALE_MIN_S = 60.0
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def stale_threshold(stale_after: str | float | None) -> tuple[float, float]:
    """``(factor, min_s)`` of a stale threshold: ``"5x"`` (5 times the run's median save
    interval), seconds as a number or with a unit (``"90s"``, ``"10m"``, ``"2h"``, ``"1d"``),
    or None for the default (3 times the interval, at least a minute).

    Raises:
        AuditError: not a multiple or a duration.
    """
    if stale_after is None:
        return DEFAULT_STALE_FACTOR, DEFAULT_STALE_MIN_S
    text = str(stale_after).strip().lower()
    try:
        if text.endswith("x"):
            factor = float(text[:-1])
            if factor > 0:
                return factor, 0.0
        else:
            unit = _UNITS.get(text[-1:])
            seconds = float(text[:-1]) * unit if unit else float(text)
            if seconds >= 0:
                return 0.0, seconds
    except ValueError:
        pass
    raise AuditError(f"stale threshold {stale_after!r} is neither a multiple of the save "
                     "interval (e.g. 3x) nor a duration (e.g. 600, 90s, 10m, 2h)")

PASS_SIZES_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("source_key", pa.string()), ("segment", pa.int64()),
    ("epoch", pa.int64()), ("rows", pa.int64()), ("delivered", pa.int64()),
    ("from_version", pa.int64()), ("to_version", pa.int64()), ("origin", pa.string()),
    ("tokens", pa.int64()), ("location", pa.string()), ("table_id", pa.string()),
])
"""What ``progress`` divides by, per run, Mixture source and pass: ``rows`` live, ``delivered``
of them, and ``tokens`` a packed pass delivers (its ``round`` event's; null otherwise); and what
the ``consumption`` view names the pass's source by: the version read (``to_version``) and the
table (``location``, ``table_id``: the ``source`` event's)."""
SOURCE_VERSIONS_SCHEMA = pa.schema([
    ("location", pa.string()), ("latest_version", pa.int64()),
    ("checked_at", pa.timestamp("us", tz="UTC")),
])
MISSING_MODELS_SCHEMA = pa.schema([("run_id", pa.string()), ("model_location", pa.string())])
LEDGERS_SCHEMA = pa.schema([("ledger", pa.string()), ("version", pa.int64()),
                            ("rows", pa.int64())])


def connect(target: Any = None, *, catalog: Any = None,
            storage_options: Mapping[str, str] | None = None, source_catalog: Any = None,
            stale_after: str | float | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection over one consistent version of a ledger (or of every registered run).

    Views: ``checkpoints``, ``consumption``, ``events``, ``progress``, ``runs``,
    ``recoveries``, ``follow_lag`` (see ``catalog/README.md``); tables: ``ledger`` (the raw
    rows) and ``ledgers`` (which ledger versions were read). An empty ledger gives empty views.

    Args:
        target: a checkpoint root, ``"delta:<uri>"``, ``"iceberg:<namespace.table>"``, or a
            ledger object. None with ``catalog``: every ledger the runs registered in that
            catalog name (:mod:`lakeckpt_tables.audit.registry`).
        catalog: a pyiceberg catalog (or the name or SQL catalog URI of one pyiceberg can
            load): where an ``iceberg:`` target lives, and, without a target, whose
            registered runs to read. A URI is loaded only when a lookup needs the catalog
            (NOTE [ direct iceberg read ] in :mod:`lakeckpt_tables.audit.iceberg_direct`).
        storage_options: storage options of the ledger, the checkpoints and Delta sources,
            as ``CheckpointManager(storage_options=)`` takes them; None for the environment's.
        source_catalog: the catalog holding the runs' Iceberg sources when it is neither the
            one the ledger records nor the ledger's (object, name or SQLAlchemy URI).
        stale_after: when a run that stopped committing is ``stale``: a multiple of its median
            save interval (``"3x"``), or seconds (``600``, ``"10m"``, ``"2h"``); by default 3
            times the interval and at least one minute (:func:`stale_threshold`).

    Returns:
        The connection; the caller closes it.

    Raises:
        LedgerError: no ledger where ``target`` points (nothing is created), or it cannot be
            read.
        AuditError: ``stale_after`` is not a multiple or a duration.
    """
    if target is None:
        catalog = _load_catalog(catalog)
        if catalog is None:
            raise LedgerError("connect() needs a target (checkpoint root or ledger spec) or "
                              "catalog= to read every run registered there")
        from lakeckpt_tables.audit.registry import registered_ledgers

        snapshots = [read_ledger(spec, catalog=catalog,
                                 storage_options=ledger_options(spec, storage_options))
                     for spec in registered_ledgers(catalog)]
    else:
        snapshots = [read_ledger(target, catalog=catalog,
                                 storage_options=ledger_options(target, storage_options))]
    return connect_snapshots(snapshots, storage_options=storage_options,
                             source_catalog=source_catalog, stale_after=stale_after)


def connect_snapshots(snapshots: Iterable[LedgerSnapshot], *,
                      look_up_sources: bool = True,
                      storage_options: Mapping[str, str] | None = None,
                      source_catalog: Any = None,
                      stale_after: str | float | None = None) -> duckdb.DuckDBPyConnection:
    """The connection of :func:`connect` over ledger versions already read.

    Args:
        snapshots: the ledger versions.
        look_up_sources: open the source tables the runs read for what the ledger does not
            hold (sizes of passes without a ``round`` event, the tables' newest versions).
        storage_options, source_catalog, stale_after: as :func:`connect` takes them.
    """
    snapshots = list(snapshots)
    factor, floor = stale_threshold(stale_after)
    con = duckdb.connect()
    # the stale threshold of the views (runs.sql): variables, so a query may set its own
    con.execute(f"SET VARIABLE {STALE_FACTOR} = {factor}")
    con.execute(f"SET VARIABLE {STALE_MIN_S} = {floor}")
    if len(snapshots) == 1 and snapshots[0].dataset is not None:
        # lazy: DuckDB pushes each view's filters and columns down into the scan
        con.register("ledger", snapshots[0].dataset)
    else:
        con.register("ledger", pa.concat_tables(
            [sn.rows.select(s.LEDGER_SCHEMA.names) for sn in snapshots])
            if snapshots else s.LEDGER_SCHEMA.empty_table())
    con.register("ledgers", pa.table({
        "ledger": [sn.where for sn in snapshots], "version": [sn.version for sn in snapshots],
        "rows": [_count(sn) for sn in snapshots]}, schema=LEDGERS_SCHEMA))
    con.register("_consumed", pa.concat_tables([sn.consumed() for sn in snapshots])
                 if snapshots else SUMMARY_SCHEMA.empty_table())

    def scan(where: pc.Expression, columns: list[str]) -> pa.Table:
        parts = [sn.scan(where, columns) for sn in snapshots]
        return pa.concat_tables(parts) if parts else \
            s.LEDGER_SCHEMA.empty_table().select(columns)

    def ledger_catalog() -> Any:  # loaded only when a source lookup needs it
        return next((sn.catalog for sn in snapshots if sn.catalog is not None), None)

    con.register("_pass_sizes", pass_sizes(scan, look_up_sources=look_up_sources,
                                           ledger_catalog=ledger_catalog,
                                           storage_options=storage_options,
                                           source_catalog=source_catalog))
    con.register("_source_versions", _source_versions(scan, storage_options)
                 if look_up_sources else SOURCE_VERSIONS_SCHEMA.empty_table())
    con.register("_missing_models", _missing_models(snapshots, scan, storage_options)
                 if look_up_sources else MISSING_MODELS_SCHEMA.empty_table())
    for name in _ORDER:
        con.execute(view_sql(name))
    return con


def _count(snapshot: LedgerSnapshot) -> int:
    if snapshot.dataset is None:
        return int(snapshot.rows.num_rows)
    return int(snapshot.dataset.count_rows())


def view_sql(name: str) -> str:
    """The SQL of view ``name``, as shipped in ``catalog/<name>.sql``."""
    return resources.files("lakeckpt_tables.catalog").joinpath(f"{name}.sql").read_text()


def _load_catalog(catalog: Any) -> Any:
    if catalog is None or not isinstance(catalog, str):
        return catalog
    from lakeckpt_tables.audit.registry import load_catalog

    return load_catalog(catalog)


# ------------------------------------------------------------------------------ pass sizes


Scan = Callable[[pc.Expression, list[str]], pa.Table]
"""Reads the ledger rows matching a filter, with the given columns."""


def pass_sizes(scan: Scan, *, look_up_sources: bool = True,
               ledger_catalog: Callable[[], Any] | None = None,
               storage_options: Mapping[str, str] | None = None,
               source_catalog: Any = None) -> pa.Table:
    """Rows in each pass (segment, epoch) of each run and Mixture source (``source_key``,
    null for a one-table run): what ``progress`` divides by.

    From ``round`` events when the ledger has them; else follow segments from ``segment``
    events, and the pinned snapshot's epochs from the source's metadata (no data is read),
    less the rows ``undelivered`` events name. A packed pass (its ``round`` event counts
    ``tokens``) delivers its rows and tokens less every tail its ``undelivered`` events name:
    an elastic re-plan adds one (NOTE [ packed accounting ] in ``checkpoint/consumption.py``).
    An event recorded again by a resumed run (the same detail) counts once.
    """
    events = scan(pc.field(s.RECORD) == s.RECORD_EVENT,
                  [s.RUN_ID, s.EVENT, s.DETAIL, s.STEP]).to_pylist()
    out: dict[tuple[str, int, int], dict[str, Any]] = {}
    tails: dict[Any, dict[str, tuple[int, int]]] = {}  # pass -> distinct tails: rows, tokens
    packed: set[Any] = set()
    segments: dict[tuple[str, int], dict[str, Any]] = {}
    tables: dict[Any, dict[str, Any]] = {}  # run (or (run, source key)) -> its table
    for e in events:
        detail = json.loads(e[s.DETAIL] or "{}")
        run = e[s.RUN_ID]
        if detail.get("source_key") is not None:  # a Mixture source: keyed (run, source key)
            run = (run, detail["source_key"])
        if e[s.EVENT] == "round":
            key = (run, int(detail["segment"]), int(detail["epoch"]))
            out[key] = {"rows": detail.get("rows"), "delivered": detail.get("delivered"),
                        "from_version": detail.get("base_version"),
                        "to_version": detail.get("version"), "origin": "round",
                        "tokens": detail.get("tokens")}
            if detail.get("tokens") is not None:
                packed.add(key)
        elif e[s.EVENT] == "segment":
            segments[(run, int(detail["segment"]))] = detail
        elif e[s.EVENT] == "source":
            tables[run] = {"location": detail.get("location"),
                           "table_id": detail.get("table_id")}
        elif e[s.EVENT] == "undelivered":
            key = (run, int(detail["segment"]), int(detail["epoch"]))
            tails.setdefault(key, {})[e[s.DETAIL]] = (int(detail.get("rows", 0)),
                                                      int(detail.get("tokens", 0)))
    undelivered = {k: sum(r for r, _ in v.values()) for k, v in tails.items()}
    for key in packed:
        size = out[key]
        size["delivered"] = int(size["rows"]) - undelivered.get(key, 0)
        size["tokens"] = int(size["tokens"]) - sum(n for _, n in tails.get(key, {}).values())
    for (run, segment), detail in segments.items():
        key = (run, segment, 0)
        if key not in out:
            live = int(detail["rows"])
            out[key] = {"rows": live, "delivered": live - undelivered.get(key, 0),
                        "from_version": detail.get("from_version"),
                        "to_version": detail.get("to_version"), "origin": "segment"}
    if look_up_sources:
        for key, size in _pinned_sizes(scan, out, ledger_catalog, storage_options,
                                       source_catalog).items():
            size["delivered"] = size["rows"] - undelivered.get(key, 0)
            out[key] = size
    for key, size in out.items():
        size.update(tables.get(key[0], {}))
    names = [f.name for f in PASS_SIZES_SCHEMA][4:]
    runs = [k[0] if isinstance(k[0], str) else k[0][0] for k in out]
    source_keys = [None if isinstance(k[0], str) else k[0][1] for k in out]
    return pa.table({
        "run_id": runs, "source_key": source_keys, "segment": [k[1] for k in out],
        "epoch": [k[2] for k in out], **{n: [v.get(n) for v in out.values()] for n in names},
    }, schema=PASS_SIZES_SCHEMA)


def _pinned_sizes(scan: Scan, known: dict[tuple[str, int, int], Any],
                  ledger_catalog: Callable[[], Any] | None,
                  storage_options: Mapping[str, str] | None,
                  source_catalog: Any) -> dict[tuple[str, int, int], dict[str, Any]]:
    """Epochs of the pinned snapshot (segment 0) of every run, sized from table metadata."""
    is_checkpoint = pc.field(s.RECORD) == s.RECORD_CHECKPOINT
    steps = scan(is_checkpoint, [s.RUN_ID, s.STEP])
    steps = steps.group_by(s.RUN_ID, use_threads=False).aggregate([(s.STEP, "max")])
    if not steps.num_rows:
        return {}
    # each run's newest checkpoint, and only its reader state (states are kilobytes each)
    newest = functools.reduce(operator.or_, [
        (pc.field(s.RUN_ID) == run) & (pc.field(s.STEP) == step) for run, step in
        zip(steps[s.RUN_ID].to_pylist(), steps[f"{s.STEP}_max"].to_pylist(), strict=True)])
    found = scan(is_checkpoint & newest, [s.RUN_ID, s.STEP, s.READER_STATE, s.SOURCE_FORMAT,
                                          s.SOURCE_LOCATION, s.SOURCE_VERSION])
    latest = {c[s.RUN_ID]: c for c in found.to_pylist() if c[s.READER_STATE]}
    if not latest:
        return {}
    recorded = recorded_catalogs(scan)
    # the reader state's decoder imports the reader (and torch): only when there is one
    from lakeckpt_tables.reader.state import decode_state

    sizes: dict[tuple[str, int], int | None] = {}
    out: dict[tuple[str, int, int], dict[str, Any]] = {}
    for run, c in latest.items():
        try:
            config = decode_state(c[s.READER_STATE]).get("config", {})
        except LakeckptError:
            continue
        if config.get("refresh") is not None:
            continue  # each epoch pins its own version: only 'round' events size them
        epochs = 1 if config.get("follow") else int(config.get("epochs", 1))
        missing = [e for e in range(epochs) if (run, 0, e) not in known]
        if not missing or c[s.SOURCE_VERSION] is None:
            continue
        where = (c[s.SOURCE_FORMAT], c[s.SOURCE_LOCATION], int(c[s.SOURCE_VERSION]))
        key = (where[1], where[2])
        if key not in sizes:
            ledger = ledger_catalog() if ledger_catalog and where[0] == "iceberg" else None
            sizes[key] = _snapshot_rows(*where, catalog=ledger,
                                        storage_options=storage_options,
                                        source_catalog=source_catalog,
                                        recorded=recorded.get(where[1]))
        size = sizes[key]
        if size is None:
            continue
        for e in missing:
            out[(run, 0, e)] = {"rows": size, "from_version": None, "to_version": where[2],
                                "origin": "table"}
    return out


def _snapshot_rows(fmt: str, location: str, version: int, *, catalog: Any,
                   storage_options: Mapping[str, str] | None, source_catalog: Any,
                   recorded: str | None) -> int | None:
    try:
        source = open_source(fmt, location, catalog=catalog, storage_options=storage_options,
                             source_catalog=source_catalog, recorded_catalog=recorded)
        return int(source.snapshot(version).rows)
    except LakeckptError:
        return None


def _source_versions(scan: Scan, storage_options: Mapping[str, str] | None) -> pa.Table:
    """Each Delta source's newest version now (Iceberg snapshot ids have no order: skipped)."""
    checkpoints = scan(pc.field(s.RECORD) == s.RECORD_CHECKPOINT,
                       [s.SOURCE_FORMAT, s.SOURCE_LOCATION])
    pairs = {(f, loc) for f, loc in zip(checkpoints[s.SOURCE_FORMAT].to_pylist(),
                                        checkpoints[s.SOURCE_LOCATION].to_pylist(), strict=True)
             if loc is not None}
    found: dict[str, list[Any]] = {"location": [], "latest_version": [], "checked_at": []}
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    for fmt, location in sorted(pairs):
        if fmt != "delta":
            continue
        try:
            version = DeltaTable(location, storage_options=delta_options(
                location, storage_options)).version()
        except (DeltaError, OSError):
            continue
        found["location"].append(location)
        found["latest_version"].append(version)
        found["checked_at"].append(datetime.now(UTC))
    return pa.table(found, schema=SOURCE_VERSIONS_SCHEMA)


def _missing_models(snapshots: list[LedgerSnapshot], scan: Scan,
                    storage_options: Mapping[str, str] | None) -> pa.Table:
    """Model locations of checkpoints whose files are gone from their checkpoint root.

    Only ledgers kept under a checkpoint root (``<root>/_ledger``) say where their model files
    are; a run whose directory is missing altogether (a ledger copied elsewhere, simulated
    checkpoints) is not judged. One listing per run directory.
    """
    from lakeckpt_tables.io import Storage
    from lakeckpt_tables.ledger import DEFAULT_LEDGER_DIR

    roots = [sn.where.removeprefix("delta:").rstrip("/").removesuffix(f"/{DEFAULT_LEDGER_DIR}")
             for sn in snapshots if sn.where.startswith("delta:")
             and sn.where.rstrip("/").endswith(f"/{DEFAULT_LEDGER_DIR}")]
    found: dict[str, list[str]] = {"run_id": [], "model_location": []}
    if len(roots) != 1 or len(snapshots) != 1:
        return pa.table(found, schema=MISSING_MODELS_SCHEMA)
    store = Storage(roots[0], storage_options)
    records = scan(pc.field(s.RECORD) == s.RECORD_CHECKPOINT, [s.RUN_ID, s.MODEL_LOCATION])
    by_run: dict[str, list[str]] = {}
    for run, location in zip(records[s.RUN_ID].to_pylist(),
                             records[s.MODEL_LOCATION].to_pylist(), strict=True):
        if location:
            by_run.setdefault(run, []).append(location)
    for run, locations in sorted(by_run.items()):
        # each location judged by the listing of its directory: <run>/ for the manager's
        # checkpoints, the root itself for a trainer's (checkpoint-20, step=20.ckpt)
        homes = {loc.rstrip("/").rpartition("/")[0] for loc in locations}
        for directory in sorted(homes):
            try:
                names = store.list(directory)
            except (StorageError, OSError):
                continue  # the root cannot be listed now: not judged (the views still work)
            if not names:
                continue  # the run's directory is not here: not judged
            present = {f"{directory}/{n}" if directory else n for n in names}
            for loc in locations:
                if loc.rstrip("/").rpartition("/")[0] == directory \
                        and loc.rstrip("/") not in present:
                    found["run_id"].append(run)
                    found["model_location"].append(loc)
    return pa.table(found, schema=MISSING_MODELS_SCHEMA)
