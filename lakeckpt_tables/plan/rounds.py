"""Rounds as values: what a round reads, its plan units, and the rows it carries (pure).

A *round* is one planned pass over a set of units (``lakeckpt_tables.reader.rounds`` forms
them from a table: epochs of a pinned snapshot, follow segments, re-pinned epochs). This module
holds what is pure about them: the round descriptor a reader state records (:class:`Round`),
the bounded plan units cut from its row groups (:class:`RoundUnits`), and the lockstep tail a
follow round carries into the next (:class:`Tails`). No I/O, no clock.

NOTE [ segment tails are carried ]
With several ranks a round's rows must split in lockstep (NOTE [ lockstep ] in
``lakeckpt_tables.plan``); when they cannot (fewer rows than slices, or batch size 1 with
uneven slices) the last ``rows mod slices`` rows of its layout form its *tail*. A follow round's
tail is not dropped: it is *carried* to the next segment, whose units start with the carried
row ranges (``Round.carry``, each naming the round of origin so any process can list it again).
The carry is a function of the previous round's plan (shape, layout), so every process forms
the same one; an elastic re-plan leaves the tail of every round but the last to the segment it
was carried into (``replan_rounds(carried=True)``). When the pass ends (``until_version``) with
a tail, those rows are not delivered: logged, and recorded as ``undelivered`` with the round;
a run resumed with a later ``until_version`` delivers them first in its next segment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lakeckpt_tables.plan.compact import Orders, Parts, PartsView, Same, compact
from lakeckpt_tables.plan.epoch import EpochPlan
from lakeckpt_tables.plan.pieces import Piece
from lakeckpt_tables.plan.policy import PlanPolicy
from lakeckpt_tables.types import Unit

__all__ = ["DEFAULT_UNIT_ROWS", "Carry", "Origin", "Round", "RoundUnits", "Tails"]

Origin = tuple[int | None, int]
"""The round rows come from, as (base version or None for a whole snapshot, to version)."""

Carry = tuple[int | None, int, str, int, int, int]
"""Carried rows: (origin base, origin to, data file path, row group, first live row, end)."""


@dataclass(frozen=True, slots=True)
class Round:
    """One round. ``base is None``: the whole snapshot at ``to``; else rows appended in
    commits ``(base, to]``, minus ``skipped`` commits (version, reason), after the rows
    ``carry`` carries from earlier rounds (NOTE [ segment tails are carried ])."""

    index: int
    segment: int
    epoch: int
    base: int | None
    to: int
    skipped: tuple[tuple[int, str], ...] = ()
    carry: tuple[Carry, ...] = ()

    def to_json(self) -> list[Any]:
        value = [self.index, self.segment, self.epoch, self.base, self.to,
                 [list(s) for s in self.skipped]]
        return [*value, [list(c) for c in self.carry]] if self.carry else value

    @classmethod
    def from_json(cls, value: Any) -> Round:
        index, segment, epoch, base, to, skipped, *rest = value
        if len(rest) > 1:
            raise ValueError(f"malformed round {value!r}")
        carry = tuple((None if b is None else int(b), int(t), str(path), int(group), int(lo),
                       int(hi)) for b, t, path, group, lo, hi in (rest[0] if rest else ()))
        if any(not 0 <= c[4] < c[5] for c in carry):
            raise ValueError(f"malformed carried rows in round {value!r}")
        return cls(int(index), int(segment), int(epoch), None if base is None else int(base),
                   int(to), tuple((int(v), str(r)) for v, r in skipped), carry)


@dataclass(frozen=True)
class Tails:
    """How rounds are planned (policy, layouts of re-planned rounds): what a round's tail
    is, carried into the next follow segment (NOTE [ segment tails are carried ])."""

    policy: PlanPolicy
    layouts: Mapping[int, tuple[Piece, ...]]

    def key(self, index: int) -> Hashable:
        """What round ``index``'s plan depends on besides the round itself."""
        return (self.policy, self.layouts.get(index))

    def plan(self, rnd: Round, units: RoundUnits) -> EpochPlan:
        """Round ``rnd``'s plan, its units ``units``."""
        return units.plan(self.policy, segment=rnd.segment, epoch=rnd.epoch,
                          layout=self.layouts.get(rnd.index))

    def carry(self, rnd: Round, units: RoundUnits) -> tuple[Carry, ...]:
        """The rows of round ``rnd``'s tail, to carry into the next segment."""
        return units.carry(self.plan(rnd, units))


DEFAULT_UNIT_ROWS = 4096
"""Rows of a plan unit at most: row groups are planned as row ranges of this size, so that
shuffle mixes and work divides at any row-group size (issue 8 item 9)."""


