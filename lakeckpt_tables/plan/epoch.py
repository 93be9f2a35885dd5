"""``EpochPlan``: one epoch's rows, given to every slice in lockstep (NOTE [ lockstep ] in
``lakeckpt_tables.plan``), emitted window by window."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lakeckpt_tables.plan.order import unit_order
from lakeckpt_tables.plan.pieces import Piece, Span, coalesce, cut_layout
from lakeckpt_tables.plan.policy import PlanPolicy, derive_seed

__all__ = ["EpochPlan"]


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
        groups: Sequence[int] | np.ndarray[Any, Any] | None = None,
    ) -> None:
        self.policy = policy
        self.segment = segment
        self.epoch = epoch
        rows = np.asarray(unit_rows, dtype=np.int64)
        self.order = unit_order(len(rows), policy, segment, epoch,
                                None if groups is None else np.asarray(groups, dtype=np.int64))
        self.offsets = np.concatenate([[0], np.cumsum(rows[self.order])]).astype(np.int64)
        total = int(self.offsets[-1])
        self.layout = coalesce(layout) if layout is not None else (Piece.plain([(0, total)]),)
        self.rows = sum(p.size for p in self.layout)
        self._plan_slices()

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
            if self.policy.shuffle:
                seed = derive_seed(self.policy.seed, self.segment, self.epoch, g,
                                   first_index + len(out), "window")
                window = Piece(window.spans, seed, 0, window.size, self.policy.shuffler)
            out.append(window)
        return out

    def _unit_chunks(self, span: Span) -> list[Span]:
        """Cut a base-space span at unit boundaries."""
        a, b = span
        cuts = self.offsets[np.searchsorted(self.offsets, a, "right"):]
        out = []
        for c in cuts:
            c = int(c)
            if c >= b:
                break
            out.append((a, c))
            a = c
        out.append((a, b))
        return out

    def locate(self, spans: Sequence[Span]) -> list[tuple[int, int, int]]:
        """Map base-space spans to ``(canonical unit index, first row, end row)`` chunks.

        Each span's units at once (numpy), not unit by unit: the reader locates every read,
        a pass over a 4M-row table ~1000 units three times."""
        out: list[tuple[int, int, int]] = []
        offsets = self.offsets
        for a, b in spans:
            u0 = int(np.searchsorted(offsets, a, "right")) - 1
            if b <= a:  # an empty span: one empty chunk, in the unit holding ``a``
                start = int(offsets[u0])
                out.append((int(self.order[u0]), a - start, b - start))
                continue
            u1 = int(np.searchsorted(offsets, b, "left"))  # units u0 .. u1-1 overlap [a, b)
            starts = offsets[u0:u1]
            firsts = np.maximum(starts, a) - starts
            ends = np.minimum(offsets[u0 + 1:u1 + 1], b) - starts
            keep = ends > firsts  # units of no rows between (all rows deleted) give none
            out.extend(zip(self.order[u0:u1][keep].tolist(), firsts[keep].tolist(),
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
                start = max(position - offset, 0)
                whole = window.lo == 0 and window.hi == sum(b - a for a, b in window.spans)
                if start == 0 and whole:
                    out.append(Piece.plain(window.spans))
                else:
                    out.append(window.cut(start, window.size))
            offset = end
        return out
