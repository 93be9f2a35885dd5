"""Which rows a reader state has consumed since another, and what that says: pure accounting.

Given two reader states of one reader (``before`` may be None: the start of the run), the plan
says exactly which rows every (rank, worker) slice delivered in between: the walk
:func:`slice_spans` (positions ``[lo, hi)`` of each slice in each round it passed through),
:func:`consumed_ranges` (the same as (file, row group, row range) records, coalesced only where
adjacent) and :func:`round_events` (rounds first reached, follow segments formed, commits they
skipped, rows a round does not deliver, options changed on resume). No I/O of its own: a
:class:`Planner` (the reader, which lists a round's units) gives each round's plan.

Rows of a fully read window, or of unshuffled data, are exact ranges (``rows`` equals
``row_end - row_start``). Where a state falls inside a shuffled window, the rows consumed are a
seeded subset of the window: a range then gives the row group range and ``rows``, the count of
that range's rows consumed; the next state gives the rest, so per row group the counts over a
run add up to its rows exactly once (what the exactly-once audit checks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

import numpy as np

from lakeckpt_tables.plan.epoch import EpochPlan
from lakeckpt_tables.plan.pieces import Piece, cut_spans
from lakeckpt_tables.plan.rounds import Round, RoundUnits

__all__ = [
    "Consumed",
    "Planner",
    "Positions",
    "SliceSpan",
    "coalesce_ranges",
    "consumed_ranges",
    "round_events",
    "slice_spans",
]

Shape = tuple[int, int, int]  # (world_size, workers, batch_size)


class Positions(Protocol):
    """What the accounting reads of a reader state (``reader.state.ReaderState``)."""

    @property
    def plan(self) -> Shape | None: ...
    @property
    def slices(self) -> tuple[tuple[int, int] | None, ...]: ...
    @property
    def rounds(self) -> Mapping[int, Round]: ...
    @property
    def layouts(self) -> Mapping[int, tuple[Piece, ...]]: ...
    @property
    def policy(self) -> Mapping[str, Any]: ...


S = TypeVar("S", bound=Positions)



class Planner(Protocol[S]):
    """What the accounting asks of the reader (``LakeDataset``): plans of its rounds."""

    @property
    def follows(self) -> bool:
        """Whether rounds are follow segments (their tails are carried)."""

    def reshape(self, state: S, shape: Shape) -> S:
        """``state`` re-planned for ``shape`` (an elastic resume), as the reader does."""

    def round_plan(self, index: int, shape: Shape, layouts: Mapping[int, tuple[Piece, ...]],
                   known: Mapping[int, Round]) -> tuple[EpochPlan, RoundUnits]:
        """Round ``index``'s plan for ``shape`` and its units."""

    def round_at(self, index: int, shape: Shape, layouts: Mapping[int, tuple[Piece, ...]],
                 known: Mapping[int, Round]) -> Round | None:
        """Round ``index``, or None when it is not formed (yet)."""


class SliceSpan(NamedTuple):
    """Positions ``[lo, hi)`` of slice ``g`` in one round, and that round's plan and units."""

    g: int
    plan: EpochPlan
    units: RoundUnits
    lo: int
    hi: int


@dataclass(frozen=True)
class Consumed:
    """Rows one (rank, worker) consumed since the previous checkpoint, within one row group
    (what a ledger consumption record holds of the plan).

    Attributes:
        rank: consuming rank.
        worker: consuming DataLoader worker within the rank.
        segment: segment the rows were read in.
        epoch: epoch of that segment.
        file: data file path or URI.
        row_group: row group index within the file.
        row_start: first row of the range, within the row group.
        row_end: one past the last row of the range, within the row group.
        rows: how many rows of the range were consumed. Left out (-1), the whole range. Fewer
            where a checkpoint fell inside a shuffled window: the window's rows come out in a
            seeded order, so a seeded subset of the range was consumed, and the next
            checkpoint records the rest of it.
    """

    rank: int
    worker: int
    segment: int
    epoch: int
    file: str
    row_group: int
    row_start: int
    row_end: int
    rows: int = -1

    def __post_init__(self) -> None:
        if self.rows == -1:
            object.__setattr__(self, "rows", self.row_end - self.row_start)