@dataclass(frozen=True)
class RoundUnits:
    """A round's row groups (canonical order) and the bounded plan units cut from them.

    NOTE [ bounded units ]
    Sources read whole row groups; the plan works on *plan units*: row group ``source[u]``'s
    live rows ``[first[u], first[u] + rows[u])``, at most ``unit_rows`` each. The plan keeps
    the parts of one row group together (groups are permuted, then parts within a group), so
    a slice's range, and so its shuffle windows, touch few row groups, and the reader keeps
    those few decoded (``reader/_cache.py``) instead of decoding a row group per part.

    Carried rows (NOTE [ segment tails are carried ]) come first: one plan unit per carried
    range, and in ``units`` their row group with ``rows`` counting the rows carried (what the
    round gives of it, as the audit counts), read through ``reading``, the whole row group.
    ``origins`` names the round each carried range comes from; every other row group comes
    from ``origin``.

    When no row group is split and none carried, plan unit ``u`` is row group ``u``: ``source``
    and ``first`` are :class:`Same` (no array), and ``units`` is the snapshot's own listing,
    not a copy (NOTE [ compact plans ] in ``plan/epoch.py``).
    """

    units: Sequence[Unit]
    rows: np.ndarray[Any, Any]
    source: np.ndarray[Any, Any] | Same | PartsView
    first: np.ndarray[Any, Any] | Same | PartsView
    reading: Sequence[Unit] = ()
    origins: tuple[Origin, ...] = ()
    origin: Origin = (None, 0)
    orders: Orders = dataclasses.field(default_factory=Orders, compare=False, repr=False)
    """Unit orders computed for plans of this round (``plan.compact.Orders``)."""

    def plan(self, policy: PlanPolicy, *, segment: int, epoch: int,
             layout: Sequence[Piece] | None) -> EpochPlan:
        """The plan of these units under ``policy`` (and an elastic re-plan's ``layout``)."""
        return EpochPlan(self.rows, policy, segment=segment, epoch=epoch, layout=layout,
                         groups=self.source, orders=self.orders)

    @classmethod
    def of(cls, units: Sequence[Unit], unit_rows: int = DEFAULT_UNIT_ROWS, *,
           origin: Origin = (None, 0),
           carried: Sequence[tuple[Unit, int, int, Origin]] = ()) -> RoundUnits:
        """Plan units of ``units`` (row groups, canonical order) after ``carried`` ranges
        (row group read whole, first and end live row, round of origin). A listing with a
        ``rows`` array (a metadata-only one) is not iterated."""
        groups: dict[tuple[str, int], tuple[Unit, Origin, list[tuple[int, int]]]] = {}
        for unit, lo, hi, where in sorted(carried, key=lambda c: (c[0].path, c[0].row_group,
                                                                  c[1])):
            ranges = groups.setdefault((unit.path, unit.row_group), (unit, where, []))[2]
            if ranges and ranges[-1][1] == lo:
                ranges[-1] = (ranges[-1][0], hi)
            else:
                ranges.append((lo, hi))
        listed = getattr(units, "rows", None)
        sizes = (listed if isinstance(listed, np.ndarray) and len(listed) == len(units)
                 else np.array([u.rows for u in units], dtype=np.int64))
        parts = np.maximum(-(-sizes // unit_rows), 1) if len(sizes) else sizes
        if not groups and (not len(sizes) or int(parts.max()) == 1):
            n = len(sizes)
            return cls(units, compact(sizes), Same(n), Same(n, 0), units, (), origin)
        if not groups:
            split = Parts(sizes, parts)
            rows = np.empty(len(split), dtype=np.int32 if unit_rows < 2**31 else np.int64)
            for c in range(0, len(rows), 1 << 16):
                _, lo, hi = split.bounds(np.arange(c, min(c + (1 << 16), len(rows))))
                rows[c:c + len(lo)] = hi - lo
            return cls(units, rows, split.view("group"), split.view("first"), units, (),
                       origin)
        source = first = end = np.zeros(0, dtype=np.int64)
        if len(sizes):
            source = np.repeat(np.arange(len(units), dtype=np.int64), parts)
            start = np.concatenate([[0], np.cumsum(parts)[:-1]]).astype(np.int64)
            k = np.arange(len(source), dtype=np.int64) - np.repeat(start, parts)
            # parts of equal size (+-1 row) rather than a small remainder at the end
            first = (k * sizes[source]) // parts[source]
            end = ((k + 1) * sizes[source]) // parts[source]
        head = [(i, lo, hi) for i, (_, _, ranges) in enumerate(groups.values())
                for lo, hi in ranges]
        n = len(groups)
        return cls(
            tuple(dataclasses.replace(u, rows=sum(hi - lo for lo, hi in r))
                  for u, _, r in groups.values()) + tuple(units),
            compact(np.concatenate([np.array([hi - lo for _, lo, hi in head], np.int64),
                                    end - first])),
            compact(np.concatenate([np.array([i for i, _, _ in head], np.int64), source + n])),
            compact(np.concatenate([np.array([lo for _, lo, _ in head], np.int64), first])),
            tuple(u for u, _, _ in groups.values()) + tuple(units),
            tuple(w for _, w, _ in groups.values()), origin)

    def at(self, u: int, r0: int, r1: int) -> tuple[Unit, int, int]:
        """Plan unit ``u``'s rows ``[r0, r1)`` as (row group to read, first row, end row)."""
        first = int(self.first[u])
        return self.reading[int(self.source[u])], first + r0, first + r1

    def ranges(self, plan: EpochPlan, pieces: Sequence[Piece]) -> list[tuple[int, int, int]]:
        """The rows of ``pieces`` (of ``plan``'s base space) as sorted, merged
        (row group index in ``units``, first row, end row) ranges."""
        rows = np.sort(np.concatenate([p.rows() for p in pieces] or [np.empty(0, np.int64)]))
        if not len(rows):
            return []
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        spans = [(int(run[0]), int(run[-1]) + 1) for run in np.split(rows, breaks)]
        out: list[tuple[int, int, int]] = []
        for u, r0, r1 in sorted(plan.locate(spans), key=lambda c: (int(self.source[c[0]]),
                                                                   int(self.first[c[0]]) + c[1])):
            group, first = int(self.source[u]), int(self.first[u])
            if out and out[-1][0] == group and out[-1][2] == first + r0:
                out[-1] = (group, out[-1][1], first + r1)
            else:
                out.append((group, first + r0, first + r1))
        return out

    def carry(self, plan: EpochPlan) -> tuple[Carry, ...]:
        """The tail of ``plan`` (this round's plan) as rows to carry."""
        return tuple((*(self.origins[i] if i < len(self.origins) else self.origin),
                      self.reading[i].path, self.reading[i].row_group, lo, hi)
                     for i, lo, hi in self.ranges(plan, plan.tail()))
