"""What each slice consumed between two reader states, as ledger records.

The accounting itself is pure and lives in :mod:`lakeckpt_tables.plan.accounting` (which rows a
state has consumed, exact ranges and seeded subsets of shuffled windows, coalescing, round and
segment events); this module only turns its ranges into the ledger's records.
"""

from __future__ import annotations

from typing import Any, TypeVar

from lakeckpt_tables.ledger.records import ConsumptionRecord
from lakeckpt_tables.plan.accounting import Planner, Positions, consumed_ranges, round_events
from lakeckpt_tables.reader.packed import TokenPlanner

__all__ = ["consumed_between", "segment_events"]

S = TypeVar("S", bound=Positions)


def consumed_between(dataset: Planner[S], before: S | None,
                     after: S) -> list[ConsumptionRecord]:
    """Records of every slice ``after`` knows, from its position in ``before`` (start if None).

    ``before`` is first re-planned to ``after``'s shape if the shape changed in between
    (an elastic resume), exactly as the reader did.
    """
    planner = getattr(dataset, "planner", None)
    if isinstance(planner, TokenPlanner):  # packed: rows counted by their eos
        return [ConsumptionRecord(*r) for r in planner.consumed(before, after)]
    return [ConsumptionRecord(*r) for r in consumed_ranges(dataset, before, after)]


def segment_events(dataset: Planner[S], before: S | None,
                   after: S) -> list[tuple[str, dict[str, Any]]]:
    """Events between two states (:func:`lakeckpt_tables.plan.accounting.round_events`);
    none for a packed reader (its epochs' tails are logged when read)."""
    if isinstance(getattr(dataset, "planner", None), TokenPlanner):
        return []
    return round_events(dataset, before, after)