def slice_spans(planner: Planner[S], before: S | None,
                after: S) -> Iterator[SliceSpan]:
    """Every slice's positions between ``before`` (the start when None) and ``after``, round
    by round. ``before`` is first re-planned to ``after``'s shape if that changed in between
    (an elastic resume), exactly as the reader did."""
    shape = after.plan
    if shape is None:
        return
    if before is not None:
        before = planner.reshape(before, shape)
    known = {**(before.rounds if before is not None else {}), **after.rounds}
    plans: dict[int, tuple[EpochPlan, RoundUnits]] = {}
    for g, end in enumerate(after.slices):
        if end is None:
            continue
        prior = None if before is None else before.slices[g]
        start = (0, 0) if prior is None else prior
        for index in range(start[0], end[0] + 1):
            if index not in plans:
                plans[index] = planner.round_plan(index, shape, after.layouts, known)
            plan, units = plans[index]
            lo = start[1] if index == start[0] else 0
            hi = end[1] if index == end[0] else plan.delivered_rows(g)
            if lo < hi:
                yield SliceSpan(g, plan, units, lo, hi)


def consumed_ranges(planner: Planner[S], before: S | None,
                    after: S) -> list[Consumed]:
    """What every slice consumed between two states, as row group ranges, coalesced."""
    out: list[Consumed] = []
    for span in slice_spans(planner, before, after):
        out.extend(_slice_ranges(span))
    return coalesce_ranges(out)


def coalesce_ranges(ranges: Sequence[Consumed]) -> list[Consumed]:
    """Merge neighbouring ranges of one slice, round and row group, only where the first ends
    where the second starts and both are exact (every row of them consumed)."""
    out: list[Consumed] = []
    for rec in ranges:
        prev = out[-1] if out else None
        if (prev is not None and prev.rows == prev.row_end - prev.row_start
                and rec.rows == rec.row_end - rec.row_start
                and (prev.rank, prev.worker, prev.segment, prev.epoch, prev.file,
                     prev.row_group)
                == (rec.rank, rec.worker, rec.segment, rec.epoch, rec.file, rec.row_group)
                and prev.row_end == rec.row_start):
            out[-1] = dataclasses.replace(prev, row_end=rec.row_end,
                                          rows=prev.rows + rec.rows)
        else:
            out.append(rec)
    return out


def round_events(planner: Planner[S], before: S | None,
                 after: S) -> list[tuple[str, dict[str, Any]]]:
    """Events between two states: options changed on resume (``policy_change``), and for the
    rounds first reached, the ``round`` itself, follow segments formed (``segment``), the
    commits they skipped (``skipped_commit``), and rows the round does not deliver
    (``undelivered``; a follow round's lockstep remainder is ``carried`` into the next
    segment, if the pass goes on)."""
    events = _policy_changes(before, after)
    shape = after.plan
    if shape is None:
        return events
    reached = max((s[0] for s in after.slices if s is not None), default=0)
    since = -1 if before is None else max((s[0] for s in before.slices if s is not None),
                                          default=0)
    known = {**(before.rounds if before is not None else {}), **after.rounds}
    for index in range(since + 1, reached + 1):
        rnd = planner.round_at(index, shape, after.layouts, known)
        if rnd is None:
            break
        known[index] = rnd
        plan, units = planner.round_plan(index, shape, after.layouts, known)
        rows = int(units.rows.sum())
        events.append(("round", {
            "round": index, "segment": rnd.segment, "epoch": rnd.epoch, "version": rnd.to,
            "base_version": rnd.base, "rows": rows,
            "delivered": sum(plan.delivered_rows(g) for g in range(plan.policy.slices))}))
        if planner.follows and index > 0:
            events.append(("segment", {"segment": rnd.segment, "from_version": rnd.base,
                                       "to_version": rnd.to, "rows": rows,
                                       "files": len({u.path for u in units.units})}))
            events.extend(("skipped_commit", {"segment": rnd.segment, "version": version,
                                              "reason": reason})
                          for version, reason in rnd.skipped)
        events.extend(_undelivered(plan, units, carried=planner.follows))
    return events


