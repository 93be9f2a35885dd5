"""Whether a reader state's positions and layouts can be those of the plan it claims (pure).

A state is checked against its own plan before it is trusted: every position is the end of a
batch the slice yields (or 0), every layout lies inside its round's rows and names each row
at most once. What cannot be told from the state alone: a position moved to another batch end
of the same slice (ahead: rows skipped; behind: rows repeated), a layout that leaves rows out,
or a follow segment descriptor changed to another valid commit range. Checksums over the
stored state (the ledger's) are what catch those.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from lakeckpt_tables.plan.epoch import EpochPlan
from lakeckpt_tables.plan.pieces import Piece

__all__ = ["layout_problem", "position_problem"]


def position_problem(plan: EpochPlan, g: int, position: int) -> str | None:
    """Why ``position`` cannot be slice ``g``'s in ``plan`` (None when it can)."""
    if position == 0:
        return None
    ends = plan.batch_ends(g)
    if position > plan.delivered_rows(g):
        return (f"slice {g} stands at row {position} of round {plan.epoch}, past the "
                f"{plan.delivered_rows(g)} rows it delivers")
    j = int(np.searchsorted(ends, position))
    if j >= len(ends) or int(ends[j]) != position:
        return (f"slice {g} stands at row {position} of round {plan.epoch}, which ends none "
                "of its batches")
    return None


def layout_problem(layout: Sequence[Piece], total: int) -> str | None:
    """Why ``layout`` cannot be a re-plan of a round of ``total`` rows (None when it can).

    Pieces sharing spans, seed and shuffler are cuts of one shuffled window: their
    ``[lo, hi)`` must be disjoint. Otherwise no two pieces may share a base row (cuts of one
    window permuted by two shufflers may: they are refused).
    """
    groups: dict[tuple[tuple[tuple[int, int], ...], int | None, str], list[tuple[int, int]]] = {}
    for piece in layout:
        if any(a < 0 or b > total for a, b in piece.spans):
            return f"a layout piece names rows {list(piece.spans)} outside the round's {total}"
        key = ((piece.spans, piece.seed, piece.shuffler) if piece.seed is not None
               else (piece.spans, None, ""))
        groups.setdefault(key, []).append((piece.lo, piece.hi))
    spans: list[tuple[int, int]] = []
    for (group_spans, seed, _), cuts in groups.items():
        cuts.sort()
        if any(b > c for (_, b), (c, _) in itertools.pairwise(cuts)):
            return "two layout pieces are overlapping cuts of one window"
        if seed is None and len(cuts) > 1:
            return "a layout names the same rows twice"
        spans.extend(group_spans)
    spans.sort()
    for (_, b), (c, _) in itertools.pairwise(spans):
        if c < b:
            return "a layout names the same rows twice"
    if sum(p.size for p in layout) > total:
        return f"a layout holds more rows than the round's {total}"
    return None
