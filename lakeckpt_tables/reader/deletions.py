"""Rows the table deletes after the pin, taken out of a pinned pass at a checkpoint.

NOTE [ deletions honored ]
``LakeDataset(..., deletes="honor")``: a row deleted from the table after the pin (a Delta
deletion vector, an Iceberg position delete or deletion vector, a copy-on-write rewrite whose
rows a ``deletes_key`` names: NOTE [ observing deletions ] in ``sources/changes.py``) is not
delivered once the deletion has taken effect. When it takes effect must be one point every
rank agrees on, and the same after any crash, or lockstep and exact resume are lost. So:

1. *Observed at a checkpoint, by one process.* In ``CheckpointManager.save``, after every rank
   captured its reader state and consumption, the ranks' states are gathered to rank 0, which
   reads the commits since the last one the state observed (``ReaderState.deletes_seen``; the
   pin at first) and lists what they deleted of the pinned rows.
2. *Applied to the rows not yet delivered, re-planned as an elastic resume re-plans.* Every
   slice's undelivered rows become layouts (``plan.replan.replan_rounds``, the elastic
   machinery, at the same shape), the deleted rows are taken out of them (NOTE [ excluding rows
   from a layout ] in ``plan/exclude.py``), and so out of every later epoch of the pass too
   (a layout of its whole base space, less them). Every slice restarts at position 0 of the
   new layouts: every rank yields the same number of batches from there (NOTE [ lockstep ]).
3. *Broadcast and committed with the checkpoint.* Rank 0 broadcasts the new state; every rank
   continues from it at its next batch; the checkpoint's reader state IS the new state, and
   its ledger commit holds one ``excluded`` event per deleting commit (table version,
   operation, how, the rows deleted and, per epoch, the rows taken out, as (file, row group,
   first, end) live-row ranges as consumption records count them). No commit, no exclusion:
   a crash before it resumes the previous checkpoint, which observes again.
Nothing is observed between checkpoints, and a pass that finds no commit since the last one
pays one read of the log per checkpoint (no re-plan, the state unchanged but for
``deletes_seen``).

*The bound.* A row deleted by a commit that lands while checkpoint ``k`` is being saved or
after it is trained on at most until checkpoint ``k + 1`` is saved: by the batches of one
checkpoint interval, and never after the checkpoint that recorded its exclusion (a crash in
between resumes checkpoint ``k``, which has not excluded it; the re-run observes the table
again at ``k + 1``). Rows delivered before the deletion was observed stay delivered: the
ledger says which (the audit's exposure).

NOTE [ exclusion lists ]
``exclusions=ExclusionList(source, column, matches=...)``: a table of keys (deletion requests,
or rows of a table that cannot be changed: an archive, another team's table) whose rows are
not delivered. A pass that starts afresh starts without them: when it is first iterated, rank
0 reads the list's latest version, broadcasts it, and every rank takes the rows whose
``matches`` column holds one of its keys out of the plan before the first batch (recorded, as
``excluded`` events, with the first checkpoint). At each checkpoint the list is read again
under the rule above: keys added since the version the state applied
(``ReaderState.exclusions_seen``) are taken out of what is not delivered yet, each event
naming the list's version and ``how="list"``. A key removed from the list does not bring its
rows back. Reading the list costs a read of it per checkpoint; finding its rows, one read of
the ``matches`` column of the pinned table (kept by rank 0 for the next ones).

Limits, refused by name: DataLoader worker processes (a worker's position cannot be replaced
in mid-pass; read with ``num_workers=0``), follow mode, ``refresh="epoch"``, packing, filters,
a cycling mixture source, whole-file units. The state grows by a span per run of deleted rows
still to be delivered (only where rows were deleted).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import get_worker_info

from lakeckpt_tables.errors import UnknownColumnError
from lakeckpt_tables.plan import EpochPlan, Piece, replan_rounds
from lakeckpt_tables.plan.exclude import base_rows, without
from lakeckpt_tables.reader.distributed import broadcast_from_rank0
from lakeckpt_tables.reader.loop import start_cursor
from lakeckpt_tables.reader.planner import Cursor, RoundPlanner, require_whole
from lakeckpt_tables.reader.state import ReaderState
from lakeckpt_tables.sources.base import Snapshot
from lakeckpt_tables.sources.changes import Deletion, DeletionWatch

__all__ = ["Replans", "check_honorable", "continue_from", "exclude", "following_replans",
           "observe_deletions", "reading"]

def exclude(planner: RoundPlanner, state: ReaderState, seen: int,
            deletions: Sequence[Deletion], listed: int | None = None) -> tuple[
                ReaderState, list[dict[str, Any]]]:
    """``state`` (merged, every slice) with ``deletions`` taken out of what it has not
    delivered, in this and every later epoch of the pass; and an ``excluded`` event detail
    per deleting commit. ``seen``: the last commit the deletions were observed up to;
    ``listed``: the exclusion list's version they include (None: no list).

    Raises:
        StateMismatchError: ``state`` does not cover every rank and worker.
    """
    if state.plan is None:
        return state, []
    marks = {"deletes_seen": seen, "exclusions_seen": listed}
    if not deletions:
        return (state if (state.deletes_seen, state.exclusions_seen) == (seen, listed)
                else _with(state, **marks)), []
    require_whole(state, state.plan)
    policy = planner.policy(state.plan)
    first_round = planner.rounds.get(0, {}, wait=False)
    assert first_round is not None and planner.epochs is not None  # a pinned pass
    units = planner.rounds.units(first_round)
    where = {(u.path, u.row_group): i for i, u in enumerate(units.units)}
    by_version: dict[tuple[int, str, str], dict[int, list[np.ndarray[Any, Any]]]] = {}
    for d in deletions:
        i = where.get((d.path, d.row_group))
        if i is not None:
            by_version.setdefault((d.version, d.operation, d.how), defaultdict(list))[i].append(
                d.rows)

    def plan_for(index: int, layout: Sequence[Piece] | None) -> EpochPlan:
        rnd = planner.rounds.get(index, {}, wait=False)
        assert rnd is not None
        return planner.plan(policy, rnd, layout)

    first, layouts = replan_rounds(plan_for, dict(state.layouts), state.positions())
    events = []
    for (version, operation, how), groups in by_version.items():
        rows = {i: np.unique(np.concatenate(parts)) for i, parts in groups.items()}
        detail: dict[str, Any] = {
            "version": version, "operation": operation, "how": how,
            "rows": int(sum(len(r) for r in rows.values())),
            "deleted": _ranges(units, rows), "excluded": {}, "excluded_rows": 0}
        for epoch in range(first, planner.epochs):
            base_plan = plan_for(epoch, None)
            at = base_rows(base_plan, units, rows)
            layout = layouts.get(epoch, (Piece.plain([(0, base_plan.rows)]),))
            kept, gone = without(layout, np.concatenate([*at.values(), np.empty(0, np.int64)]))
            if len(gone):
                layouts[epoch] = kept
                taken = {i: rows[i][np.isin(base, gone)] for i, base in at.items()}
                detail["excluded"][str(epoch)] = _ranges(units, taken)
                detail["excluded_rows"] += len(gone)
        events.append(detail)
    if not any(e["excluded_rows"] for e in events):  # every deleted row delivered already
        return _with(state, **marks), events
    slices = ((first, 0),) * len(state.slices)
    return _with(state, layouts=layouts, slices=slices, **marks), events


def _with(state: ReaderState, **changes: Any) -> ReaderState:
    return dataclasses.replace(state, **changes)


def _runs(rows: np.ndarray[Any, Any]) -> list[tuple[int, int]]:
    """Sorted unique rows as spans."""
    if not len(rows):
        return []
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    return [(int(run[0]), int(run[-1]) + 1) for run in np.split(rows, breaks)]


def _ranges(units: Any, rows: Mapping[int, np.ndarray[Any, Any]]) -> list[list[Any]]:
    """Live rows per row group as [file, row group, first, end] ranges."""
    out: list[list[Any]] = []
    for i, live in sorted(rows.items()):
        unit = units.units[i]
        out.extend([unit.path, unit.row_group, a, b] for a, b in _runs(live))
    return out


def check_honorable(snapshot: Snapshot, deletes: str, key: str | None) -> None:
    """Refuse a pinned snapshot ``deletes="honor"`` cannot name deleted rows of.

    Raises:
        ValueError: whole-file units (rows are named by row group).
        UnknownColumnError: ``key`` is not a column of the table.
    """
    if deletes != "honor":
        return
    if snapshot.whole_files:
        raise ValueError(f"{snapshot.describe()}: deletes='honor' names deleted rows by row "
                         "group; pin the source with units='row_groups' (its default)")
    if key is not None and key not in snapshot.schema.names:
        raise UnknownColumnError(f"{snapshot.describe()}: deletes_key {key!r} is not a column "
                                 f"of the table ({snapshot.schema.names})")


@dataclass
class Replans:
    """What a ``deletes="honor"`` reader keeps in its process (``LakeDataset._replans``)."""

    watch: DeletionWatch | None = None  # rank 0: the commits observed
    pending: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # events to record
    live: object | None = None  # the pass being iterated (a token)
    swap: Cursor | None = None  # where that pass goes on at its next batch


def _replans(dataset: Any) -> Replans:
    replans = getattr(dataset, "_replans", None)
    if replans is None:
        replans = dataset._replans = Replans()
    return replans  # type: ignore[no-any-return]


def observe_deletions(dataset: Any, state: ReaderState) -> tuple[ReaderState,
                                                                  list[dict[str, Any]]]:
    """Rank 0, main process: ``state`` (every slice's) less the rows ``dataset``'s table
    deleted since the state last looked, and the ``excluded`` event details.

    Raises:
        DeletionUntraceableError: a pinned file was rewritten and no key names its rows.
    """
    watch = _watch(dataset)
    seen = dataset.snapshot.version if state.deletes_seen is None else state.deletes_seen
    seen, deletions = watch.since(seen)
    listed = None
    if watch.exclusions is not None:
        listed, more = watch.listed(state.exclusions_seen)
        deletions = [*deletions, *more]
    state, details = exclude(dataset.planner, state, seen, deletions, listed)
    replans = _replans(dataset)
    details, replans.pending = [*replans.pending, *details], []
    return state, details


def _watch(dataset: Any) -> DeletionWatch:
    replans = _replans(dataset)
    if replans.watch is None:
        replans.watch = DeletionWatch(dataset.source, dataset.snapshot,
                                      dataset.options.deletes_key, dataset.options.exclusions)
    return replans.watch


def _excluded_at_start(dataset: Any, cursor: Cursor) -> Cursor:
    """NOTE [ exclusion lists ]: a pass that starts afresh starts without the rows the list
    names, at the version rank 0 read (every rank reads that version's keys)."""
    if (dataset.options.exclusions is None or cursor.exclusions_seen is not None
            or cursor.position or cursor.epoch or cursor.layouts):
        return cursor
    watch = _watch(dataset)
    version = broadcast_from_rank0(dataset.options.exclusions.source.snapshot(None).version
                                   if dataset.rank == 0 else None)
    listed, deletions = watch.listed(None, version)
    shape = cursor.shape
    start = dataclasses.replace(dataset._config.empty_state(shape),
                                slices=((0, 0),) * (shape[0] * shape[1]))
    state, details = exclude(dataset.planner, start, dataset.snapshot.version, deletions,
                             listed)
    if dataset.rank == 0:  # recorded with the first checkpoint
        _replans(dataset).pending.extend(details)
    continue_from(dataset, state)
    return dataset._cursor  # type: ignore[no-any-return]


def continue_from(dataset: Any, state: ReaderState) -> None:
    """``dataset`` goes on from ``state`` (its shape, every slice): at the next batch of the
    pass being iterated, else when its next pass begins. A state that only moved the commits
    observed (nothing taken out) is noted in place: the pass reads on, its read-ahead kept."""
    cursor = dataset._cursor
    if cursor is not None and state.slices[cursor.slice_index] == (cursor.epoch,
                                                                   cursor.position) \
            and dict(state.layouts) == cursor.layouts:
        cursor.deletes_seen, cursor.exclusions_seen = state.deletes_seen, state.exclusions_seen
        if dataset._resume is not None:
            dataset._resume = state
        return
    shape = (dataset.world_size, 1, dataset.batch_size)  # read in the main process only
    cursor = start_cursor(dataset.planner, state, shape, 0, own=False)
    dataset._cursor, dataset._resume = cursor, state
    replans = _replans(dataset)
    if replans.live is not None:
        replans.swap = cursor


def reading(dataset: Any, cursor: Cursor, read: Callable[..., Iterator[Any]],
            depth: int) -> Iterator[Any]:
    """What ``read`` (``SliceReader.cuts`` or ``tables``) gives of ``dataset``'s pass from
    ``cursor``: as it is, or, with ``deletes="honor"``, through :func:`following_replans`."""
    if dataset.options.deletes == "honor":
        return following_replans(dataset, cursor, read, depth)
    return read(cursor, dataset.planner, dataset.rounds, read_ahead=depth,
                unit_rows=dataset.unit_rows)


def following_replans(dataset: Any, cursor: Cursor, read: Callable[..., Iterator[Any]],
                      depth: int) -> Iterator[Any]:
    """``dataset``'s pass from ``cursor``, going on from a new cursor whenever a checkpoint
    re-planned it (:func:`continue_from`) between two batches.

    Raises:
        ValueError: in a DataLoader worker process.
    """
    if get_worker_info() is not None:
        raise ValueError(
            f"{dataset.snapshot.describe()}: deletes='honor' re-plans the pass at checkpoints, "
            "which a DataLoader worker process cannot follow; iterate with num_workers=0 "
            "(read_ahead threads still decode ahead)")
    cursor = _excluded_at_start(dataset, cursor)
    replans = _replans(dataset)
    live = replans.live = object()
    replans.swap = None
    try:
        while True:
            inner = read(cursor, dataset.planner, dataset.rounds, read_ahead=depth,
                         unit_rows=dataset.unit_rows)
            try:
                for item in inner:
                    yield item
                    if replans.swap is not None:
                        break
                else:
                    return
            finally:
                close = getattr(inner, "close", None)
                if close is not None:
                    close()  # its read-ahead stops
            cursor, replans.swap, dataset._resume = replans.swap, None, None
    finally:
        if replans.live is live:
            replans.live = None
