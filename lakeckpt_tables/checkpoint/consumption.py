"""What each slice consumed between two reader states, as ledger records.

The accounting of a reader of rows is pure and lives in :mod:`lakeckpt_tables.plan.accounting`
(which rows a state has consumed, exact ranges and seeded subsets of shuffled windows,
coalescing, round and segment events); this module turns its ranges into the ledger's records,
and accounts for a packed reader (``pack_tokens``) itself.

NOTE [ packed accounting ]
A packed reader's position is sequences delivered, and its plan is in stream space (NOTE
[ token plan ] in ``reader/packing/token_plan.py``): each slice delivers contiguous stream
intervals, each row (document) is ``tokens + 1`` stream elements (its eos last). Between two
states, :func:`stream_spans` gives every slice's delivered intervals, and for each row group
they cut:

- **rows** are counted by their eos: a row is consumed by the checkpoint whose span holds its
  eos, so a document cut across sequences or checkpoints is counted once (what ``verify``
  checks exactly once);
- **tokens** are every stream element of the span in that row group, eos included: the
  elements of the ``input_ids`` delivered, so the records sum to the tokens trained on. A span
  that holds no eos of a row group (the middle of a long document) gives a record of 0 rows
  and ``row_start == row_end`` = that document's row;
- a pass's tail that cannot be split in lockstep is an ``undelivered`` event (rows whose eos
  it holds, and its tokens), recorded with the checkpoint that first reaches the pass or that
  re-planned it for another shape: ``verify`` then expects every other row of the pass;
- the first checkpoint reaching a pass records a ``round`` event with its rows and tokens
  (what ``progress`` divides by).

"Saw a row" (``audit.rows``, ``audit --where``) is wider than "consumed it": a checkpoint saw
every row of which it delivered at least one stream element (:func:`touched_rows`), so a
document split across two checkpoints is seen by both, and one cut by a pass's tail is seen by
the checkpoint that delivered its start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

import numpy as np
import pyarrow as pa

from lakeckpt_tables.ledger.records import ConsumptionRecord
from lakeckpt_tables.plan.accounting import Planner, Positions, consumed_ranges, round_events
from lakeckpt_tables.plan.pieces import cut_spans
from lakeckpt_tables.reader.packing.planner import TokenPlanner
from lakeckpt_tables.reader.packing.token_plan import TokenPlan

__all__ = ["RowLengths", "StreamSpan", "UnitPart", "consumed_between", "segment_events",
           "slice_stream", "stream_spans", "touched_rows", "unit_parts"]

S = TypeVar("S", bound=Positions)


def consumed_between(dataset: Planner[S], before: S | None,
                     after: S) -> list[ConsumptionRecord]:
    """Records of every slice ``after`` knows, from its position in ``before`` (start if None).

    ``before`` is first re-planned to ``after``'s shape if the shape changed in between
    (an elastic resume), exactly as the reader did.
    """
    planner = getattr(dataset, "planner", None)
    if isinstance(planner, TokenPlanner):
        return _packed_records(planner, before, after)
    return [ConsumptionRecord(**vars(r)) for r in consumed_ranges(dataset, before, after)]


def segment_events(dataset: Planner[S], before: S | None,
                   after: S) -> list[tuple[str, dict[str, Any]]]:
    """Events between two states (:func:`lakeckpt_tables.plan.accounting.round_events`); a
    packed reader's ``round`` and ``undelivered`` tails (NOTE [ packed accounting ])."""
    planner = getattr(dataset, "planner", None)
    if isinstance(planner, TokenPlanner):
        return _packed_events(planner, before, after)
    return round_events(dataset, before, after)


# ----------------------------------------------------------------------- stream space


class StreamSpan(NamedTuple):
    """Stream elements ``[a, b)`` slice ``g`` delivered in ``epoch`` (whose plan is ``plan``)."""

    g: int
    epoch: int
    plan: TokenPlan
    a: int
    b: int


class UnitPart(NamedTuple):
    """Stream elements ``[lo, hi)`` of unit ``unit`` (canonical index) of ``size``."""

    unit: int
    lo: int
    hi: int
    size: int


