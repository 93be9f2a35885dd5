"""Recipe changes at a resume, as ledger events: a Mixture's weights or weight schedule
changed between the checkpoint a job resumed from and the one it commits.

NOTE [ recipe changes ]
A recipe change is a config change at a restart: the job builds its Mixture with the new
weights and restores the run's checkpoint into it (``Mixture.load_state_dict`` accepts other
weights, never another seed or policy). Nothing else moves: every source goes on from its own
cursor, so no row is repeated or lost, and the new weights rule every draw not delivered at
the checkpoint (per DataLoader worker, its own next draw on). The change is derived, like the
eos counts (``checkpoint/eos_count.py``), from the merged states alone: the coordinator
compares the configuration of the checkpoint this job committed or restored last with the one
it commits, and records a ``mixture_weights`` event with the checkpoint that first trained
under the new weights::

    {"draw": first draw under the new weights, "step": the step resumed from,
     "resumed_from": its checkpoint id, "old": ..., "new": ... (the states' weights: a
     {name: weight} or a schedule), "in_force_before": ..., "in_force_after": ... (the
     weights of that draw under each)}

A state's configuration always holds the weights it was read under, so a later resume
from any checkpoint compares against the right ones (a restart from a checkpoint before the
change, after a loss spike, with the old weights again records the change back).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lakeckpt_tables.ledger import CheckpointRecord, LedgerEvent
from lakeckpt_tables.mixture.state import (
    KEY_CONFIG,
    KEY_POSITIONS,
    KEY_SOURCES,
    KEY_WORKERS,
    is_mixture_state,
    same_json,
)
from lakeckpt_tables.mixture.weights import as_schedule
from lakeckpt_tables.reader import decode_state

__all__ = ["WEIGHTS_EVENT", "first_undelivered_draw", "recipe_events"]

WEIGHTS_EVENT = "mixture_weights"


def recipe_events(before: CheckpointRecord | None,
                  after: Mapping[str, Any] | None) -> list[LedgerEvent]:
    """The recipe changes between ``before`` (the checkpoint this job committed or restored
    last; None: the run's start) and the merged reader state ``after`` (NOTE [ recipe
    changes ])."""
    if before is None or not before.reader_state or after is None or not is_mixture_state(after):
        return []
    was = decode_state(before.reader_state)
    if not is_mixture_state(was):
        return []
    old, new = was[KEY_CONFIG]["weights"], after[KEY_CONFIG]["weights"]
    if same_json(old, new):
        return []
    draw = first_undelivered_draw(was)
    return [LedgerEvent(WEIGHTS_EVENT, {
        "draw": draw, "step": before.step, "resumed_from": before.checkpoint_id,
        "old": old, "new": new,
        "in_force_before": _in_force(old, was, draw), "in_force_after": _in_force(new, after, draw),
    })]


def first_undelivered_draw(state: Mapping[str, Any]) -> int:
    """The first draw no DataLoader worker of a mixture state delivered (0: nothing drawn)."""
    workers = state[KEY_WORKERS]
    if workers is None:
        return 0
    return min(p["draw"] if p is not None else i for i, p in enumerate(state[KEY_POSITIONS]))


def _in_force(weights: Any, state: Mapping[str, Any], draw: int) -> dict[str, float]:
    return as_schedule(weights, sorted(state[KEY_SOURCES])).in_force(draw)
