"""The reading loop: one slice's batches, round after round, read from the table (thin I/O).

The plan says which rows, in which order (``lakeckpt_tables.plan``); this module only reads
them, window by window, through a row group cache, and cuts them into the plan's batches
(:func:`batches`), moving the slice's cursor after each (:class:`SliceReader`, from where
:func:`start_cursor` puts it). Nothing here decides a row or a position.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

import lakeckpt_tables.reader.spare as spare
from lakeckpt_tables.io.prefetch import DEFAULT_PREFETCH, Prefetch
from lakeckpt_tables.plan import EpochPlan, Piece, cut_spans
from lakeckpt_tables.plan.rounds import RoundUnits
from lakeckpt_tables.plan.shuffle import WindowOrder
from lakeckpt_tables.reader._cache import RowGroupCache
from lakeckpt_tables.reader.gather import Gathered
from lakeckpt_tables.reader.planner import Cursor, RoundPlanner
from lakeckpt_tables.reader.readahead import ReadAhead, read_pieces
from lakeckpt_tables.reader.rounds import RoundSequence, Tails
from lakeckpt_tables.reader.state import PlanShape, ReaderState
from lakeckpt_tables.sources.base import Snapshot
from lakeckpt_tables.types import Unit

__all__ = ["ORDER_BLOCK", "Cut", "SliceReader", "batches", "concat", "start_cursor"]

log = logging.getLogger(__name__)

Parts = Callable[[Unit, int, int], list[tuple[Unit, int, int]]]
"""A unit's live rows ``[first, end)`` as row group ranges (``RowGroupReader.parts``)."""

Cut = tuple[pa.Table | Gathered, int, int]
"""A batch as (table, first row, rows) of a table many batches are cut from (or of a shuffled
window, gathered when cut: ``reader/gather.py``)."""

ORDER_BLOCK = 1 << 16
"""Positions of a shuffled window's permutation computed at once: per-call overhead spread
over many rows, the work still in cache (256 KiB of ``uint32``)."""


def start_cursor(planner: RoundPlanner, resume: ReaderState | None, shape: PlanShape,
                 worker: int, *, own: bool, epoch: int | None = None) -> Cursor:
    """Where DataLoader worker ``worker`` (0 in the main process) of a reader of ``shape``
    starts: afresh (at the epoch ``set_epoch`` pinned last with ``refresh="epoch"``), or
    where ``resume`` says (re-planned for another shape); ``own``: the state was handed to
    this worker by torchdata.

    Raises:
        ValueError: follow segments too small to give every worker a row, or no epoch
            pinned with ``refresh="epoch"``.
        StateMismatchError: ``resume`` cannot be continued at ``shape``.
    """
    if planner.refreshes and epoch is None:
        raise ValueError("refresh='epoch': call dataset.set_epoch(epoch) in the main "
                         "process before iterating each epoch")
    epoch = epoch or 0
    follow = planner.rounds.follow
    if follow is not None and follow.min_segment_rows < shape[0] * shape[1]:
        raise ValueError(
            f"min_segment_rows={follow.min_segment_rows} is below ranks x workers = "
            f"{shape[0] * shape[1]}: a segment could not give every worker a row. "
            "Raise min_segment_rows.")
    g = planner.rank * shape[1] + worker
    if planner.refreshes and resume is not None and all(
            s is None or s[0] < epoch for s in resume.slices):
        resume = None  # the loaded state's epochs are over; this one starts afresh
    if resume is None or resume.plan is None:
        return Cursor(g, shape, {}, epoch, 0, {})
    if resume.plan == shape:
        g = planner.resumed_slice(resume, shape, worker, own=own)
        index, position = resume.slices[g] or (0, 0)
        return Cursor(g, shape, dict(resume.layouts), index, position,
                      planner.own_round(resume.rounds, index), resume.eos_at(g),
                      resume.deletes_seen, resume.exclusions_seen)
    reshaped = planner.reshape(resume, shape)
    first = min(index for index, _ in reshaped.positions())  # every slice starts there
    return Cursor(g, shape, dict(reshaped.layouts), first, 0,
                  planner.own_round(reshaped.rounds, first), reshaped.eos_at(g),
                  reshaped.deletes_seen, reshaped.exclusions_seen)


