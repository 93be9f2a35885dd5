"""Pieces and layouts: ordered sets of an epoch's base rows (NOTE [ pieces and layouts ] in
``lakeckpt_tables.plan``), cut and merged without listing their rows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lakeckpt_tables.plan.shuffle import LEGACY, SHUFFLERS, WindowOrder

__all__ = ["Piece", "Span", "coalesce", "cut_layout", "cut_spans"]


Span = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Piece:
    """Rows ``[lo, hi)`` of the base-space ``spans`` laid end to end, permuted by ``seed``
    with ``shuffler`` (:mod:`lakeckpt_tables.plan.shuffle`)."""

    spans: tuple[Span, ...]
    seed: int | None
    lo: int
    hi: int
    shuffler: str = LEGACY

    @classmethod
    def plain(cls, spans: Sequence[Span]) -> Piece:
        merged: list[Span] = []  # adjacent spans merged: same rows, smaller state
        for a, b in spans:
            if b <= a:
                continue
            if merged and merged[-1][1] == a:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        return cls(tuple(merged), None, 0, sum(b - a for a, b in merged))

    @property
    def size(self) -> int:
        return self.hi - self.lo

    def cut(self, start: int, stop: int) -> Piece:
        """Rows ``[start, stop)`` of this piece's order, as a piece."""
        if self.seed is not None:
            return Piece(self.spans, self.seed, self.lo + start, self.lo + stop,
                         self.shuffler)
        return Piece.plain(cut_spans(self.spans, self.lo + start, self.lo + stop))

    def rows(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Base-space row numbers in emission order (for tests and audits; O(rows))."""
        base = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in self.spans] or
                              [np.empty(0, np.int64)])
        if self.seed is not None:
            return base[self.order()(self.lo, self.hi)]
        return base[self.lo : self.hi]

    def order(self) -> WindowOrder:
        """The permutation of the spans' rows (a seeded piece only)."""
        assert self.seed is not None
        return WindowOrder(self.shuffler, sum(b - a for a, b in self.spans), self.seed)

    def to_json(self) -> list[Any]:
        value = [[list(s) for s in self.spans], self.seed, self.lo, self.hi]
        # the legacy shuffler is not named: states written before shufflers had names
        return value if self.seed is None or self.shuffler == LEGACY else [*value,
                                                                           self.shuffler]

    @classmethod
    def from_json(cls, value: Any) -> Piece:
        spans, seed, lo, hi, *named = value
        shuffler = str(named[0]) if len(named) == 1 else LEGACY
        if len(named) > 1 or shuffler not in SHUFFLERS:
            raise ValueError(f"malformed piece {value!r}")
        piece = cls(tuple((int(a), int(b)) for a, b in spans),
                    None if seed is None else int(seed), int(lo), int(hi), shuffler)
        total = sum(b - a for a, b in piece.spans)
        if (not 0 <= piece.lo <= piece.hi <= total
                or any(not 0 <= a <= b for a, b in piece.spans)
                or (piece.seed is not None and not 0 <= piece.seed < 2**63)):
            raise ValueError(f"malformed piece {value!r}")
        return piece


def cut_spans(spans: Sequence[Span], start: int, stop: int) -> list[Span]:
    """Rows ``[start, stop)`` of ``spans`` laid end to end, as spans."""
    out: list[Span] = []
    offset = 0
    for a, b in spans:
        length = b - a
        lo, hi = max(start - offset, 0), min(stop - offset, length)
        if lo < hi:
            out.append((a + lo, a + hi))
        offset += length
        if offset >= stop:
            break
    return out


def cut_layout(layout: Sequence[Piece], start: int, stop: int) -> list[Piece]:
    out: list[Piece] = []
    offset = 0
    for piece in layout:
        lo, hi = max(start - offset, 0), min(stop - offset, piece.size)
        if lo < hi:
            out.append(piece.cut(lo, hi))
        offset += piece.size
        if offset >= stop:
            break
    return out


def coalesce(pieces: Iterable[Piece]) -> tuple[Piece, ...]:
    """Merge neighbouring plain pieces and adjacent spans, so layouts stay small."""
    out: list[Piece] = []
    for piece in pieces:
        if piece.size == 0:
            continue
        if piece.seed is None and out and out[-1].seed is None:
            spans = list(out[-1].spans)
            for a, b in piece.spans:
                if spans and spans[-1][1] == a:
                    spans[-1] = (spans[-1][0], b)
                else:
                    spans.append((a, b))
            out[-1] = Piece.plain(spans)
        else:
            out.append(piece)
    return tuple(out)
