"""Recipe changes at a resume, as ledger events: a Mixture's weights or weight schedule
changed, or a source added or retired, between the checkpoint a job resumed from and the one
it commits.

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

NOTE [ sources that change ]
The run's first checkpoint records the recipe it starts with (``mixture``: ``seed``,
``on_exhausted``, ``weights`` (or the schedule), ``sources``), so that with the changes the
ledger says, in SQL, which recipe every checkpoint trained under.

A source of the Mixture that the resumed state lacks is *added*: it starts its first pass,
drawn from the first draw not delivered on (``source_added``: ``source_key``, ``draw``,
``table``). A source named by ``Mixture(..., retire=[...])`` is *retired*: never drawn again,
left out of the states from then on; its reader state at the resume says what it had not
delivered, and the first checkpoint after the resume records it (``source_retired``:
``source_key``, ``draw``, ``table``, ``epoch``, ``rows``/``tokens`` not delivered of the
epochs its slices stood in, ``state``: its encoded state), with an ``undelivered`` event of
``reason`` "source retired" for those rows, so that ``progress`` counts the pass as given
(and shows the source ``retired``) and ``verify`` names it among ``retired``, not as rows
missing. A state source neither in the Mixture nor retired is refused by name. Both events
are rank 0's, derived from the resumed state (the baseline) and the retired source's dataset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lakeckpt_tables.ledger import CheckpointRecord, LedgerEvent
from lakeckpt_tables.mixture.state import (
    KEY_CONFIG,
    KEY_POSITIONS,
    KEY_SOURCES,
    KEY_TABLES,
    KEY_WORKERS,
    is_mixture_state,
    same_json,
)
from lakeckpt_tables.mixture.weights import as_schedule
from lakeckpt_tables.reader import decode_state, encode_state
from lakeckpt_tables.reader.state import ReaderState

__all__ = ["ADDED_EVENT", "MIXTURE_EVENT", "RETIRED_EVENT", "WEIGHTS_EVENT",
           "first_undelivered_draw", "recipe_events", "source_events"]

MIXTURE_EVENT, WEIGHTS_EVENT = "mixture", "mixture_weights"
ADDED_EVENT, RETIRED_EVENT = "source_added", "source_retired"


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


def source_events(mixture: Any, baseline: Mapping[str, Any] | None,
                  after: Mapping[str, Any]) -> list[LedgerEvent]:
    """The sources ``mixture`` added or retired since ``baseline`` (the merged state this job
    resumed from or committed last; None: the run's start, whose recipe is recorded), NOTE
    [ sources that change ]."""
    if baseline is None:  # the run's first checkpoint: the recipe it starts with, readable
        config = after[KEY_CONFIG]
        return [LedgerEvent(MIXTURE_EVENT, {"seed": config["seed"],
                                            "on_exhausted": config["on_exhausted"],
                                            "weights": config["weights"],
                                            "sources": sorted(after[KEY_SOURCES])})]
    if not is_mixture_state(baseline):
        return []
    draw = first_undelivered_draw(baseline)
    before, now = set(baseline[KEY_SOURCES]), set(after[KEY_SOURCES])
    events = [LedgerEvent(ADDED_EVENT, {"source_key": key, "draw": draw,
                                        "table": after[KEY_TABLES].get(key)})
              for key in sorted(now - before)]
    for key in sorted(before - now):
        state = baseline[KEY_SOURCES][key]
        left = _undelivered(mixture.retired[key], state)
        detail = {"source_key": key, "draw": draw, "table": baseline[KEY_TABLES].get(key),
                  **left, "state": encode_state(state)}
        events.append(LedgerEvent(RETIRED_EVENT, detail))
        if left["rows"] or left["tokens"]:
            events.append(LedgerEvent("undelivered", {
                "source_key": key, "segment": 0, "epoch": left["epoch"],
                "reason": "source retired", "rows": left["rows"],
                "tokens": left["tokens"] or 0}))
    return events


def _undelivered(dataset: Any, value: Mapping[str, Any]) -> dict[str, Any]:
    """What a retired source's slices had yet to deliver of the epochs they stood in: rows
    (a row reader's) or tokens (a packed reader's, whole sequences)."""
    state = ReaderState.from_dict(value)
    if state.plan is None:  # never drawn: its whole first epoch
        units = dataset.snapshot.units
        return {"epoch": 0, "rows": int(sum(u.rows for u in units)), "tokens": None}
    positions = state.positions()
    first, last = min(e for e, _ in positions), max(e for e, _ in positions)
    pack = state.config.get("pack")
    rows = tokens = 0
    for index in range(first, last + 1):
        if pack is not None:
            plan = dataset.planner.token_plan(state.plan, index, state.layouts.get(index))
            due = [plan.per_slice] * len(positions)
        else:
            epoch_plan, _ = dataset.round_plan(index, state.plan, dict(state.layouts),
                                               dict(state.rounds))
            due = [epoch_plan.delivered_rows(g) for g in range(len(positions))]
        left = sum(d - (p if e == index else 0) for d, (e, p) in zip(due, positions, strict=True)
                   if e <= index)
        if pack is not None:
            tokens += left * int(pack["seq_len"])
        else:
            rows += left
    return {"epoch": first, "rows": rows, "tokens": tokens if pack is not None else None}
