"""Rows taken out of a layout: what an honored deletion does to the plan (pure).

NOTE [ excluding rows from a layout ]
A layout (NOTE [ pieces and layouts ] in ``lakeckpt_tables.plan``) names base rows; taking
rows out of it keeps every other row where it stands in the order:
- a plain piece loses them from its spans (a span is cut around each run of them);
- a seeded piece (a shuffled window, begun or not) keeps its spans, seed and shuffler, and is
  cut at the emission positions of the rows taken out: ``[lo, hi)`` becomes the runs of
  positions between them, each a piece of the same window. The window's other rows come out
  in the order they would have.
The result is a layout again (cuts of one window disjoint, no row twice), so a plan of any
shape reads it, an elastic re-plan composes with it, and ``validate.layout_problem`` accepts
it. A layout grows by one span or piece per run of rows taken out that is not at an end: the
price of exactness, paid in reader state only where rows were deleted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lakeckpt_tables.plan.epoch import EpochPlan
from lakeckpt_tables.plan.pieces import Piece, coalesce

__all__ = ["base_rows", "without"]


def without(layout: Sequence[Piece], rows: np.ndarray[Any, Any]) -> tuple[tuple[Piece, ...],
                                                                           np.ndarray[Any, Any]]:
    """``layout`` less the base rows ``rows``; and which of ``rows`` it held (sorted).

    Args:
        layout: an epoch's layout.
        rows: base rows to take out (any order, repeats allowed; rows the layout does not
            hold are ignored: delivered already, or taken out before).
    """
    drop = np.unique(np.asarray(rows, dtype=np.int64))
    if not len(drop):
        return tuple(layout), drop
    out: list[Piece] = []
    held: list[np.ndarray[Any, Any]] = []
    for piece in layout:
        if piece.seed is None:
            kept, gone = _plain_without(piece, drop)
            out.append(kept)
        else:
            cuts, gone = _window_without(piece, drop)
            out.extend(cuts)
        held.append(gone)
    return coalesce(out), np.sort(np.concatenate(held)) if held else drop[:0]


def _plain_without(piece: Piece, drop: np.ndarray[Any, Any]) -> tuple[Piece,
                                                                      np.ndarray[Any, Any]]:
    spans: list[tuple[int, int]] = []
    gone: list[np.ndarray[Any, Any]] = []
    for a, b in piece.spans:  # a plain piece is all of its spans (lo 0, hi their size)
        lo, hi = np.searchsorted(drop, [a, b])
        inside = drop[lo:hi].tolist()
        if inside:
            gone.append(drop[lo:hi])
        for x, y in zip([a, *(d + 1 for d in inside)], [*inside, b], strict=True):
            spans.append((x, y))  # empty ones are dropped by Piece.plain
    return (Piece.plain(spans),
            np.concatenate(gone) if gone else np.empty(0, np.int64))


def _window_without(piece: Piece, drop: np.ndarray[Any, Any]) -> tuple[list[Piece],
                                                                       np.ndarray[Any, Any]]:
    first, last = piece.spans[0][0], piece.spans[-1][1]
    lo, hi = np.searchsorted(drop, [first, last])
    if lo == hi:
        return [piece], np.empty(0, np.int64)
    emitted = piece.rows()  # base rows in emission order, positions lo..hi of the window
    hit = np.isin(emitted, drop[lo:hi])
    if not hit.any():
        return [piece], np.empty(0, np.int64)
    at = np.flatnonzero(hit)
    starts = [0, *(at + 1).tolist()]
    ends = [*at.tolist(), len(emitted)]
    cuts = [Piece(piece.spans, piece.seed, piece.lo + s, piece.lo + e, piece.shuffler)
            for s, e in zip(starts, ends, strict=True) if e > s]
    return cuts, emitted[hit]


def base_rows(plan: EpochPlan, units: Any,
              rows: dict[int, np.ndarray[Any, Any]]) -> dict[int, np.ndarray[Any, Any]]:
    """Per row group ``i``, the base rows of ``plan`` (an epoch's whole base space: no layout)
    holding its live rows ``rows[i]``, in their order (``units``: a
    :class:`~lakeckpt_tables.plan.rounds.RoundUnits` without carried rows).

    A row group may be cut into several plan units (NOTE [ bounded units ]): each row lands
    in the unit whose first row is the last at or before it.
    """
    if not rows:
        return {}
    n = len(units.rows)
    source = np.asarray(units.source[np.arange(n, dtype=np.int64)], dtype=np.int64)
    first = np.asarray(units.first[np.arange(n, dtype=np.int64)], dtype=np.int64)
    position = np.empty(n, dtype=np.int64)
    position[np.asarray(plan.order, dtype=np.int64)] = np.arange(n, dtype=np.int64)
    offsets = plan.offsets
    order = np.argsort(source, kind="stable")  # plan units by row group, in order
    starts = np.searchsorted(source[order], np.arange(int(source.max()) + 2 if n else 1))
    out = {}
    for group, live in rows.items():
        members = order[starts[group]:starts[group + 1]]
        if not len(members):
            continue
        live = np.asarray(live, dtype=np.int64)
        k = np.searchsorted(first[members], live, "right") - 1
        u = members[k]
        out[group] = offsets[position[u]] + live - first[u]
    return out
