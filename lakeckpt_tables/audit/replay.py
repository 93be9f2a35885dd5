"""``rows``: the exact rows a checkpoint trained on, recomputed from the pure plan.

The ledger's consumption records name row ranges, and where a checkpoint fell inside a shuffled
window only how many rows of a range were consumed. Which ones is not lost: the plan is a pure
function of the pinned snapshot, the seed and the shape, and a checkpoint's reader state holds
every slice's position. Replaying the plan between the parent's positions and the
checkpoint's gives every row, in the order each (rank, worker) delivered it. No data is read
but the token column of a packed reader (where its documents start and end); the source's
metadata is (to list its units). A Mixture's checkpoint is replayed source by source.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakeckpt_tables.audit.lineage import branches_of, lineage, reader_parent
from lakeckpt_tables.audit.sources import ledger_options
from lakeckpt_tables.audit.target import LedgerSnapshot, read_ledger
from lakeckpt_tables.errors import LedgerError
from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.ledger.records import (
    REPLANNED_EVENT,
    CheckpointRecord,
    checkpoints_from_arrow,
)
from lakeckpt_tables.plan.accounting import slice_spans
from lakeckpt_tables.plan.rounds import DEFAULT_UNIT_ROWS
from lakeckpt_tables.plan.shuffle import LEGACY

__all__ = ["ROWS_SCHEMA", "CheckpointRows", "Part", "checkpoint_rows", "dataset_for", "rows",
           "rows_between", "skipped_rows"]

ROWS_SCHEMA = pa.schema([
    ("rank", pa.int32()), ("worker", pa.int32()), ("segment", pa.int64()),
    ("epoch", pa.int64()), ("file", pa.string()), ("row_group", pa.int32()),
    ("row", pa.int64()), ("source_key", pa.string()), ("tokens", pa.int64()),
])
"""Columns of :func:`rows`. ``row`` counts the row group's live rows (rows not deleted at the
pinned version), which is the row's index in the file's row group when nothing was deleted.
``source_key`` names the Mixture source (null for a one-table run). ``tokens`` (packed readers
only, else null): the row's tokens the slice delivered, its eos included; fewer than the
document's where a sequence, a checkpoint or a pass's tail cut it (NOTE [ packed accounting ]
in ``checkpoint/consumption.py``: a checkpoint saw every row it delivered a token of)."""


def rows(target: Any, *, checkpoint: str | None = None, cumulative: bool = False,
         catalog: Any = None, storage_options: Mapping[str, str] | None = None,
         source: Any = None, source_catalog: Any = None, tokenizer: Any = None,
         where: str | None = None, table: str | None = None) -> pa.Table:
    """The (file, row group, row) checkpoint ``checkpoint`` trained on; or, given ``where``
    instead (a SQL predicate over the source tables' columns), per matching row and run the
    checkpoints that trained on it, the table version that deleted it and the checkpoint after
    which none trained on it (:func:`~lakeckpt_tables.audit.where.row_exposure`, its columns;
    ``table`` limits it to the runs that read that table).

    Not cumulative by default: the rows delivered since the checkpoint's parent (the
    checkpoint its run saved or restored last), exactly what its consumption records cover.
    ``cumulative=True`` gives every row of its lineage up to it (parent, grandparent...,
    and for a branched run the run it was branched from: NOTE [ branched runs ]), so a row
    read in two epochs appears twice. A Mixture's rows are given source by source
    (``source_key``); a packed reader's are every row of which a token was delivered, so a
    document cut between two checkpoints is a row of both.

    Args:
        target: a checkpoint root, a ledger spec or a ledger object (see
            :func:`~lakeckpt_tables.audit.connect`).
        checkpoint: the checkpoint id.
        cumulative: include the rows of the checkpoint's ancestors.
        catalog: pyiceberg catalog of an Iceberg ledger.
        storage_options: storage options of the ledger and Delta sources (as
            ``CheckpointManager`` takes them).
        source: the source table of a one-table run to plan from; by default (and for a
            Mixture's sources) opened from what the ledger names.
        source_catalog: the catalog of an Iceberg source, when it is neither the one the
            ledger records for it nor the ledger's.
        tokenizer: the ``tokenizers.Tokenizer`` of a run packing a text column (its documents'
            tokens say where they start and end: NOTE [ text tokenized on the fly ]).

    Returns:
        A table in :data:`ROWS_SCHEMA`, each slice's rows in the order they were delivered.

    Raises:
        LedgerError: no such checkpoint, or no ledger there.
        SourceNotFoundError: the source table cannot be opened again.
        StateMismatchError: a reader state cannot be replayed against the table.
    """
    if where is not None:
        from lakeckpt_tables.audit.where import row_exposure

        return row_exposure(target, where, table, catalog=catalog,
                            storage_options=storage_options, source_catalog=source_catalog)
    if checkpoint is None:
        raise TypeError("audit.rows needs checkpoint= (its rows) or where= (rows matching it)")
    snapshot = read_ledger(target, catalog=catalog,
                           storage_options=ledger_options(target, storage_options))
    records = checkpoints_from_arrow(snapshot.rows)
    record = _find(records, checkpoint, snapshot.where)
    branches = branches_of(snapshot)
    chain = lineage(records, record, branches) if cumulative else [record]
    parts = []
    for rec in reversed(chain):
        parts.append(checkpoint_rows(rec, reader_parent(records, rec, branches), snapshot,
                                     source=source, storage_options=storage_options,
                                     source_catalog=source_catalog, tokenizer=tokenizer).table())
    return pa.concat_tables(parts) if parts else ROWS_SCHEMA.empty_table()


def skipped_rows(target: Any, *, checkpoint: str, catalog: Any = None,
                 storage_options: Mapping[str, str] | None = None, source: Any = None,
                 source_catalog: Any = None, tokenizer: Any = None) -> pa.Table:
    """The (file, row group, row) consumed WITHOUT training before checkpoint ``checkpoint``:
    the batches skipped since its parent (NOTE [ skipped batches ] in ``checkpoint/skip.py``),
    in :data:`ROWS_SCHEMA`; empty when none were. Arguments as :func:`rows`.

    Raises:
        LedgerError: no such checkpoint, or no ledger there.
    """
    from lakeckpt_tables.audit.skipped import skip_events
    from lakeckpt_tables.reader.state import decode_state

    snapshot = read_ledger(target, catalog=catalog,
                           storage_options=ledger_options(target, storage_options))
    records = checkpoints_from_arrow(snapshot.rows)
    record = _find(records, checkpoint, snapshot.where)
    parent = reader_parent(records, record, branches_of(snapshot))
    prior = decode_state(parent.reader_state) if parent is not None and parent.reader_state \
        else None
    parts = []
    for detail in skip_events(snapshot, record.run_id).get(record.checkpoint_id, []):
        after = decode_state(detail["state"])
        parts.append(rows_between(after, prior, snapshot, source=source,
                                  storage_options=storage_options,
                                  source_catalog=source_catalog, tokenizer=tokenizer).table())
        prior = after
    return pa.concat_tables(parts) if parts else ROWS_SCHEMA.empty_table()


@dataclass
class Part:
    """The rows one slice delivered in one pass of one reader, in delivery order."""

    rank: int
    worker: int
    segment: int
    epoch: int
    units: tuple[Any, ...]
    unit_index: np.ndarray[Any, Any]
    """The unit (index into ``units``) of each row."""
    row: np.ndarray[Any, Any]
    """The row within its unit (a live-row index of its row group)."""
    tokens: np.ndarray[Any, Any] | None
    """Tokens of each row delivered (packed readers), None for a reader of rows."""
    source_key: str | None
    dataset: Any
    """The reader (never iterated) the rows were replayed with."""


@dataclass
class CheckpointRows:
    """The rows one checkpoint delivered, per reader, slice and pass."""

    parts: list[Part]

    def table(self) -> pa.Table:
        if not self.parts:
            return ROWS_SCHEMA.empty_table()
        return pa.concat_tables([_part_table(p) for p in self.parts])


def _part_table(p: Part) -> pa.Table:
    n = len(p.row)
    paths = np.array([u.path for u in p.units], dtype=object)
    groups = np.array([u.row_group for u in p.units], dtype=np.int32)
    return pa.table({
        "rank": np.full(n, p.rank, np.int32), "worker": np.full(n, p.worker, np.int32),
        "segment": np.full(n, p.segment, np.int64), "epoch": np.full(n, p.epoch, np.int64),
        "file": pa.array(paths[p.unit_index] if n else [], pa.string()),
        "row_group": groups[p.unit_index] if n else np.empty(0, np.int32),
        "row": np.asarray(p.row, np.int64),
        "source_key": pa.array([p.source_key] * n, pa.string()),
        "tokens": pa.nulls(n, pa.int64()) if p.tokens is None else pa.array(p.tokens,
                                                                               pa.int64()),
    }, schema=ROWS_SCHEMA)


def checkpoint_rows(record: CheckpointRecord, parent: CheckpointRecord | None,
                    snapshot: LedgerSnapshot, *, source: Any = None,
                    sources: Mapping[str, Any] | None = None, only: str | None = None,
                    storage_options: Mapping[str, str] | None = None,
                    datasets: dict[Any, Any] | None = None,
                    source_catalog: Any = None, tokenizer: Any = None) -> CheckpointRows:
    """Replay the plan from ``parent``'s positions to ``record``'s (see the module docstring),
    or from the state after the batches skipped before ``record`` (NOTE [ skipped batches ] in
    ``checkpoint/skip.py``: they were not trained on).

    Args:
        source: the source of a one-table run (None: opened from the ledger).
        sources: sources to use, by table id (a Mixture's too); others are opened.
        only: replay only the readers of this table id.
        datasets: caches the readers built per (source, state configuration) across calls.
        tokenizer: a text-packing run's tokenizer (:func:`rows`).
    """
    from lakeckpt_tables.audit.skipped import state_after_skips
    from lakeckpt_tables.reader.state import decode_state

    if not record.reader_state:
        return CheckpointRows([])
    after = replanned_from(snapshot, record) or decode_state(record.reader_state)
    prior = state_after_skips(snapshot, record)
    if prior is None and parent is not None and parent.reader_state:
        prior = decode_state(parent.reader_state)
    return rows_between(after, prior, snapshot, source=source, sources=sources, only=only,
                        storage_options=storage_options, datasets=datasets,
                        source_catalog=source_catalog, tokenizer=tokenizer,
                        reached=record.checkpoint_id)


def rows_between(after: Mapping[str, Any], prior: Mapping[str, Any] | None,
                 snapshot: LedgerSnapshot, *, source: Any = None,
                 sources: Mapping[str, Any] | None = None, only: str | None = None,
                 storage_options: Mapping[str, str] | None = None,
                 datasets: dict[Any, Any] | None = None,
                 source_catalog: Any = None, tokenizer: Any = None,
                 reached: str | None = None) -> CheckpointRows:
    """The rows delivered between two merged reader states (``prior`` None: the start);
    ``reached``: the checkpoint that committed ``after``, whose ``round`` events name the
    versions of re-pinned epochs neither state names (:func:`pinned_rounds`)."""
    from lakeckpt_tables.mixture.state import is_mixture_state, paired_reader_states

    if is_mixture_state(after):
        source = None  # the one source given is a one-table run's
    parts: list[Part] = []
    for key, one, was in paired_reader_states(after, prior):
        parts.extend(_reader_rows(key, one, was, snapshot, source=source, sources=sources,
                                  only=only, storage_options=storage_options,
                                  datasets=datasets, source_catalog=source_catalog,
                                  tokenizer=tokenizer, reached=reached))
    return CheckpointRows(parts)


def replanned_from(snapshot: LedgerSnapshot, record: CheckpointRecord) -> dict[str, Any] | None:
    """The reader state ``record``'s rows were consumed up to, when the checkpoint re-planned
    what was left to take deleted rows out (NOTE [ deletions honored ] in
    ``reader/deletions.py``); None otherwise (its own state)."""
    from lakeckpt_tables.reader.state import decode_state

    found = snapshot.scan((pc.field(s.RECORD) == s.RECORD_EVENT)
                          & (pc.field(s.EVENT) == REPLANNED_EVENT)
                          & (pc.field(s.RUN_ID) == record.run_id)
                          & (pc.field(s.CHECKPOINT_ID) == record.checkpoint_id))
    details = found.column(s.DETAIL).to_pylist() if found.num_rows else []
    return decode_state(json.loads(details[0])["from"]) if details else None


def _reader_rows(key: str | None, state: Mapping[str, Any], prior: Mapping[str, Any] | None,
                 snapshot: LedgerSnapshot, *, source: Any, sources: Mapping[str, Any] | None,
                 only: str | None, storage_options: Mapping[str, str] | None,
                 datasets: dict[Any, Any] | None, source_catalog: Any,
                 tokenizer: Any = None, reached: str | None = None) -> Iterator[Part]:
    """The rows one reader (a Mixture's source ``key``) delivered between two states."""
    from lakeckpt_tables.reader.state import ReaderState

    after = ReaderState.from_dict(state)
    if after.plan is None or (only is not None and after.table.table_id != only):
        return
    if after.config.get("refresh") is not None and reached is not None:
        after = replace(after, rounds={**pinned_rounds(snapshot, {reached}, key),
                                       **after.rounds})
    before = None if prior is None else ReaderState.from_dict(prior)
    if before is not None and (before.plan is None
                               or before.table.table_id != after.table.table_id):
        before = None
    if source is None and sources is not None:
        source = sources.get(after.table.table_id)
    dataset = dataset_for(after, snapshot, source=source, storage_options=storage_options,
                          cache=datasets, source_catalog=source_catalog, tokenizer=tokenizer)
    if after.config.get("pack") is not None:
        yield from _replay_packed(dataset, before, after, key)
    else:
        yield from _replay(dataset, before, after, key)


def pinned_rounds(snapshot: LedgerSnapshot, checkpoints: set[str],
                  source_key: str | None) -> dict[int, Any]:
    """The versions a ``refresh="epoch"`` reader's epochs were pinned to, as the ``round``
    events of ``checkpoints`` name them: a state names only the epochs its slices stand in,
    the passes it finished are planned at their own versions (NOTE [ sources that move ] in
    ``mixture/dataset.py``)."""
    import json

    import pyarrow.compute as pc

    from lakeckpt_tables.ledger import schema as s
    from lakeckpt_tables.plan.rounds import Round

    events = snapshot.scan((pc.field(s.RECORD) == s.RECORD_EVENT)
                           & (pc.field(s.EVENT) == "round")
                           & pc.field(s.CHECKPOINT_ID).isin(sorted(checkpoints)))
    out = {}
    for rec in events.to_pylist():
        detail = json.loads(rec[s.DETAIL])
        if detail.get("source_key") == source_key:
            index = int(detail["round"])
            out[index] = Round(index, index, index, None, int(detail["version"]))
    return out


def _replay(dataset: Any, before: Any, after: Any, key: str | None) -> Iterator[Part]:
    """Every slice's rows between two states: the walk of ranges
    (:func:`lakeckpt_tables.plan.accounting.slice_spans`), here row by row."""
    workers = after.plan[1]
    for g, plan, units, lo, hi in slice_spans(dataset, before, after):
        base = _slice_rows(plan, g, lo, hi)
        position = np.searchsorted(plan.offsets, base, "right") - 1
        unit = plan.order[position]  # a plan unit: rows [first, first + rows) of a row group
        rank, worker = divmod(g, workers)
        yield Part(rank, worker, plan.segment, plan.epoch, units.units, units.source[unit],
                   units.first[unit] + base - plan.offsets[position], None, key, dataset)


def _replay_packed(dataset: Any, before: Any, after: Any, key: str | None) -> Iterator[Part]:
    """Every slice's rows between two states of a packed reader: the rows it delivered a
    token of, and how many (NOTE [ packed accounting ] in ``checkpoint/consumption.py``)."""
    from lakeckpt_tables.checkpoint.consumption import (
        RowLengths,
        stream_spans,
        touched_rows,
        unit_parts,
    )

    planner = dataset.planner
    lengths = RowLengths.of(planner)
    units = tuple(planner.snapshot.units)
    workers = after.plan[1]
    for span in stream_spans(planner, before, after):
        index, rows, tokens = [], [], []
        for part in unit_parts(span.plan, span.a, span.b):
            r, n = touched_rows(lengths, part)
            index.append(np.full(len(r), part.unit, np.int64))
            rows.append(r)
            tokens.append(n)
        rank, worker = divmod(span.g, workers)
        yield Part(rank, worker, 0, span.epoch, units, np.concatenate(index),
                   np.concatenate(rows), np.concatenate(tokens), key, dataset)


def _slice_rows(plan: Any, g: int, lo: int, hi: int) -> np.ndarray[Any, Any]:
    """Base-space rows slice ``g`` emits at positions ``[lo, hi)``, in emission order."""
    out = []
    offset = 0
    for window in plan.windows(g):
        a, b = max(lo - offset, 0), min(hi - offset, window.size)
        offset += window.size
        if a < b:
            out.append(window.rows()[a:b])
        if offset >= hi:
            break
    return np.concatenate(out) if out else np.empty(0, np.int64)


def dataset_for(state: Any, snapshot: LedgerSnapshot, *, source: Any = None,
                storage_options: Mapping[str, str] | None = None,
                cache: dict[Any, Any] | None = None, source_catalog: Any = None,
                tokenizer: Any = None) -> Any:
    """A reader configured as the one that captured ``state`` (never iterated: it plans);
    ``tokenizer``: a text-packing reader's (NOTE [ text tokenized on the fly ])."""
    from lakeckpt_tables.audit.sources import open_source, recorded_catalogs
    from lakeckpt_tables.reader.dataset import LakeDataset, cycling

    config = dict(state.config)
    key = (state.table, state.version, repr(sorted(config.items())), state.plan)
    if cache is not None and key in cache:
        return cache[key]
    if source is None:
        recorded = recorded_catalogs(snapshot.scan) if state.table.format == "iceberg" else {}
        source = open_source(state.table.format, state.table.location, catalog=snapshot.catalog,
                             table_id=state.table.table_id, storage_options=storage_options,
                             source_catalog=source_catalog,
                             recorded_catalog=recorded.get(state.table.location,
                                                          recorded.get(state.table.table_id)))
    units = str(config.get("units", "row_groups"))  # NOTE [ lazy footers ] (sources/lazy.py)
    if getattr(source, "units", units) != units:
        source = source.with_units(units)
    follow = config.get("follow")
    kwargs: dict[str, Any] = {}
    if isinstance(follow, dict):
        # policy options (on_change, until_version...) do not define the rows: a replay
        # forms the same segments without them (older states carried them in the config)
        kwargs = {"follow": True, "min_segment_rows": follow["min_segment_rows"],
                  "on_change": "skip"}
    elif config.get("refresh") is not None:
        kwargs = {"refresh": config["refresh"]}
    else:
        kwargs = {"epochs": int(config.get("epochs", 1))}
    pack = config.get("pack")
    if pack is not None:
        kwargs.update(pack_tokens=pack["column"], seq_len=int(pack["seq_len"]),
                      eos_id=int(pack["eos_id"]))
        if pack.get("tokenizer") is not None and tokenizer is not None:
            kwargs["tokenizer"] = tokenizer  # its identity checked by the reader's state
    world, _, batch = state.plan
    dataset = LakeDataset(source, columns=config.get("columns"), batch_size=batch,
                          shuffle=bool(config.get("shuffle", True)),
                          seed=int(config.get("seed", 0)), version=state.version, rank=0,
                          world_size=world, drop_last=bool(config.get("drop_last", False)),
                          shuffle_window=int(config.get("shuffle_window", 4)),
                          unit_rows=int(config.get("unit_rows", DEFAULT_UNIT_ROWS)), **kwargs)
    # the permutation the run's windows were shuffled with (NOTE [ keyed permutation ])
    dataset.shuffler = str(config.get("shuffler", LEGACY))
    if config.get("cycle"):  # a cycling Mixture's source: its epochs go on
        dataset = cycling(dataset)
    if cache is not None:
        cache[key] = dataset
    return dataset


def _find(records: list[CheckpointRecord], checkpoint: str, where: str) -> CheckpointRecord:
    found = [r for r in records if r.checkpoint_id == checkpoint]
    if not found:
        # a unique prefix is enough, as with git commits
        found = [r for r in records if r.checkpoint_id.startswith(checkpoint)]
    if len(found) != 1:
        what = "no checkpoint" if not found else f"{len(found)} checkpoints"
        raise LedgerError(f"ledger {where} has {what} with id {checkpoint!r}; list them with "
                          "`lakeckpt checkpoints TARGET --all`")
    return found[0]