def stream_spans(planner: TokenPlanner, before: Any, after: Any) -> Iterator[StreamSpan]:
    """Every slice's delivered stream intervals between two states (``before`` None: the
    start), ``before`` first re-planned to ``after``'s shape as the reader did."""
    shape = after.plan
    if shape is None:
        return
    if before is not None:
        before = planner.reshape(before, shape)
    plans: dict[int, TokenPlan] = {}
    for g, end in enumerate(after.slices):
        if end is None:
            continue
        prior = None if before is None else before.slices[g]
        start = (0, 0) if prior is None else prior
        for index in range(start[0], _through(planner, end[0]) + 1):
            if index not in plans:
                plans[index] = planner.token_plan(shape, index, after.layouts.get(index))
            plan = plans[index]
            lo = start[1] if index == start[0] else 0
            hi = end[1] if index == end[0] else plan.per_slice
            for a, b in slice_stream(plan, g, lo, hi):
                yield StreamSpan(g, index, plan, a, b)


def _through(planner: TokenPlanner, epoch: int) -> int:
    """``epoch``, at most the reader's last (a cycling Mixture source's epochs are endless:
    ``epochs`` None)."""
    epochs: int | None = planner.epochs
    return epoch if epochs is None else min(epoch, epochs - 1)


def slice_stream(plan: TokenPlan, q: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """The stream intervals slice ``q`` delivers from its sequence ``lo`` to ``hi``."""
    base = q * plan.per_slice * plan.seq_len
    return cut_spans(plan.layout, base + lo * plan.seq_len, base + hi * plan.seq_len)


def unit_parts(plan: TokenPlan, a: int, b: int) -> Iterator[UnitPart]:
    """The units stream elements ``[a, b)`` of ``plan`` cut, in stream order."""
    starts = plan.starts
    k = int(np.searchsorted(starts, a, side="right")) - 1
    while 0 <= k < len(plan.order) and int(starts[k]) < b:
        s, e = int(starts[k]), int(starts[k + 1])
        if e > a:
            yield UnitPart(plan.order[k], max(a, s) - s, min(b, e) - s, e - s)
        k += 1


class RowLengths:
    """Stream elements (tokens + eos) of each live row of a unit, asked once per unit: only
    the units a span cuts are asked (one wholly inside is all of its rows).

    Args:
        rows: live rows of each unit (canonical order).
        lengths: the token count of each row of unit ``u`` (:meth:`of` reads the token column).
    """

    def __init__(self, rows: Sequence[int],
                 lengths: Callable[[int], np.ndarray[Any, Any]]) -> None:
        self.rows, self.lengths = rows, lengths
        self.known: dict[int, np.ndarray[Any, Any]] = {}

    @classmethod
    def of(cls, planner: TokenPlanner) -> RowLengths:
        """The lengths of a packed reader's documents, read from its token column (a text
        column's tokenized: NOTE [ text tokenized on the fly ] in
        ``reader/packing/tokenize.py``)."""
        reader, units = planner.snapshot.row_reader(), planner.snapshot.units
        column, text = planner.packing.column, planner.packing.text

        def lengths(u: int) -> np.ndarray[Any, Any]:
            array = reader.read(units[u], [column]).column(column)
            if text is not None:  # its documents' tokens, not their characters
                array = pa.chunked_array([text.encode(array, planner.where)])
            array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
            if pa.types.is_fixed_size_list(array.type):
                return np.full(len(array), array.type.list_size, dtype=np.int64)
            lengths: np.ndarray[Any, Any] = np.diff(array.offsets.to_numpy(zero_copy_only=False))
            return lengths.astype(np.int64)

        return cls([u.rows for u in units], lengths)

    def ends(self, u: int) -> np.ndarray[Any, Any]:
        """Stream offset, within unit ``u``, one past each row's eos."""
        if u not in self.known:
            self.known[u] = np.cumsum(np.asarray(self.lengths(u), dtype=np.int64) + 1)
        return self.known[u]

    def eos_rows(self, part: UnitPart) -> tuple[int, int]:
        """Rows ``[first, end)`` of the unit whose eos lies in ``part``; for a part holding
        none, ``first == end`` is the row it lies in."""
        if part.lo == 0 and part.hi == part.size:
            return 0, self.rows[part.unit]
        eos = self.ends(part.unit) - 1
        return (int(np.searchsorted(eos, part.lo, side="left")),
                int(np.searchsorted(eos, part.hi, side="left")))


def touched_rows(lengths: RowLengths, part: UnitPart) -> tuple[np.ndarray[Any, Any],
                                                                np.ndarray[Any, Any]]:
    """The rows of which ``part`` holds at least one stream element, and how many of each
    (NOTE [ packed accounting ]: what a checkpoint *saw*)."""
    ends = lengths.ends(part.unit)
    first = int(np.searchsorted(ends, part.lo, side="right"))
    last = int(np.searchsorted(ends, part.hi - 1, side="right"))
    rows = np.arange(first, last + 1, dtype=np.int64)
    starts = np.concatenate([[0], ends])[rows]
    tokens = np.minimum(ends[rows], part.hi) - np.maximum(starts, part.lo)
    return rows, tokens.astype(np.int64)


def _packed_records(planner: TokenPlanner, before: Any, after: Any) -> list[ConsumptionRecord]:
    workers = after.plan[1] if after.plan is not None else 1
    lengths = RowLengths.of(planner)
    units = planner.snapshot.units
    out: list[ConsumptionRecord] = []
    for span in stream_spans(planner, before, after):
        rank, worker = divmod(span.g, workers)
        for part in unit_parts(span.plan, span.a, span.b):
            first, end = lengths.eos_rows(part)
            unit = units[part.unit]
            prev = out[-1] if out else None
            if prev is not None and (prev.rank, prev.worker, prev.epoch, prev.file,
                                     prev.row_group, prev.row_end) == (
                    rank, worker, span.epoch, unit.path, unit.row_group, first):
                out[-1] = ConsumptionRecord(rank, worker, 0, span.epoch, unit.path,
                                            unit.row_group, prev.row_start, end,
                                            tokens=(prev.tokens or 0) + part.hi - part.lo)
            else:
                out.append(ConsumptionRecord(rank, worker, 0, span.epoch, unit.path,
                                             unit.row_group, first, end,
                                             tokens=part.hi - part.lo))
    return out


def _packed_events(planner: TokenPlanner, before: Any,
                   after: Any) -> list[tuple[str, dict[str, Any]]]:
    """``round`` of each pass first reached, and ``undelivered`` tails of each pass first
    reached or re-planned for another shape (NOTE [ packed accounting ])."""
    shape = after.plan
    if shape is None:
        return []
    reached = _through(planner, max(e for e, _ in (s for s in after.slices if s is not None)))
    if before is None or before.plan is None:
        first_new, replanned = 0, 0
    else:
        since = max(e for e, _ in (s for s in before.slices if s is not None))
        first_new = replanned = since + 1
        if before.plan != shape:  # every pass the re-plan gave a new layout
            replanned = min(e for e, _ in planner.reshape(before, shape).positions())
    lengths = RowLengths.of(planner)
    units = planner.snapshot.units
    events: list[tuple[str, dict[str, Any]]] = []
    for index in range(replanned, reached + 1):
        plan = planner.token_plan(shape, index, after.layouts.get(index))
        delivered = plan.slices * plan.per_slice * plan.seq_len
        ranges, rows = [], 0
        total = sum(b - a for a, b in plan.layout)
        for a, b in cut_spans(plan.layout, delivered, total):
            for part in unit_parts(plan, a, b):
                first, end = lengths.eos_rows(part)
                if first < end:
                    unit = units[part.unit]
                    ranges.append([unit.path, unit.row_group, first, end])
                    rows += end - first
        if index >= first_new:
            live = sum(u.rows for u in units)
            events.append(("round", {
                "round": index, "segment": 0, "epoch": index, "version": planner.snapshot.version,
                "base_version": None, "rows": live, "delivered": live - rows,
                "tokens": int(plan.starts[-1]), "delivered_tokens": delivered}))
        if total > delivered:
            events.append(("undelivered", {
                "segment": 0, "epoch": index, "reason": "lockstep remainder", "rows": rows,
                "tokens": total - delivered, "ranges": ranges}))
    return events
