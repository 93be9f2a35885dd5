"""The reading loop: one slice's batches of one round, read from the table (thin I/O).

The plan says which rows, in which order (``lakeckpt_tables.plan``); this module only reads
them, window by window, through a row group cache, and cuts them into the plan's batches.
Nothing here decides a row or a position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from lakeckpt_tables.plan import EpochPlan, Piece, cut_spans, permutation
from lakeckpt_tables.plan.rounds import RoundUnits
from lakeckpt_tables.reader.readahead import ReadAhead, read_pieces
from lakeckpt_tables.types import Unit

__all__ = ["batches", "concat"]


def batches(plan: EpochPlan, units: RoundUnits, g: int, start: int, *,
            row_group: Callable[[Unit], pa.Table], expect: Callable[[Iterable[Unit]], None],
            read_ahead: int, unit_rows: int) -> Iterator[tuple[pa.Table, int]]:
    """Slice ``g``'s batches after ``start`` rows, each with the position after it.

    Args:
        plan: the round's plan.
        units: the round's units.
        g: the slice.
        start: rows of the slice already delivered.
        row_group: a row group's live rows in the selected columns (cached by the caller).
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
    pending: list[pa.Table] = []
    jobs: list[tuple[Piece, int]] = []  # windows still to read, and rows of each to skip
    offset = 0
    for window in plan.windows(g):
        for piece in read_pieces(window, unit_rows):
            if offset + piece.size > emitted:
                jobs.append((piece, max(emitted - offset, 0)))
            offset += piece.size

    def read(job: tuple[Piece, int]) -> pa.Table:
        return _read_window(plan, units, *job, row_group=row_group)

    expect(unit for job in jobs for unit in _job_units(plan, units, *job))

    # later windows decode on threads while this one is cut into batches; the position still
    # counts rows yielded, nothing else
    tables = ReadAhead(read, jobs, depth=read_ahead, size=lambda table: int(table.nbytes))
    for table in tables:
        taken = 0
        while j < len(ends) and taken < table.num_rows:
            need = int(ends[j]) - emitted
            part = table.slice(taken, min(need, table.num_rows - taken))
            pending.append(part)
            taken += part.num_rows
            emitted += part.num_rows
            if emitted == ends[j]:
                yield concat(pending), emitted
                pending = []
                j += 1
        if j >= len(ends):
            return


def _job_units(plan: EpochPlan, units: RoundUnits, window: Piece, skip: int) -> Iterator[Unit]:
    """The row groups :func:`_read_window` reads, in order (NOTE [ prefetch ] (io))."""
    spans = cut_spans(window.spans, skip, window.size) if window.seed is None else window.spans
    return (units.at(u, r0, r1)[0] for u, r0, r1 in plan.locate(spans))


def _read_window(plan: EpochPlan, units: RoundUnits, window: Piece, skip: int, *,
                 row_group: Callable[[Unit], pa.Table]) -> pa.Table:
    """The window's rows in emission order, from its ``skip``-th on."""
    if window.seed is None:
        spans = cut_spans(window.spans, skip, window.size)
        return _read_spans(plan, units, spans, row_group)
    table = _read_spans(plan, units, window.spans, row_group)
    order = permutation(table.num_rows, window.seed)[window.lo + skip : window.hi]
    return table.take(pa.array(order))


def _read_spans(plan: EpochPlan, units: RoundUnits, spans: Sequence[tuple[int, int]],
                row_group: Callable[[Unit], pa.Table]) -> pa.Table:
    located = [units.at(u, r0, r1) for u, r0, r1 in plan.locate(spans)]
    return concat([row_group(unit).slice(first, end - first) for unit, first, end in located])


def concat(tables: list[pa.Table]) -> pa.Table:
    """Tables of one schema (up to type promotion of evolved columns) end to end."""
    if len(tables) == 1:
        return tables[0]
    try:
        return pa.concat_tables(tables)
    except pa.ArrowInvalid:
        return pa.concat_tables(tables, promote_options="permissive")
