"""What a checkpoint keeps of a dataloader: the reader state of a LakeDataset or of a Mixture,
what each rank consumed since the previous checkpoint, and the way back.

NOTE [ mixture accounting ]
A Mixture's checkpoint holds one mixture state: every worker's position (ranks draw in
lockstep, so theirs agree) and each source's reader state merged over ranks and workers
(:func:`~lakeckpt_tables.mixture.merge_mixture_states`). Each rank accounts for each source as
for a lone reader: the rows its slices of that source consumed since the previous checkpoint's
merged state of that source, every record named by the source's key (``source_key``) and its
events' details too. A source not drawn yet has no plan and consumed nothing. The checkpoint
record names no single source table (``source`` is null): its ``sources`` name each key's
table and pinned version (:func:`sources_of`), and the ``source`` events do too, per key.
With ``on_exhausted="cycle"`` a source's next pass is its next epochs (NOTE [ cycling sources ]
in ``lakeckpt_tables/mixture/dataset.py``): its records name the epoch that read each row, as for a
reader built with ``epochs=N``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from lakeckpt_tables.checkpoint.consumption import consumed_between, segment_events
from lakeckpt_tables.checkpoint.recipe import source_events
from lakeckpt_tables.errors import CheckpointError
from lakeckpt_tables.ledger import ConsumptionRecord, LedgerEvent, SourceVersion
from lakeckpt_tables.mixture import Mixture, is_mixture_state, merge_mixture_states
from lakeckpt_tables.mixture.state import KEY_POSITIONS, paired_reader_states
from lakeckpt_tables.reader import (
    ReaderState,
    dataset_of,
    merge_states,
    reader_state_of,
    restore_reader,
)
from lakeckpt_tables.reader.loaders import states_from_loader
from lakeckpt_tables.types import TableIdentity

__all__ = ["EVENT_MIXTURE_ENDED", "Captured", "capture", "merged", "restore", "sources_of"]

Captured = tuple[dict[str, Any] | None, list[ConsumptionRecord], list[LedgerEvent]]

EVENT_MIXTURE_ENDED = "mixture_ended"
"""Event of the first checkpoint whose Mixture state has ended (``on_exhausted="stop"``: a
source ran out, the run is over; sources with rows left stay unfinished): ``{"on_exhausted"}``.
The views call such a run ``finished`` and its unfinished passes ``stopped``."""


def capture(dataloader: Any, baseline: Mapping[str, Any] | None) -> Captured:
    """This rank's reader state (its workers merged), the rows it consumed since ``baseline``
    (the previous checkpoint's merged state, None at the run's start) and the events."""
    if dataloader is None:
        return None, [], []
    mixture = getattr(dataloader, "dataset", None)
    if isinstance(mixture, Mixture):
        if getattr(dataloader, "batch_size", None) is not None:
            raise CheckpointError("build the StatefulDataLoader with batch_size=None: the "
                                  "Mixture yields whole batches")
        state = merge_mixture_states(states_from_loader(dataloader.state_dict()))
        datasets: dict[str | None, Any] = dict(mixture.sources.items())
    else:
        state, datasets = reader_state_of(dataloader).to_dict(), {None: dataset_of(dataloader)}
    consumed: list[ConsumptionRecord] = []
    events: list[LedgerEvent] = []
    for key, after, was in paired_reader_states(state, baseline):
        before = None if was is None else ReaderState.from_dict(was)
        if key is not None and before is not None and before.plan is None:
            before = None  # a source not drawn yet at the baseline: its reading starts now
        c, e = _accounting(datasets[key], before, ReaderState.from_dict(after), key)
        consumed += c
        events += e
    if isinstance(mixture, Mixture):  # NOTE [ sources that change ] (checkpoint/recipe.py)
        events = source_events(mixture, baseline, state) + events
    if isinstance(mixture, Mixture) and _ended(state) and not _ended(baseline):
        events.append(LedgerEvent(EVENT_MIXTURE_ENDED, {"on_exhausted": mixture.on_exhausted}))
    return state, consumed, events


def _ended(state: Mapping[str, Any] | None) -> bool:
    """Whether a mixture state's every worker has ended (a source ran out under "stop")."""
    if state is None or not is_mixture_state(state):
        return False
    positions = state.get(KEY_POSITIONS) or []
    return bool(positions) and all(p is not None and p.get("ended") for p in positions)


def merged(readers: list[dict[str, Any]], where: str) -> tuple[
        dict[str, Any] | None, TableIdentity | None, int | None]:
    """Every rank's reader states as one: (state, its table, its version); a Mixture's names
    no one table.

    Raises:
        CheckpointError: the states do not cover every rank and worker.
    """
    if not readers:
        return None, None, None
    if is_mixture_state(readers[0]):
        return merge_mixture_states(readers), None, None
    reader = merge_states(readers)
    if reader.plan is not None and not reader.complete:
        raise CheckpointError(f"{where}: the ranks' reader states do not cover every rank "
                              "and worker")
    return reader.to_dict(), reader.table, reader.version


def sources_of(state: Mapping[str, Any] | None) -> dict[str, SourceVersion] | None:
    """A Mixture state's sources: each key's table and the version its reader state pins;
    None for a lone reader's state (the record's ``source`` names its table)."""
    if state is None or not is_mixture_state(state):
        return None
    out = {}
    for key, source in sorted(state["sources"].items()):
        reader = ReaderState.from_dict(source)
        out[key] = SourceVersion(reader.table, reader.version)
    return out


def restore(dataloader: Any, state: Mapping[str, Any]) -> None:
    """Resume ``dataloader`` from a checkpoint's merged reader state, through its dataset."""
    if isinstance(getattr(dataloader, "dataset", None), Mixture):
        dataloader.dataset.load_state_dict(dict(state))
        return
    restore_reader(dataloader, ReaderState.from_dict(state))


def _accounting(dataset: Any, before: ReaderState | None, after: ReaderState,
                key: str | None) -> tuple[list[ConsumptionRecord], list[LedgerEvent]]:
    """The records and events of one reader between two states, named by ``key``."""
    if after.plan is None:  # nothing iterated yet
        return [], []
    consumed = [replace(c, source_key=key) for c in consumed_between(dataset, before, after)]
    events = [LedgerEvent(name, _keyed(detail, key))
              for name, detail in segment_events(dataset, before, after)]
    if before is None:  # the first checkpoint that read this table
        events.insert(0, LedgerEvent("source", _keyed(_source_detail(dataset.source, after),
                                                      key)))
    return consumed, events


def _keyed(detail: dict[str, Any], key: str | None) -> dict[str, Any]:
    return detail if key is None else {**detail, "source_key": key}


def _source_detail(source: Any, state: ReaderState) -> dict[str, Any]:
    """``source`` event: the table read and, for Iceberg, the NAME of its catalog and its
    identifier (never the catalog's URI or properties), so audits can open it again."""
    catalog = getattr(getattr(source, "catalog", None), "name", None)
    identifier = getattr(source, "identifier", None)
    if isinstance(identifier, tuple):
        identifier = ".".join(identifier)
    return {**state.table.to_json(), "catalog": catalog,
            "identifier": identifier if catalog is not None else None}