def _policy_changes(before: Positions | None,
                    after: Positions) -> list[tuple[str, dict[str, Any]]]:
    """Options that may change on resume (``ReaderState.policy``), each change named once:
    with the first checkpoint after the resume that changed it."""
    if before is None:
        return []
    return [("policy_change", {"option": key, "old": before.policy.get(key),
                               "new": after.policy.get(key)})
            for key in sorted(set(before.policy) | set(after.policy))
            if before.policy.get(key) != after.policy.get(key)]


def _undelivered(plan: EpochPlan, units: RoundUnits, *,
                 carried: bool) -> list[tuple[str, dict[str, Any]]]:
    """NOTE [ lockstep ] in lakeckpt_tables.plan: a remainder no slice can take in lockstep,
    and with drop_last each slice's partial last batch, are not delivered in this round: name
    their rows. A follow round's remainder is ``carried`` into the next segment, if the pass
    goes on (NOTE [ segment tails are carried ] in lakeckpt_tables.plan.rounds)."""
    reasons = [("lockstep remainder", plan.tail())]
    if plan.policy.drop_last:
        reasons.append(("drop_last", [p for g in range(plan.policy.slices)
                                      for p in plan.remaining(g, plan.delivered_rows(g))]))
    events = []
    for reason, pieces in reasons:
        found = units.ranges(plan, pieces)
        if not found:
            continue
        detail: dict[str, Any] = {
            "segment": plan.segment, "epoch": plan.epoch, "reason": reason,
            "rows": sum(end - first for _, first, end in found),
            "ranges": [[units.units[i].path, units.units[i].row_group, first, end]
                       for i, first, end in found]}
        if carried and reason == "lockstep remainder":
            detail["carried"] = True  # to the head of the next segment, when one is formed
        events.append(("undelivered", detail))
    return events


def _slice_ranges(span: SliceSpan) -> list[Consumed]:
    plan, units, g = span.plan, span.units, span.g
    rank, worker = divmod(g, plan.policy.workers)
    out: list[Consumed] = []
    offset = 0
    for window in plan.windows(g):
        a, b = max(span.lo - offset, 0), min(span.hi - offset, window.size)
        offset += window.size
        if a >= b:
            continue
        for u, r0, r1, n in _window_part(plan, window, a, b):
            unit, first, end = units.at(u, r0, r1)
            out.append(Consumed(rank, worker, plan.segment, plan.epoch, unit.path,
                                unit.row_group, first, end, n))
        if offset >= span.hi:
            break
    return out


def _window_part(plan: EpochPlan, window: Piece, a: int,
                 b: int) -> list[tuple[int, int, int, int]]:
    """(unit, row start, row end, rows consumed) for emission rows [a, b) of ``window``."""
    if window.seed is None:
        return [(u, r0, r1, r1 - r0)
                for u, r0, r1 in plan.locate(cut_spans(window.spans, a, b))]
    chunks = plan.locate(window.spans)
    if a == 0 and b == window.size and window.lo == 0 and window.hi == sum(
            y - x for x, y in window.spans):
        return [(u, r0, r1, r1 - r0) for u, r0, r1 in chunks]
    # a seeded subset: count the consumed rows falling in each chunk of the window
    ordinal = window.order()(window.lo + a, window.lo + b)
    starts = np.cumsum([0] + [r1 - r0 for _, r0, r1 in chunks])
    counts = np.bincount(np.searchsorted(starts, ordinal, "right") - 1, minlength=len(chunks))
    return [(u, r0, r1, int(n)) for (u, r0, r1), n in zip(chunks, counts, strict=True) if n]