def _warn_tail(planner: RoundPlanner, plan: EpochPlan, slice_index: int) -> None:
    """An epoch's tail, or the tail of the follow segment a pass ends with, is not
    delivered (a follow segment's tail is carried into the next one, if any)."""
    tail = sum(p.size for p in plan.tail())
    if tail and slice_index == 0:
        log.warning("%s segment %d epoch %d: %d row(s) cannot be split in lockstep over "
                    "%d slices with batch size %d; they are not delivered%s "
                    "(CheckpointManager records them in the ledger as an 'undelivered' "
                    "event)", planner.where, plan.segment, plan.epoch, tail,
                    plan.policy.slices, plan.policy.batch_size,
                    "" if not planner.follows else " as the pass ends here; following "
                    "on past this version (a later until_version) delivers them first")


class SliceReader:
    """Reads a slice's batches from a snapshot's row groups: one per pinned snapshot, with
    the row group cache (``reader/_cache.py``) and the object-store prefetch
    (``lakeckpt_tables.io.prefetch``; none with ``read_ahead=0``) its reads share."""

    def __init__(self, snapshot: Snapshot, columns: Sequence[str], read_ahead: int) -> None:
        self.columns = columns
        self.row_reader = snapshot.row_reader()
        self.cache = RowGroupCache(self._read_row_group)
        storage = self.row_reader.storage
        remote = storage is not None and not storage.is_local
        self.prefetch = Prefetch(self._read_unit,
                                 depth=DEFAULT_PREFETCH if remote and read_ahead else 0,
                                 key=_unit_key)

    def tables(self, cursor: Cursor, planner: RoundPlanner, rounds: RoundSequence, *,
               read_ahead: int, unit_rows: int) -> Iterator[pa.Table]:
        """The slice's batches from ``cursor`` on, round after round, as Arrow tables; the
        cursor stands at each one's end when it is yielded."""
        for table, first, rows in self.cuts(cursor, planner, rounds, read_ahead=read_ahead,
                                            unit_rows=unit_rows):
            whole = first == 0 and rows == table.num_rows and isinstance(table, pa.Table)
            yield table if whole else table.slice(first, rows)

    def cuts(self, cursor: Cursor, planner: RoundPlanner, rounds: RoundSequence, *,
             read_ahead: int, unit_rows: int) -> Iterator[Cut]:
        """:meth:`tables`, each batch as rows ``[first, first + rows)`` of a read's table
        (a run's row group or gathered window, the same one for many batches: its columns
        are converted once, NOTE [ per-batch cost ])."""
        g = cursor.slice_index
        policy = planner.policy(cursor.shape)
        tails = Tails(policy, cursor.layouts)
        index, plan = cursor.epoch, None
        while (rnd := rounds.get(index, cursor.rounds, wait=True, tails=tails)) is not None:
            plan = planner.plan(policy, rnd, cursor.layouts.get(index))
            start = cursor.position if index == cursor.epoch else 0
            if not planner.follows and start == 0:  # once per pass: not again at a resume
                _warn_tail(planner, plan, g)
            own = planner.own_round({index: rnd}, index)
            if index != cursor.epoch and plan.batch_count(g) == 0:
                # a round this slice has nothing of (all of it a tail, carried or not) is
                # passed, and the state says so: the ledger then names its tail
                cursor.epoch, cursor.position, cursor.rounds = index, 0, own
            for cut, position in batches(plan, rounds.units(rnd), g, start,
                                           row_group=self.cache.get,
                                           row_ranges=self.row_reader.parts,
                                           expect=self.prefetch.expect, read_ahead=read_ahead,
                                           unit_rows=unit_rows):
                cursor.epoch, cursor.position, cursor.rounds = index, position, own
                yield cut
            index += 1
        if planner.follows and plan is not None:
            _warn_tail(planner, plan, g)

    def _read_row_group(self, unit: Unit) -> pa.Table:
        return self.prefetch.get(unit)

    def _read_unit(self, unit: Unit) -> pa.Table:
        return self.row_reader.read(unit, self.columns)


def _unit_key(unit: Unit) -> tuple[str, int]:
    return unit.path, unit.row_group


