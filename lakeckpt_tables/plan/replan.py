"""Elastic re-plans: every old slice's undelivered rows as layouts a plan of any new shape
reads (NOTE [ pieces and layouts ] in ``lakeckpt_tables.plan``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lakeckpt_tables.plan.epoch import EpochPlan
from lakeckpt_tables.plan.pieces import Piece, coalesce
from lakeckpt_tables.plan.policy import PlanPolicy

__all__ = ["SlicePosition", "replan", "replan_rounds", "rest"]


SlicePosition = tuple[int, int]  # (epoch, rows delivered in that epoch)


def replan(
    unit_rows: Sequence[int] | np.ndarray[Any, Any],
    old: PlanPolicy,
    layouts: dict[int, tuple[Piece, ...]],
    positions: Sequence[SlicePosition],
    *,
    segment: int = 0,
) -> tuple[int, dict[int, tuple[Piece, ...]]]:
    """Turn every old slice's undelivered rows into layouts any new policy can plan.

    The epochs of one segment share its units; see :func:`replan_rounds` for rounds with
    units of their own (follow mode).

    Args:
        unit_rows: the segment's unit sizes, canonical order.
        old: the policy the positions were recorded under.
        layouts: the old plan's layouts by epoch (default layout where absent).
        positions: ``(epoch, rows delivered)`` of every old slice, by slice index.
        segment: segment index.

    Returns:
        The epoch to start at, and a layout for every epoch some slice had begun (now or
        under an older shape).
    """
    if len(positions) != old.slices:
        raise ValueError(f"{len(positions)} positions for {old.slices} slices")

    def plan_for(epoch: int, layout: Sequence[Piece] | None) -> EpochPlan:
        return EpochPlan(unit_rows, old, segment=segment, epoch=epoch, layout=layout)

    return replan_rounds(plan_for, layouts, positions)


def replan_rounds(
    plan_for: Callable[[int, Sequence[Piece] | None], EpochPlan],
    layouts: dict[int, tuple[Piece, ...]],
    positions: Sequence[SlicePosition],
    *,
    carried: bool = False,
) -> tuple[int, dict[int, tuple[Piece, ...]]]:
    """:func:`replan` over rounds: ``plan_for(round, layout)`` gives a round's old plan.

    ``carried``: a round's tail went to the round after it (follow segments: NOTE [ segment
    tails are carried ] in ``lakeckpt_tables.reader.rounds``), so only the last round's tail,
    not carried yet, is re-planned; otherwise every round's tail is.

    Returns:
        The round to start at, and a layout for every round some slice had begun.
    """
    first = min(e for e, _ in positions)
    last = max(e for e, _ in positions)
    # A round past every slice's position may still carry the layout of an earlier re-plan
    # (some slice of an older shape had begun it): keep it, or its delivered rows come back.
    new_layouts = {e: tuple(ps) for e, ps in layouts.items() if e > last}
    for epoch in range(first, last + 1):
        plan = plan_for(epoch, layouts.get(epoch))
        pieces: list[Piece] = []
        for g, (e, pos) in enumerate(positions):
            if e <= epoch:
                pieces.extend(rest(plan, g, pos if e == epoch else 0))
        if not carried or epoch == last:
            pieces.extend(plan.tail())
        new_layouts[epoch] = coalesce(pieces)
    return first, new_layouts


def rest(plan: EpochPlan, g: int, position: int) -> list[Piece]:
    """:meth:`EpochPlan.remaining`, but the whole windows of a plain layout piece as one
    piece: what :func:`~lakeckpt_tables.plan.pieces.coalesce` makes of them, without listing
    them (a re-plan of 256 x 8 slices over 8 x 10^6 units listed ~60,000 windows: seconds).
    ``coalesce(rest(...)) == coalesce(remaining(...))``."""
    out: list[Piece] = []
    offset = index = 0  # rows and windows of the slice before the piece
    k = plan.policy.shuffle_window
    for piece in plan.slice_layout(g):
        start, offset = position - offset, offset + piece.size
        if piece.seed is not None:  # a (partial) window of an earlier plan: one window
            index += 1
            if start < piece.size:
                out.extend(plan.remaining_of(piece, max(start, 0)))
            continue
        cuts = [plan.unit_cuts(span) for span in piece.spans]  # the piece's unit chunks
        firsts = np.concatenate([np.concatenate([[a], c]) for (a, _), c in
                                 zip(piece.spans, cuts, strict=True)]).astype(np.int64)
        ends = np.concatenate([np.concatenate([c, [b]]) for (_, b), c in
                               zip(piece.spans, cuts, strict=True)]).astype(np.int64)
        bounds = np.cumsum(np.add.reduceat(ends - firsts, np.arange(0, len(ends), k)))
        if start < piece.size:
            if start <= 0:
                out.append(Piece.plain(piece.spans))
            else:
                w = int(np.searchsorted(bounds, start, "right"))
                lo = int(bounds[w - 1]) if w else 0
                chunks = list(zip(firsts[w * k:(w + 1) * k].tolist(),
                                  ends[w * k:(w + 1) * k].tolist(), strict=True))
                out.extend(plan.remaining_of(plan.window(g, index + w, Piece.plain(chunks)),
                                             start - lo))
                out.append(piece.cut(int(bounds[w]), piece.size))
        index += len(bounds)
    return out
