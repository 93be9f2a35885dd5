"""What each slice consumed between two reader states, as (file, row group, row range) records.

Rows of a fully read window, or of unshuffled data, are exact ranges (``rows`` equals
``row_end - row_start``). Where a checkpoint falls inside a shuffled window, the rows consumed
are a seeded subset of the window: each record then gives the row group range and ``rows``, the
count of that range's rows consumed; the next checkpoint records the rest, so per row group the
counts over a run add up to its rows exactly once (what the exactly-once audit checks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lakeckpt_tables.plan import EpochPlan, Piece, PlanPolicy, _cut_spans, permutation, replan
from lakeckpt_tables.reader.state import PlanShape, ReaderState
from lakeckpt_tables.types import Unit

__all__ = ["Consumed", "consumed_between", "policy_for", "rebase"]


@dataclass(frozen=True, slots=True)
class Consumed:
    """Rows of one row group consumed by one slice between two checkpoints."""

    rank: int
    worker: int
    segment: int
    epoch: int
    file: str
    row_group: int
    row_start: int
    row_end: int
    rows: int


def policy_for(config: Mapping[str, Any], shape: PlanShape) -> PlanPolicy:
    """The plan policy a reader state was recorded under."""
    world, workers, batch = shape
    return PlanPolicy(batch_size=batch, world_size=world, workers=workers,
                      shuffle=bool(config["shuffle"]), seed=int(config["seed"]),
                      shuffle_window=int(config["shuffle_window"]),
                      drop_last=bool(config["drop_last"]))


def rebase(before: ReaderState | None, shape: PlanShape, units: tuple[Unit, ...]) -> ReaderState:
    """``before`` as seen by a reader of ``shape``: re-planned when the shape changed.

    The reader re-plans the same way when it resumes at another shape, so positions taken
    after the resume are relative to this state.
    """
    if before is None:
        raise ValueError("no state to rebase")
    if before.plan == shape:
        return before
    rows = np.array([u.rows for u in units], dtype=np.int64)
    first, layouts = replan(rows, policy_for(before.config, before.plan or shape),
                            before.layouts, before.positions())
    slices = ((first, 0),) * (shape[0] * shape[1])
    return ReaderState(before.table, before.version, before.segment, before.config, shape,
                       layouts, slices)


def consumed_between(
    units: tuple[Unit, ...], before: ReaderState | None, after: ReaderState
) -> list[Consumed]:
    """Records of every slice ``after`` knows, from its position in ``before`` (start if None).

    ``before`` must be of ``after``'s shape (see :func:`rebase`).
    """
    assert after.plan is not None, "a captured reader state always has a plan"
    policy = policy_for(after.config, after.plan)
    rows = np.array([u.rows for u in units], dtype=np.int64)
    plans: dict[int, EpochPlan] = {}
    out: list[Consumed] = []
    for g, end in enumerate(after.slices):
        if end is None:
            continue
        start = (0, 0) if before is None or before.slices[g] is None else before.slices[g]
        assert start is not None
        for epoch in range(start[0], end[0] + 1):
            if epoch not in plans:
                plans[epoch] = EpochPlan(rows, policy, segment=after.segment, epoch=epoch,
                                         layout=after.layouts.get(epoch))
            plan = plans[epoch]
            lo = start[1] if epoch == start[0] else 0
            hi = end[1] if epoch == end[0] else plan.delivered_rows(g)
            out.extend(_slice_records(plan, units, g, lo, hi))
    return _coalesce(out)


def _slice_records(plan: EpochPlan, units: tuple[Unit, ...], g: int, lo: int,
                   hi: int) -> list[Consumed]:
    rank, worker = divmod(g, plan.policy.workers)
    out: list[Consumed] = []
    offset = 0
    for window in plan.windows(g):
        a, b = max(lo - offset, 0), min(hi - offset, window.size)
        offset += window.size
        if a >= b:
            continue
        for u, r0, r1, n in _window_part(plan, window, a, b):
            unit = units[u]
            out.append(Consumed(rank, worker, plan.segment, plan.epoch, unit.path,
                                unit.row_group, r0, r1, n))
        if offset >= hi:
            break
    return out


def _window_part(plan: EpochPlan, window: Piece, a: int,
                 b: int) -> list[tuple[int, int, int, int]]:
    """(unit, row start, row end, rows consumed) for emission rows [a, b) of ``window``."""
    if window.seed is None:
        return [(u, r0, r1, r1 - r0)
                for u, r0, r1 in plan.locate(_cut_spans(window.spans, a, b))]
    chunks = plan.locate(window.spans)
    if a == 0 and b == window.size and window.lo == 0 and window.hi == sum(
            y - x for x, y in window.spans):
        return [(u, r0, r1, r1 - r0) for u, r0, r1 in chunks]
    # a seeded subset: count the consumed rows falling in each chunk of the window
    ordinal = _window_ordinals(window, a, b)
    starts = np.cumsum([0] + [r1 - r0 for _, r0, r1 in chunks])
    counts = np.bincount(np.searchsorted(starts, ordinal, "right") - 1, minlength=len(chunks))
    return [(u, r0, r1, int(n)) for (u, r0, r1), n in zip(chunks, counts, strict=True) if n]


def _window_ordinals(window: Piece, a: int, b: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Positions, within the window's unpermuted rows, of emission rows [a, b)."""
    total = sum(y - x for x, y in window.spans)
    assert window.seed is not None
    return permutation(total, window.seed)[window.lo + a : window.lo + b]


def _coalesce(records: list[Consumed]) -> list[Consumed]:
    out: list[Consumed] = []
    for rec in records:
        prev = out[-1] if out else None
        if (prev is not None and prev.rows == prev.row_end - prev.row_start
                and rec.rows == rec.row_end - rec.row_start
                and (prev.rank, prev.worker, prev.epoch, prev.file, prev.row_group)
                == (rec.rank, rec.worker, rec.epoch, rec.file, rec.row_group)
                and prev.row_end == rec.row_start):
            out[-1] = Consumed(prev.rank, prev.worker, prev.segment, prev.epoch, prev.file,
                               prev.row_group, prev.row_start, rec.row_end,
                               prev.rows + rec.rows)
        else:
            out.append(rec)
    return out
