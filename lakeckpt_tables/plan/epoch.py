"""``EpochPlan``: one epoch's rows, given to every slice in lockstep (NOTE [ lockstep ] in
``lakeckpt_tables.plan``), emitted window by window.

NOTE [ compact plans ]
Every rank plans the whole epoch (a slice's rows start where the rows of the units before it
end), so a plan holds O(units) arrays: at 8 x 10^6 units (10^6 files x 8 row groups), int64
orders, offsets, row counts, groups and first rows were ~300 MB a rank. What is kept now:
the unit order as ``int32`` (the same permutation: ``Generator.shuffle`` of an ``int32``
range draws what ``permutation`` draws), and base-space offsets only every
:data:`OFFSET_BLOCK` units; the offsets a span needs are summed again from the row counts of
its blocks (a few hundred units). Row counts are the listing's own array when the source gives
one (``RoundUnits.of``), not a copy; a round whose row groups are not split has no group or
first-row arrays (``plan.compact.Same``). The balanced order of more than
``BALANCE_LIMIT`` unsplit row groups is the inverse of one permutation, inverted in place of
two sorts. The rows and their order are the plan's as before (tests/test_plan_scale.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from lakeckpt_tables.plan.compact import Orders, PartsView, Same
from lakeckpt_tables.plan.order import unit_order
from lakeckpt_tables.plan.pieces import Piece, Span, coalesce, cut_layout
from lakeckpt_tables.plan.policy import PlanPolicy, derive_seed

__all__ = ["OFFSET_BLOCK", "EpochPlan"]

OFFSET_BLOCK = 256
"""Units between two kept base-space offsets (NOTE [ compact plans ]): locating a span sums
at most two blocks more than its own units."""


class EpochPlan:
    """The plan of one epoch of one segment.

    Args:
        unit_rows: rows of each unit, in canonical (path, row group) order.
        policy: plan parameters.
        segment: segment index (0 for a pinned snapshot).
        epoch: epoch index.
        layout: the epoch's layout; the whole base space when None.
        groups: for each unit, the group (row group) it was cut from; units of a group stay
            together when shuffled: groups are permuted, then units within each group.
    """

    def __init__(
        self,
        unit_rows: Sequence[int] | np.ndarray[Any, Any],
        policy: PlanPolicy,
        *,
        segment: int = 0,
        epoch: int = 0,
        layout: Sequence[Piece] | None = None,
        groups: Sequence[int] | np.ndarray[Any, Any] | Same | PartsView | None = None,
        orders: Orders | None = None,
    ) -> None:
        self.policy = policy
        self.segment = segment
        self.epoch = epoch
        rows = np.asarray(unit_rows)
        self._rows = rows if rows.dtype.kind in "iu" else rows.astype(np.int64)
        if isinstance(groups, Same):  # every group one unit: the order of no groups
            groups = None
        parts = groups.parts if isinstance(groups, PartsView) else None
        key = (policy.shuffle, policy.shuffler, policy.seed, segment, epoch)
        if orders is not None and key in orders:
            self.order, self._kept = orders[key]
        else:
            self.order = unit_order(len(rows), policy, segment, epoch, parts if parts is not None
                                    else None if groups is None
                                    else np.asarray(groups, dtype=np.int64))
            self._kept = self._kept_offsets()
            if orders is not None:
                orders.put(key, (self.order, self._kept))
        total = int(self._kept[-1])
        self.layout = coalesce(layout) if layout is not None else (Piece.plain([(0, total)]),)
        self.rows = sum(p.size for p in self.layout)
        self._plan_slices()

    def _kept_offsets(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Base-space offsets of units ``0, B, 2B, ...`` and of the end (B:
        :data:`OFFSET_BLOCK`), summed a million units at a time."""
        n, step = len(self.order), OFFSET_BLOCK
        kept = np.zeros(-(-n // step) + 1, dtype=np.int64)
        chunk = step * 256
        for c in range(0, n, chunk):
            sizes = self._rows[self.order[c:c + chunk]]
            sums = np.add.reduceat(sizes, np.arange(0, len(sizes), step), dtype=np.int64)
            first = c // step
            kept[first + 1:first + 1 + len(sums)] = kept[first] + np.cumsum(sums)
        return kept

    @functools.cached_property
    def offsets(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Base-space offset of every position of :attr:`order`, and of the end (O(units)
        memory, kept once asked for: for audits; the plan itself keeps them per block)."""
        return np.concatenate([[0], np.cumsum(self._rows[self.order], dtype=np.int64)])

    def _offsets_between(self, a: int, b: int) -> tuple[int, np.ndarray[Any, Any]]:
        """``(p, o)``: ``o`` the offsets of positions ``p .. q`` with ``o[0] <= a`` and
        ``o[-1] >= b`` (or ``q`` the end), whole blocks (NOTE [ compact plans ])."""
        kept, step = self._kept, OFFSET_BLOCK
        lo = int(np.searchsorted(kept, a, "right")) - 1
        hi = min(max(int(np.searchsorted(kept, b, "left")), lo + 1), len(kept) - 1)
        p, q = min(lo * step, len(self.order)), min(hi * step, len(self.order))
        sizes = self._rows[self.order[p:q]]
        out = np.empty(q - p + 1, dtype=np.int64)
        out[0] = kept[lo]
        np.cumsum(sizes, dtype=np.int64, out=out[1:])
        out[1:] += kept[lo]
        return p, out

    def _plan_slices(self) -> None:
        p, m = self.policy, self.rows
        s = p.slices
        q, r = divmod(m, s)
        b = p.batch_size
        if p.lockstep and not p.drop_last and r and (b < 2 or q < 1):
            m, r = s * q, 0  # remainder cannot be delivered in lockstep: it becomes the tail
        self.delivered_total = m
        self.bounds = [(m * g) // s for g in range(s + 1)]
        if p.lockstep:
            smax, smin = q + (1 if r else 0), q
            self._lockstep_batches: int | None = smin // b if p.drop_last else -(-smax // b)
        else:
            self._lockstep_batches = None

    def slice_rows(self, g: int) -> int:
        """Rows in slice ``g``'s range (delivered or dropped by drop_last)."""
        return self.bounds[g + 1] - self.bounds[g]

    def batch_count(self, g: int) -> int:
        if self._lockstep_batches is not None:
            return self._lockstep_batches
        s, b = self.slice_rows(g), self.policy.batch_size
        return s // b if self.policy.drop_last else -(-s // b)

    def batch_ends(self, g: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Cumulative row positions at which slice ``g``'s batches end."""
        n, s, b = self.batch_count(g), self.slice_rows(g), self.policy.batch_size
        j = np.arange(n, dtype=np.int64)
        if self.policy.drop_last:
            return (j + 1) * b
        return np.minimum((j + 1) * b, s - (n - 1 - j))

    def delivered_rows(self, g: int) -> int:
        """Rows slice ``g`` delivers this epoch."""
        ends = self.batch_ends(g)
        return int(ends[-1]) if len(ends) else 0

    def slice_layout(self, g: int) -> list[Piece]:
        return cut_layout(self.layout, self.bounds[g], self.bounds[g + 1])

    def tail(self) -> list[Piece]:
        """Rows of the layout no slice is given (see NOTE [ lockstep ])."""
        return cut_layout(self.layout, self.delivered_total, self.rows)

    def windows(self, g: int) -> list[Piece]:
        """Slice ``g``'s emission, as windows in order."""
        out: list[Piece] = []
        for piece in self.slice_layout(g):
            if piece.seed is not None:
                out.append(piece)  # already a (partial) window of an earlier plan
            else:
                out.extend(self._window_plain(piece, g, len(out)))
        return out

    def _window_plain(self, piece: Piece, g: int, first_index: int) -> list[Piece]:
        chunks = [c for span in piece.spans for c in self._unit_chunks(span)]
        k = self.policy.shuffle_window
        out: list[Piece] = []
        for i in range(0, len(chunks), k):
            group = chunks[i : i + k]
            window = Piece.plain(group)
            out.append(self.window(g, first_index + len(out), window))
        return out

    def window(self, g: int, index: int, rows: Piece) -> Piece:
        """Slice ``g``'s ``index``-th window, of the plain piece ``rows``: permuted by its own
        seed when the plan shuffles."""
        if not self.policy.shuffle:
            return rows
        seed = derive_seed(self.policy.seed, self.segment, self.epoch, g, index, "window")
        return Piece(rows.spans, seed, 0, rows.size, self.policy.shuffler)

    def unit_cuts(self, span: Span) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Where units end strictly inside a base-space span (repeated at units of no
        rows): the span's chunks run between them."""
        a, b = span
        _, offsets = self._offsets_between(a, b)
        return offsets[(offsets > a) & (offsets < b)]

    def _unit_chunks(self, span: Span) -> list[Span]:
        """Cut a base-space span at unit boundaries."""
        cuts = self.unit_cuts(span).tolist()
        return list(zip([span[0], *cuts], [*cuts, span[1]], strict=True))

    def locate(self, spans: Sequence[Span]) -> list[tuple[int, int, int]]:
        """Map base-space spans to ``(canonical unit index, first row, end row)`` chunks.

        Each span's units at once (numpy), not unit by unit: the reader locates every read,
        a pass over a 4M-row table ~1000 units three times."""
        out: list[tuple[int, int, int]] = []
        for a, b in spans:
            p, offsets = self._offsets_between(a, b)
            u0 = int(np.searchsorted(offsets, a, "right")) - 1
            if b <= a:  # an empty span: one empty chunk, in the unit holding ``a``
                start = int(offsets[u0])
                out.append((int(self.order[p + u0]), a - start, b - start))
                continue
            u1 = int(np.searchsorted(offsets, b, "left"))  # units u0 .. u1-1 overlap [a, b)
            starts = offsets[u0:u1]
            firsts = np.maximum(starts, a) - starts
            ends = np.minimum(offsets[u0 + 1:u1 + 1], b) - starts
            keep = ends > firsts  # units of no rows between (all rows deleted) give none
            out.extend(zip(self.order[p + u0:p + u1][keep].tolist(), firsts[keep].tolist(),
                           ends[keep].tolist(), strict=True))
        return out

    def remaining(self, g: int, position: int) -> list[Piece]:
        """What slice ``g`` has not delivered after ``position`` rows, as pieces.

        The rest of a begun window keeps its permutation; whole windows not begun come back
        plain (their rows in base order), so that neighbours coalesce and a re-plan's layout
        grows with the number of slices, not with the number of windows (reader state size).
        """
        out = []
        offset = 0
        for window in self.windows(g):
            end = offset + window.size
            if end > position:
                out.extend(self.remaining_of(window, max(position - offset, 0)))
            offset = end
        return out

    @staticmethod
    def remaining_of(window: Piece, start: int) -> list[Piece]:
        """A window's rows from emission row ``start`` on: plain when it is whole."""
        whole = window.lo == 0 and window.hi == sum(b - a for a, b in window.spans)
        return [Piece.plain(window.spans) if start == 0 and whole
                else window.cut(start, window.size)]