def batches(plan: EpochPlan, units: RoundUnits, g: int, start: int, *,
            row_group: Callable[[Unit], pa.Table], row_ranges: Parts,
            expect: Callable[[Iterable[Unit]], None],
            read_ahead: int, unit_rows: int) -> Iterator[tuple[Cut, int]]:
    """Slice ``g``'s batches after ``start`` rows, each with the position after it.

    Args:
        plan: the round's plan.
        units: the round's units.
        g: the slice.
        start: rows of the slice already delivered.
        row_group: a row group's live rows in the selected columns (cached by the caller).
        row_ranges: a unit's live rows as row group ranges (a whole file's: NOTE [ lazy footers ]
            in ``sources/lazy.py``).
        expect: told, lazily, every row group the pass is about to read, in order
            (NOTE [ prefetch ] in ``lakeckpt_tables.io.prefetch``).
        read_ahead: windows decoded ahead on threads (NOTE [ read-ahead ] in
            ``reader/readahead.py``).
        unit_rows: rows of a plan unit; an unshuffled window is read in pieces of a few
            units (:func:`~lakeckpt_tables.reader.readahead.read_pieces`), so the first batch
            waits for one row group, not a whole window.
    """
    ends = plan.batch_ends(g)
    j = int(np.searchsorted(ends, start, side="right"))
    if j >= len(ends):
        return
    emitted = start  # rows of the slice read into batches (pending included)
    jobs: list[tuple[Piece, int]] = []  # reads, and rows of each to skip
    offset = 0
    for window in plan.windows(g):
        for piece in read_pieces(window, unit_rows, _group_bounds(plan, units, window)):
            if offset + piece.size > emitted:
                jobs.append((piece, max(emitted - offset, 0)))
            offset += piece.size

    def read(job: tuple[Piece, int]) -> _Runs:
        return _read_window(plan, units, *job, row_group=row_group, parts=row_ranges)

    expect(unit for job in jobs for unit in _job_units(plan, units, *job, row_ranges))

    # later windows decode (and shuffled ones are gathered) on threads while this one is cut
    # into batches; the position still counts rows yielded, nothing else. Per batch: one slice
    # (a batch inside a run) and no numpy scalar: a narrow table's batches cost little more
    # than their cutting (NOTE [ per-batch cost ])
    stops: list[int] = ends.tolist()
    count = len(stops)
    parts: list[tuple[pa.Table, int, int]] = []  # a batch across runs, as _add merges them
    for runs in ReadAhead(read, jobs, depth=read_ahead, size=lambda r: r.nbytes):
        for table, first, end in runs.runs:
            while first < end:
                need = stops[j] - emitted
                if end - first < need:  # the run ends inside this batch
                    _add(parts, table, first, end)
                    emitted += end - first
                    break
                if parts:
                    _add(parts, table, first, first + need)
                    batch: Cut = _joined(parts)
                    parts = []
                else:
                    batch = (table, first, need)
                first += need
                emitted += need
                j += 1
                yield batch, emitted
                if j >= count:
                    return


def _add(parts: list[tuple[pa.Table, int, int]], table: pa.Table, first: int, end: int) -> None:
    """Neighbouring rows of one table stay one part: a batch inside a row group read in two
    pieces is still a zero-copy slice of it."""
    if parts and parts[-1][0] is table and parts[-1][2] == first:
        parts[-1] = (table, parts[-1][1], end)
    else:
        parts.append((table, first, end))


def _joined(parts: list[tuple[pa.Table, int, int]]) -> Cut:
    if len(parts) == 1:
        table, first, end = parts[0]
        return table, first, end - first
    joined = concat([table.slice(first, end - first) for table, first, end in parts])
    return joined, 0, joined.num_rows


def _group_bounds(plan: EpochPlan, units: RoundUnits, window: Piece) -> list[int]:
    """Positions of an unshuffled window where its rows pass to another row group."""
    if window.seed is not None:
        return []
    chunks = plan.locate(window.spans)
    groups = units.source[[u for u, _, _ in chunks]]
    ends = np.cumsum([r1 - r0 for _, r0, r1 in chunks])
    return [int(e) for e in ends[:-1][groups[1:] != groups[:-1]]]


class _Runs:
    """One read's rows in emission order as runs (table, first row, end row): runs of row
    groups (unshuffled), or a shuffled window to gather in emission order."""

    def __init__(self, runs: list[tuple[pa.Table | Gathered, int, int]]) -> None:
        self.runs = runs
        self.nbytes = sum(int(table.nbytes) * (end - first) // max(table.num_rows, 1)
                          for table, first, end in runs)


