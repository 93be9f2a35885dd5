"""Which checkpoints trained on the rows a predicate selects: the deletion-request audit.

For every checkpoint of every run that read the given table (by default: each run's own
tables, as its ledger records them: a Mixture's every source), the exact rows it trained on are
replayed from the plan (:mod:`lakeckpt_tables.audit.replay`); the predicate is evaluated by
DuckDB on the row groups those rows come from, read as the reader read them (deletes applied).
A packed reader's checkpoint trained on a row if it delivered any token of it (a document cut
between two checkpoints: both). A checkpoint's model has seen a row if it or any checkpoint of
its lineage trained on it, the lineage of a branched run going on into the run it was branched
from (:mod:`lakeckpt_tables.audit.lineage`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakeckpt_tables.audit.lineage import Branch, branches_of, lineage, parent_of, reader_parent
from lakeckpt_tables.audit.replay import checkpoint_rows
from lakeckpt_tables.audit.sources import ledger_options
from lakeckpt_tables.audit.target import read_ledger
from lakeckpt_tables.errors import AuditError, SourceNotFoundError
from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.ledger.records import (
    EXCLUDED_EVENT,
    CheckpointRecord,
    checkpoints_from_arrow,
)

__all__ = ["MATCHES_SCHEMA", "ROW_EXPOSURE_SCHEMA", "RunExposure", "exposure", "matches_of",
           "row_exposure", "trained_on"]

MATCHES_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("checkpoint_id", pa.string()), ("step", pa.int64()),
    ("rows", pa.int64()),
])
"""Columns of :func:`trained_on`: matching rows each checkpoint trained on since its parent."""

_ROW = "__lakeckpt_row"


def trained_on(target: Any, predicate: str, table: str | None = None, *, catalog: Any = None,
               storage_options: Mapping[str, str] | None = None,
               source_catalog: Any = None) -> pa.Table:
    """Checkpoints that trained on rows matching ``predicate``, with counts.

    Args:
        target: a checkpoint root, a ledger spec or a ledger object.
        predicate: a SQL boolean expression over the table's columns (DuckDB dialect), e.g.
            ``"user_id = 42"``.
        table: only checkpoints that read this table: a Delta URI, or
            ``"iceberg:<namespace.table>"``. None: every checkpoint, each over the source
            table its run read (as the ledger records it).
        catalog: pyiceberg catalog of an Iceberg ledger.
        storage_options: storage options of the ledger and Delta sources (as
            ``CheckpointManager`` takes them).
        source_catalog: the catalog of Iceberg sources (see
            :func:`~lakeckpt_tables.audit.sources.open_source`).

    Returns:
        One row per checkpoint that trained on at least one matching row, in
        :data:`MATCHES_SCHEMA`, ordered by run and step.

    Raises:
        LedgerError: no ledger there.
        SourceNotFoundError: a table cannot be opened.
        AuditError: the predicate is not valid SQL over the table's columns.
    """
    snapshot = read_ledger(target, catalog=catalog,
                           storage_options=ledger_options(target, storage_options))
    out: dict[str, list[Any]] = {n: [] for n in MATCHES_SCHEMA.names}
    for record, hit in _hits(snapshot, predicate, table, catalog, storage_options,
                             source_catalog):
        count = sum(len(rows) for rows in hit.values())
        if count:
            for name, value in zip(MATCHES_SCHEMA.names,
                                   (record.run_id, record.checkpoint_id, record.step, count),
                                   strict=True):
                out[name].append(value)
    return pa.table(out, schema=MATCHES_SCHEMA)


def _hits(snapshot: Any, predicate: str, table: str | None, catalog: Any,
          storage_options: Mapping[str, str] | None,
          source_catalog: Any) -> Iterator[tuple[CheckpointRecord, dict[tuple[Any, ...],
                                                                         np.ndarray[Any, Any]]]]:
    """Every checkpoint, and the matching rows it trained on since its parent: by (source
    key, segment, epoch, file, row group, rows), the live rows (a row counts once per
    checkpoint and pass: two slices that each delivered tokens of one packed document both
    name it)."""
    sources: dict[str, Any] = {}  # table id -> source
    only = None
    if table is not None:
        given = _open_table(table, source_catalog if source_catalog is not None
                            else snapshot.catalog if catalog is None else catalog,
                            storage_options)
        only = given.snapshot(None).identity.table_id
        sources[only] = given
    records = checkpoints_from_arrow(snapshot.rows)
    branches = branches_of(snapshot)
    datasets: dict[Any, Any] = {}
    matches: dict[tuple[str, int, int], np.ndarray[Any, Any]] = {}
    for record in records:
        parent = reader_parent(records, record, branches)
        replayed = checkpoint_rows(record, parent, snapshot, sources=sources, only=only,
                                   storage_options=storage_options, datasets=datasets,
                                   source_catalog=source_catalog)
        hit: dict[tuple[Any, ...], list[np.ndarray[Any, Any]]] = {}
        for part in replayed.parts:
            for u in np.unique(part.unit_index):
                unit = part.units[u]
                key = (unit.path, unit.row_group, unit.rows)
                if key not in matches:
                    matches[key] = _matching_rows(part.dataset, unit, predicate)
                rows = part.row[part.unit_index == u]
                hit.setdefault((part.source_key, part.segment, part.epoch, *key), []).append(
                    rows[np.isin(rows, matches[key])])
        yield record, {k: np.unique(np.concatenate(found)) for k, found in hit.items()}


ROW_EXPOSURE_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("source_key", pa.string()), ("file", pa.string()),
    ("row_group", pa.int32()), ("row", pa.int64()), ("steps", pa.list_(pa.int64())),
    ("checkpoints", pa.list_(pa.string())), ("last_trained_step", pa.int64()),
    ("deleted_version", pa.int64()), ("deleted_by", pa.string()),
    ("stopped_after_step", pa.int64()), ("stopped_after_checkpoint", pa.string()),
])
"""Columns of :func:`row_exposure`: per matching row a run trained on (``row``: its live row
in the row group, as :func:`~lakeckpt_tables.audit.rows` counts it), the steps and
checkpoints that trained on it (each once per pass), the last of them; when the table deleted
it after the run's pin (``deletes="honor"``), the version and operation that deleted it and
the checkpoint whose commit took it out of the run: after it no checkpoint of the run trains
on it (null: not deleted, or deleted after the run's last checkpoint, not yet taken out)."""


def row_exposure(target: Any, predicate: str, table: str | None = None, *,
                 catalog: Any = None, storage_options: Mapping[str, str] | None = None,
                 source_catalog: Any = None) -> pa.Table:
    """Per matching row and run: which checkpoints trained on it, which table version deleted
    it, and the checkpoint after which no checkpoint of the run trains on it.

    Args: as :func:`trained_on`.

    Returns:
        A table in :data:`ROW_EXPOSURE_SCHEMA`, ordered by run, file, row group and row.

    Raises:
        LedgerError, SourceNotFoundError, AuditError: as :func:`trained_on`.
    """
    snapshot = read_ledger(target, catalog=catalog,
                           storage_options=ledger_options(target, storage_options))
    trained: dict[tuple[Any, ...], list[tuple[int, str]]] = {}
    for record, hit in _hits(snapshot, predicate, table, catalog, storage_options,
                             source_catalog):
        for (source_key, _, _, path, group, _), rows in hit.items():
            for row in rows.tolist():
                trained.setdefault((record.run_id, source_key, path, group, row), []).append(
                    (record.step, record.checkpoint_id))
    deleted = _deleted_rows(snapshot, {key[0] for key in trained})
    out: dict[str, list[Any]] = {n: [] for n in ROW_EXPOSURE_SCHEMA.names}
    for key in sorted(trained, key=lambda k: (k[0], k[1] or "", *k[2:])):
        run_id, source_key, path, group, row = key
        seen = sorted(trained[key])
        gone = deleted.get((run_id, path, group, row)) if source_key is None else None
        for name, value in zip(ROW_EXPOSURE_SCHEMA.names, (
                run_id, source_key, path, group, row, [st for st, _ in seen],
                [c for _, c in seen], seen[-1][0], *(gone or (None,) * 4)), strict=True):
            out[name].append(value)
    return pa.table(out, schema=ROW_EXPOSURE_SCHEMA)


def _deleted_rows(snapshot: Any, runs: set[str]) -> dict[tuple[str, str, int, int],
                                                          tuple[int, str, int, str]]:
    """(run, file, row group, row) -> (version, operation, step, checkpoint) of the commit
    that deleted it, as the ``excluded`` events of the lineage of each run's newest checkpoint
    record (a checkpoint a restore went back past excluded nothing for what came after)."""
    if not runs:
        return {}
    records = checkpoints_from_arrow(snapshot.rows)
    kept: set[str] = set()
    for run_id in runs:
        mine = [r for r in records if r.run_id == run_id]
        if mine:
            kept.update(r.checkpoint_id for r in lineage(records, max(mine,
                                                                      key=lambda r: r.step)))
    events = snapshot.scan((pc.field(s.RECORD) == s.RECORD_EVENT)
                           & (pc.field(s.EVENT) == EXCLUDED_EVENT)
                           & pc.field(s.RUN_ID).isin(sorted(runs)))
    out: dict[tuple[str, str, int, int], tuple[int, str, int, str]] = {}
    for rec in sorted(events.to_pylist(), key=lambda r: r[s.STEP]):
        if rec[s.CHECKPOINT_ID] not in kept:
            continue
        detail = json.loads(rec[s.DETAIL])
        for path, group, first, end in detail["deleted"]:
            for row in range(first, end):
                out.setdefault((rec[s.RUN_ID], path, int(group), row), (
                    int(detail["version"]), str(detail["operation"]), int(rec[s.STEP]),
                    rec[s.CHECKPOINT_ID]))
    return out


@dataclass
class RunExposure:
    """What one run did with the matching rows.

    Attributes:
        run_id: the run.
        first_step, last_step: the first and last checkpoints that trained on matching rows
            (None for a run that did not, branched from one that did).
        first_checkpoint, last_checkpoint: their ids.
        rows: matching rows trained on, summed over checkpoints: a row counts once per
            checkpoint and pass, so a row read in two epochs counts twice, and so does a packed
            document whose tokens two checkpoints delivered.
        checkpoints: ids of the checkpoints that trained on matching rows.
        exposed: ids of every checkpoint whose model has seen a matching row: those above and
            every checkpoint whose lineage holds one of them, a branched run's lineage going
            on into the run it was branched from. These must be retrained or deleted.
        inherited_from: the runs of its lineage (branched from: NOTE [ branched runs ]) whose
            checkpoints trained on matching rows its models carry.
        deleted: matching rows trained on that the table deleted after the run's pin, as the
            run's honored deletions (``deletes="honor"``) record them.
        deleted_versions: the table versions that deleted them.
        stopped_after_step: the checkpoint after which no checkpoint of the run trains on any
            of them (the last that took one out); None when none was deleted, or one was
            deleted after the run's last checkpoint (not taken out yet).
    """

    run_id: str
    first_step: int | None
    last_step: int | None
    first_checkpoint: str | None
    last_checkpoint: str | None
    rows: int
    checkpoints: list[str] = field(default_factory=list)
    exposed: list[str] = field(default_factory=list)
    inherited_from: list[str] = field(default_factory=list)
    deleted: int = 0
    deleted_versions: list[int] = field(default_factory=list)
    stopped_after_step: int | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def exposure(target: Any, matches: pa.Table, *, catalog: Any = None,
             storage_options: Mapping[str, str] | None = None,
             per_row: pa.Table | None = None) -> list[RunExposure]:
    """Summarise :func:`trained_on`'s result per run (first and last step, exposed models);
    with :func:`row_exposure`'s result ``per_row``, what the table deleted of them too."""
    snapshot = read_ledger(target, catalog=catalog,
                           storage_options=ledger_options(target, storage_options))
    records = checkpoints_from_arrow(snapshot.rows)
    branches = branches_of(snapshot)
    rows = matches.to_pylist()
    hit = {r["checkpoint_id"] for r in rows}
    seen = _seen(records, hit, branches)
    out = []
    for run_id in sorted({rec.run_id for rec in records if seen[rec.checkpoint_id]}):
        mine = sorted((r for r in rows if r["run_id"] == run_id), key=lambda r: r["step"])
        exposed = [rec.checkpoint_id for rec in records
                   if rec.run_id == run_id and seen[rec.checkpoint_id]]
        inherited = sorted({run for rec in records if rec.run_id == run_id
                            for run in seen[rec.checkpoint_id]} - {run_id})
        first, last = (mine[0], mine[-1]) if mine else ({}, {})
        run = RunExposure(run_id, first.get("step"), last.get("step"),
                          first.get("checkpoint_id"), last.get("checkpoint_id"),
                          sum(r["rows"] for r in mine), [r["checkpoint_id"] for r in mine],
                          exposed, inherited)
        gone = [] if per_row is None else [
            r for r in per_row.to_pylist()
            if r["run_id"] == run_id and r["deleted_version"] is not None]
        if gone:
            run.deleted = len(gone)
            run.deleted_versions = sorted({r["deleted_version"] for r in gone})
            stops = [r["stopped_after_step"] for r in gone]
            run.stopped_after_step = None if None in stops else max(stops)
        out.append(run)
    return out


def matches_of(rows: pa.Table) -> pa.Table:
    """:func:`trained_on`'s result from :func:`row_exposure`'s (one replay for both)."""
    counts: dict[tuple[str, str, int], int] = {}
    for r in rows.select(["run_id", "steps", "checkpoints"]).to_pylist():
        for step, checkpoint in zip(r["steps"], r["checkpoints"], strict=True):
            key = (r["run_id"], checkpoint, step)
            counts[key] = counts.get(key, 0) + 1
    ordered = sorted(counts.items(), key=lambda kv: (kv[0][0], kv[0][2]))
    return pa.table({"run_id": [k[0] for k, _ in ordered],
                     "checkpoint_id": [k[1] for k, _ in ordered],
                     "step": [k[2] for k, _ in ordered], "rows": [n for _, n in ordered]},
                    schema=MATCHES_SCHEMA)


def _seen(records: list[CheckpointRecord], hit: set[str],
          branches: dict[str, Branch]) -> dict[str, frozenset[str]]:
    """Per checkpoint, the runs of its lineage whose checkpoints in it trained on a hit;
    each lineage walked once, down to a checkpoint already known."""
    by_id = {r.checkpoint_id: r for r in records}
    seen: dict[str, frozenset[str]] = {}
    for record in records:
        walk: list[CheckpointRecord] = []
        walked: set[str] = set()
        current: CheckpointRecord | None = record
        while current is not None and current.checkpoint_id not in seen \
                and current.checkpoint_id not in walked:
            walk.append(current)
            walked.add(current.checkpoint_id)
            current = parent_of(by_id, current, branches)
        runs = seen.get(current.checkpoint_id, frozenset()) if current is not None \
            else frozenset()
        for r in reversed(walk):
            runs = runs | {r.run_id} if r.checkpoint_id in hit else runs
            seen[r.checkpoint_id] = runs
    return seen


def _open_table(table: str, catalog: Any, storage_options: Mapping[str, str] | None) -> Any:
    kind, _, rest = table.partition(":")
    if kind == "iceberg" and rest:
        from lakeckpt_tables.audit.registry import load_catalog
        from lakeckpt_tables.sources.iceberg import IcebergSource

        return IcebergSource(rest, catalog=load_catalog(catalog))
    from lakeckpt_tables.sources.delta import DeltaSource

    uri = rest if kind == "delta" and rest else table
    return DeltaSource(uri, storage_options=dict(storage_options)
                       if storage_options is not None else None)


def _matching_rows(dataset: Any, unit: Any, predicate: str) -> np.ndarray[Any, Any]:
    """Live row indices of ``unit`` where ``predicate`` holds."""
    if dataset is None:
        raise SourceNotFoundError("no reader to read the table's rows with")
    rows = dataset.snapshot.row_reader().read(unit, dataset.snapshot.schema.names)
    rows = rows.append_column(_ROW, pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    con = duckdb.connect()
    con.register("t", rows)
    try:
        found = con.sql(f"SELECT {_ROW} FROM t WHERE {predicate}").fetchall()
    except duckdb.Error as e:
        raise AuditError(f"predicate {predicate!r} over {dataset.snapshot.describe()}: {e}. "
                            f"Columns: {dataset.snapshot.schema.names}") from e
    finally:
        con.close()
    return np.array([r[0] for r in found], dtype=np.int64)
