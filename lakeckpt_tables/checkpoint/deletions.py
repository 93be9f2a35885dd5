"""A save's step of ``deletes="honor"``: deletions observed by rank 0, applied on every rank
(NOTE [ deletions honored ] in ``reader/deletions.py``)."""

from __future__ import annotations

from typing import Any

from lakeckpt_tables.checkpoint._world import World
from lakeckpt_tables.errors import CheckpointError
from lakeckpt_tables.ledger import LedgerEvent
from lakeckpt_tables.ledger.records import EXCLUDED_EVENT, REPLANNED_EVENT
from lakeckpt_tables.reader import ReaderState, encode_state, merge_states, reader_state_of
from lakeckpt_tables.reader.deletions import continue_from, observe_deletions

__all__ = ["honor_deletions"]


def honor_deletions(world: World, dataloader: Any) -> tuple[dict[str, Any],
                                                             list[LedgerEvent]] | None:
    """Collective, after this rank captured its reader state and consumption: every rank's
    state gathered to rank 0, which takes the rows the table deleted since out of what is not
    delivered; every rank goes on from the result. Returns this rank's reader state after it
    and the ``excluded`` events, or None when the reader does not honor deletions.

    Raises:
        DeletionUntraceableError: raised on rank 0, raised on every rank.
    """
    dataset = getattr(dataloader, "dataset", None)
    sources = getattr(dataset, "sources", None)  # a Mixture's
    if isinstance(sources, dict) and any(_honors(s) for s in sources.values()):
        raise CheckpointError("a Mixture source built with deletes='honor': a Mixture cannot "
                              "take deletions out of its sources yet; build them with "
                              "deletes='pin'")
    if not _honors(dataset):
        return None
    states = world.gather_to_root(reader_state_of(dataloader).to_dict())

    def decide() -> tuple[dict[str, Any] | None, list[LedgerEvent]] | None:
        assert states is not None
        merged = merge_states(states)
        if merged.plan is None:  # nothing read yet: nothing to take out
            return None
        state, details = observe_deletions(dataset, merged)
        events = [LedgerEvent(EXCLUDED_EVENT, detail) for detail in details]
        if state.slices != merged.slices:  # re-planned: the audit replays up to the state before
            events.append(LedgerEvent(REPLANNED_EVENT, {"from": encode_state(merged)}))
        return (None if state == merged else state.to_dict()), events

    outcome = world.decide(decide)
    if outcome is None:
        return None
    new, events = outcome
    if new is not None:
        continue_from(dataset, ReaderState.from_dict(new))  # marks only: no re-read
    return reader_state_of(dataloader).to_dict(), events


def _honors(dataset: Any) -> bool:
    return getattr(getattr(dataset, "options", None), "deletes", "pin") == "honor"