def _job_units(plan: EpochPlan, units: RoundUnits, window: Piece, skip: int,
               parts: Parts) -> Iterator[Unit]:
    """The row groups :func:`_read_window` reads, in order (NOTE [ prefetch ] (io))."""
    spans = cut_spans(window.spans, skip, window.size) if window.seed is None else window.spans
    return (part[0] for chunk in _at(units, plan.locate(spans)) for part in parts(*chunk))


def _at(units: RoundUnits, chunks: Sequence[tuple[int, int, int]]) -> list[tuple[Unit, int, int]]:
    """``units.at`` of every (plan unit, first, end) chunk, its arrays indexed once for all
    (one at a time, a compact plan's lookup costs ~20 us: 50 ms of a narrow table's pass)."""
    if not chunks:
        return []
    at = np.fromiter((u for u, _, _ in chunks), dtype=np.int64, count=len(chunks))
    sources, firsts = np.asarray(units.source[at]).tolist(), np.asarray(units.first[at]).tolist()
    reading = units.reading
    return [(reading[source], first + r0, first + r1)
            for (_, r0, r1), source, first in zip(chunks, sources, firsts, strict=True)]


def _window_order(order: WindowOrder, first: int, end: int,
                  buffer: np.ndarray[Any, Any] | None = None) -> np.ndarray[Any, Any]:
    """Positions ``[first, end)`` of a window's permutation, computed :data:`ORDER_BLOCK`
    positions at a time (the work stays in cache: about 3x faster than all at once), each
    written into one array: ``buffer`` (``uint8``, 8 bytes a position) when given (NOTE
    [ spare window arrays ] in ``reader/spare.py``)."""
    out = (np.empty(end - first, dtype=np.int64) if buffer is None
           else buffer[:(end - first) * 8].view(np.int64))
    for a in range(first, end, ORDER_BLOCK):
        b = min(a + ORDER_BLOCK, end)
        out[a - first:b - first] = order(a, b)
    return out


def _read_window(plan: EpochPlan, units: RoundUnits, window: Piece, skip: int, *,
                 row_group: Callable[[Unit], pa.Table], parts: Parts) -> _Runs:
    """The window's rows in emission order, from its ``skip``-th on: an unshuffled window's as
    runs of its row groups, a shuffled one's as its row group slices and its permutation,
    gathered batch by batch as they are cut (NOTE [ gathering a shuffled window ])."""
    if window.seed is None:
        spans = cut_spans(window.spans, skip, window.size)
        return _Runs(_read_spans(plan, units, spans, row_group, parts))
    runs = _read_spans(plan, units, window.spans, row_group, parts)
    buffer = spare.take((window.hi - window.lo - skip) * 8)
    gathered = Gathered(runs, _window_order(window.order(), window.lo + skip, window.hi, buffer),
                        spares=[buffer])
    return _Runs([(gathered, 0, gathered.num_rows)])


def _read_spans(plan: EpochPlan, units: RoundUnits, spans: Sequence[tuple[int, int]],
                row_group: Callable[[Unit], pa.Table],
                parts: Parts) -> list[tuple[pa.Table, int, int]]:
    """The rows of ``spans`` as runs (row group table, first row, end row), neighbouring rows
    of one row group merged into one run."""
    located = [part for chunk in _at(units, plan.locate(spans)) for part in parts(*chunk)]
    runs: list[tuple[pa.Table, int, int]] = []
    last: Unit | None = None
    for unit, first, end in located:
        if unit is not last:  # a row group's parts are read one after the other
            table, last = row_group(unit), unit
        if runs and runs[-1][0] is table and runs[-1][2] == first:
            runs[-1] = (table, runs[-1][1], end)
        else:
            runs.append((table, first, end))
    return runs


def concat(tables: list[pa.Table]) -> pa.Table:
    """Tables of one schema (up to type promotion of evolved columns) end to end."""
    if len(tables) == 1:
        return tables[0]
    try:
        return pa.concat_tables(tables)
    except pa.ArrowInvalid:
        return pa.concat_tables(tables, promote_options="permissive")
