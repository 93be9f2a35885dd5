"""What each slice consumed between two reader states, as (file, row group, row range) records.

Rows of a fully read window, or of unshuffled data, are exact ranges (``rows`` equals
``row_end - row_start``). Where a checkpoint falls inside a shuffled window, the rows consumed
are a seeded subset of the window: each record then gives the row group range and ``rows``, the
count of that range's rows consumed; the next checkpoint records the rest, so per row group the
counts over a run add up to its rows exactly once (what the exactly-once audit checks).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lakeckpt_tables.ledger.records import ConsumptionRecord
from lakeckpt_tables.plan import EpochPlan, Piece, _cut_spans, permutation
from lakeckpt_tables.reader.dataset import LakeDataset
from lakeckpt_tables.reader.rounds import RoundUnits
from lakeckpt_tables.reader.state import ReaderState

__all__ = ["consumed_between", "segment_events"]


def consumed_between(dataset: LakeDataset, before: ReaderState | None,
                     after: ReaderState) -> list[ConsumptionRecord]:
    """Records of every slice ``after`` knows, from its position in ``before`` (start if None).

    ``before`` is first re-planned to ``after``'s shape if the shape changed in between
    (an elastic resume), exactly as the reader did.
    """
    assert after.plan is not None, "a captured reader state always has a plan"
    if before is not None:
        before = dataset.reshape(before, after.plan)
    known = {**(before.rounds if before is not None else {}), **after.rounds}
    plans: dict[int, tuple[EpochPlan, RoundUnits]] = {}
    out: list[ConsumptionRecord] = []
    for g, end in enumerate(after.slices):
        if end is None:
            continue
        start = (0, 0) if before is None or before.slices[g] is None else before.slices[g]
        assert start is not None
        for index in range(start[0], end[0] + 1):
            if index not in plans:
                plans[index] = dataset.round_plan(index, after.plan, dict(after.layouts), known)
            plan, units = plans[index]
            lo = start[1] if index == start[0] else 0
            hi = end[1] if index == end[0] else plan.delivered_rows(g)
            out.extend(_slice_records(plan, units, g, lo, hi))
    return _coalesce(out)


def segment_events(dataset: LakeDataset, before: ReaderState | None,
                   after: ReaderState) -> list[tuple[str, dict[str, Any]]]:
    """Events between two states: options changed on resume (``policy_change``), and for the
    rounds first reached, the ``round`` itself, follow segments formed, the commits they
    skipped, and rows the plan does not deliver (``undelivered``)."""
    events = _policy_changes(before, after)
    if after.plan is None:
        return events
    reached = max((s[0] for s in after.slices if s is not None), default=0)
    since = -1 if before is None else max((s[0] for s in before.slices if s is not None),
                                          default=0)
    known = {**(before.rounds if before is not None else {}), **after.rounds}
    for index in range(since + 1, reached + 1):
        rnd = dataset.round_at(index, after.plan, after.layouts, known)
        if rnd is None:
            break
        known[index] = rnd
        units = dataset.rounds.units(rnd)
        plan, _ = dataset.round_plan(index, after.plan, dict(after.layouts), known)
        events.append(("round", {
            "round": index, "segment": rnd.segment, "epoch": rnd.epoch, "version": rnd.to,
            "base_version": rnd.base, "rows": int(units.rows.sum()),
            "delivered": sum(plan.delivered_rows(g) for g in range(plan.policy.slices))}))
        if dataset.follow is not None and index > 0:
            events.append(("segment", {"segment": rnd.segment, "from_version": rnd.base,
                                       "to_version": rnd.to, "rows": int(units.rows.sum()),
                                       "files": len({u.path for u in units.units})}))
            events.extend(("skipped_commit", {"segment": rnd.segment, "version": version,
                                              "reason": reason})
                          for version, reason in rnd.skipped)
        events.extend(_undelivered(plan, units, carried=dataset.follow is not None))
    return events


def _policy_changes(before: ReaderState | None,
                    after: ReaderState) -> list[tuple[str, dict[str, Any]]]:
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
    goes on (NOTE [ segment tails are carried ] in lakeckpt_tables.reader.rounds)."""
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


def _slice_records(plan: EpochPlan, units: RoundUnits, g: int, lo: int,
                   hi: int) -> list[ConsumptionRecord]:
    rank, worker = divmod(g, plan.policy.workers)
    out: list[ConsumptionRecord] = []
    offset = 0
    for window in plan.windows(g):
        a, b = max(lo - offset, 0), min(hi - offset, window.size)
        offset += window.size
        if a >= b:
            continue
        for u, r0, r1, n in _window_part(plan, window, a, b):
            unit, first, end = units.at(u, r0, r1)
            out.append(ConsumptionRecord(rank, worker, plan.segment, plan.epoch, unit.path,
                                         unit.row_group, first, end, n))
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


def _coalesce(records: list[ConsumptionRecord]) -> list[ConsumptionRecord]:
    out: list[ConsumptionRecord] = []
    for rec in records:
        prev = out[-1] if out else None
        if (prev is not None and prev.rows == prev.row_end - prev.row_start
                and rec.rows == rec.row_end - rec.row_start
                and (prev.rank, prev.worker, prev.epoch, prev.file, prev.row_group)
                == (rec.rank, rec.worker, rec.epoch, rec.file, rec.row_group)
                and prev.row_end == rec.row_start):
            out[-1] = ConsumptionRecord(prev.rank, prev.worker, prev.segment, prev.epoch, prev.file,
                               prev.row_group, prev.row_start, rec.row_end,
                               prev.rows + rec.rows)
        else:
            out.append(rec)
    return out
