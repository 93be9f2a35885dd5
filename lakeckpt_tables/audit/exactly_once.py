"""``verify``: exactly-once, proved from a run's consumption records up to a checkpoint.

The records checked are those of the checkpoint's lineage (it, its parent, grandparent...,
and for a run branched with its reader going on from another run's, that run's lineage up to
the branch: :mod:`lakeckpt_tables.audit.lineage`): checkpoints a restore skipped or went back
past recorded training that was lost, and the rows they name are read again by the lineage.
Per pass (segment, epoch) and row group:

- **no overlap**: exact ranges never intersect each other or a partial range (a range of
  which a checkpoint inside a shuffled window consumed a seeded subset); the counts recorded
  against one range never exceed it; no row group gives more rows than it holds;
- **no gap**: in every pass the reader state shows finished, every row group of the pass
  gave exactly its live rows, less the rows the ledger's ``undelivered`` events name.

Which passes are finished, and the live rows of each row group, come from the plan of the
checkpoint's reader state over the source table's metadata (no data is read).

A Mixture run is checked source by source: its records name their source (``source_key``) and
its checkpoint's reader state holds each source's own state, whose finished passes are checked
for gaps. A packed source (``pack_tokens``) is checked the same way: its records count a row by
its eos, so a document cut between two checkpoints is counted once, and every row of each
finished epoch is expected but those whose eos lies in the epoch's lockstep tail (its
``undelivered`` events; NOTE [ packed accounting ] in ``checkpoint/consumption.py``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow.compute as pc

from lakeckpt_tables.audit.lineage import Branch, branches_of, lineage
from lakeckpt_tables.audit.replay import dataset_for, pinned_rounds
from lakeckpt_tables.audit.skipped import skip_events, skipped_records
from lakeckpt_tables.audit.sources import ledger_options
from lakeckpt_tables.audit.target import LedgerSnapshot, read_ledger
from lakeckpt_tables.errors import LedgerError
from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.ledger.records import (
    EXCLUDED_EVENT,
    CheckpointRecord,
    checkpoints_from_arrow,
)

__all__ = ["Verdict", "verify", "verify_snapshot"]


@dataclass
class Verdict:
    """The outcome of verifying one run up to one checkpoint.

    Attributes:
        run_id: the run.
        checkpoint_id: the checkpoint verified up to (None: the run has no checkpoint).
        step: its step.
        checkpoints: checkpoints in its lineage, whose records were checked.
        records: consumption records checked.
        rows: rows they consumed.
        tokens: tokens they consumed (packed readers), None when no record counts tokens.
        finished_passes: passes (segment, epoch) the reader state shows finished, each
            checked for gaps (of any source, for a Mixture).
        source_passes: a Mixture's: each source key's finished passes (empty for a source
            none of whose passes finished: one a Mixture ended before, ``"stop"``).
        excluded: rows the lineage took out of its passes because the table deleted them
            (``deletes="honor"``: ``excluded`` events), not expected of a finished pass.
        violations: what breaks exactly-once, the first one first; empty when proved.
        skipped: rows consumed without training (batches skipped after a restore: NOTE
            [ skipped batches ] in ``checkpoint/skip.py``), checked with the trained ones but
            not counted in ``rows``.
        retired: Mixture sources retired in the lineage (NOTE [ sources that change ] in
            ``checkpoint/recipe.py``): their unread rows are recorded, not missing.
    """

    run_id: str
    checkpoint_id: str | None
    step: int | None
    checkpoints: int = 0
    records: int = 0
    rows: int = 0
    tokens: int | None = None
    finished_passes: list[tuple[int, int]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    skipped: int = 0
    retired: list[str] = field(default_factory=list)
    source_passes: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    excluded: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "checkpoint_id": self.checkpoint_id, "step": self.step,
                "ok": self.ok, "checkpoints": self.checkpoints, "records": self.records,
                "rows": self.rows, "tokens": self.tokens, "skipped": self.skipped,
                "retired": self.retired,
                "finished_passes": [{"segment": seg, "epoch": ep}
                                    for seg, ep in self.finished_passes],
                "source_passes": {k: [{"segment": seg, "epoch": ep} for seg, ep in v]
                                  for k, v in self.source_passes.items()},
                "excluded": self.excluded, "violations": self.violations}


def verify(target: Any, *, run: str | None = None, checkpoint: str | None = None,
           catalog: Any = None, storage_options: Mapping[str, str] | None = None,
           source: Any = None, source_catalog: Any = None,
           tokenizer: Any = None) -> list[Verdict]:
    """Verify exactly-once for each run (or ``run``) up to its newest committed checkpoint.

    Args:
        target: a checkpoint root, a ledger spec or a ledger object.
        run: only this run.
        checkpoint: verify up to this checkpoint (id or unique prefix) instead; implies its run.
        catalog: pyiceberg catalog of an Iceberg ledger.
        storage_options: storage options of the ledger and Delta sources (as
            ``CheckpointManager`` takes them).
        source: the source table; by default opened from what the ledger names.
        source_catalog: the catalog of an Iceberg source, when it is neither the one the
            ledger records for it nor the ledger's (see
            :func:`~lakeckpt_tables.audit.sources.open_source`).
        tokenizer: the ``tokenizers.Tokenizer`` of a run packing a text column (its passes
            are sized by its token counts: NOTE [ text tokenized on the fly ]).

    Returns:
        One verdict per run verified.

    Raises:
        LedgerError: no ledger there, or no such run or checkpoint.
        SourceNotFoundError: the source table cannot be opened to size its passes.
    """
    snapshot = read_ledger(target, catalog=catalog,
                           storage_options=ledger_options(target, storage_options))
    return verify_snapshot(snapshot, run=run, checkpoint=checkpoint, source=source,
                           storage_options=storage_options, source_catalog=source_catalog,
                           tokenizer=tokenizer)


def verify_snapshot(snapshot: LedgerSnapshot, *, run: str | None = None,
                    checkpoint: str | None = None, source: Any = None,
                    storage_options: Mapping[str, str] | None = None,
                    source_catalog: Any = None, tokenizer: Any = None) -> list[Verdict]:
    """:func:`verify` over a ledger version already read."""
    is_checkpoint = pc.field(s.RECORD) == s.RECORD_CHECKPOINT
    retired = _retired(snapshot)
    if checkpoint is not None:
        ids = snapshot.scan(is_checkpoint, [s.RUN_ID, s.CHECKPOINT_ID])
        chosen = [r for r in ids.to_pylist() if r[s.CHECKPOINT_ID] == checkpoint] or \
            [r for r in ids.to_pylist() if r[s.CHECKPOINT_ID].startswith(checkpoint)]
        if len(chosen) != 1:
            raise LedgerError(f"ledger {snapshot.where} has no single checkpoint with id "
                              f"{checkpoint!r}")
        runs = [chosen[0][s.RUN_ID]]
    elif run is None:
        runs = sorted(set(snapshot.scan(is_checkpoint, [s.RUN_ID])[s.RUN_ID].to_pylist()))
    else:
        runs = [run]
    verdicts = []
    branches = branches_of(snapshot)
    for run_id in runs:
        # one run's checkpoint records only (and those of the runs its reader went on from:
        # NOTE [ branched runs ]): a ledger of many runs is not read whole
        lines = _reader_runs(run_id, branches)
        records = checkpoints_from_arrow(snapshot.scan(is_checkpoint
                                                       & pc.field(s.RUN_ID).isin(lines)))
        if checkpoint is not None:
            head = next(r for r in records if r.checkpoint_id == chosen[0][s.CHECKPOINT_ID])
        else:
            mine = [r for r in records if r.checkpoint_id not in retired and r.run_id == run_id]
            if not mine:
                raise LedgerError(f"ledger {snapshot.where} has no committed checkpoint of run "
                                  f"{run_id!r}")
            head = mine[-1]
        verdicts.append(_verify_run(snapshot, records, head, source, storage_options,
                                    source_catalog, branches, tokenizer))
    return verdicts


def _reader_runs(run_id: str, branches: dict[str, Branch]) -> list[str]:
    """The run and the runs its reader went on from, through branches that continued it."""
    out = [run_id]
    while (branch := branches.get(out[-1])) is not None and branch.continued \
            and branch.parent_run not in out:
        out.append(branch.parent_run)
    return out


def _retired(snapshot: LedgerSnapshot) -> set[str]:
    rows = snapshot.scan((pc.field(s.RECORD) == s.RECORD_EVENT)
                         & (pc.field(s.EVENT) == "retired"), [s.DETAIL])
    return {json.loads(d).get("checkpoint_id") for d in rows[s.DETAIL].to_pylist()}


Key = tuple[str | None, int, int, str, int]  # source key, segment, epoch, file, row group
Pass = tuple[str | None, int, int]  # source key, segment, epoch


@dataclass
class _Consumed:
    """A lineage's records: ranges per row group, tokens per pass."""

    ranges: dict[Key, list[tuple[int, int, int, int]]]
    tokens: dict[Pass, int]


def _verify_run(snapshot: LedgerSnapshot, records: list[CheckpointRecord],
                head: CheckpointRecord, source: Any,
                storage_options: Mapping[str, str] | None, source_catalog: Any,
                branches: dict[str, Branch], tokenizer: Any = None) -> Verdict:
    chain = lineage(records, head, branches, reader_only=True)
    runs = sorted({r.run_id for r in chain})
    steps = {r.checkpoint_id: r.step for r in chain}
    verdict = Verdict(head.run_id, head.checkpoint_id, head.step, checkpoints=len(chain))
    names = [s.CHECKPOINT_ID, s.SOURCE_KEY, s.SEGMENT, s.EPOCH, s.FILE, s.ROW_GROUP,
             s.ROW_START, s.ROW_END, s.ROWS, s.TOKENS]
    consumed = snapshot.scan((pc.field(s.RECORD) == s.RECORD_CONSUMPTION)
                             & pc.field(s.RUN_ID).isin(runs), names)
    by_group: dict[Key, list[tuple[int, int, int, int]]] = defaultdict(list)
    tokens: dict[Pass, int] = defaultdict(int)
    columns = [consumed[n].to_pylist() for n in names]
    for checkpoint_id, key, segment, epoch, file, group, start, end, rows, n in zip(
            *columns, strict=True):
        step = steps.get(checkpoint_id)
        if step is None:
            continue  # not in the lineage: training lost with a restore
        by_group[(key, segment, epoch, file, group)].append((start, end, rows, step))
        verdict.records += 1
        verdict.rows += rows
        if n is not None:
            tokens[(key, segment, epoch)] += n
            verdict.tokens = (verdict.tokens or 0) + n
    skips = {k: v for run in runs for k, v in skip_events(snapshot, run).items()}
    for checkpoint_id, details in skips.items():
        step = steps.get(checkpoint_id)
        if step is None:
            continue  # committed by a checkpoint a restore left behind
        for r in skipped_records(details):  # consumed, not trained: checked all the same
            at = (r[s.SOURCE_KEY], r[s.SEGMENT], r[s.EPOCH])
            by_group[(*at, r[s.FILE], r[s.ROW_GROUP])].append(
                (r[s.ROW_START], r[s.ROW_END], r[s.ROWS], step))
            verdict.skipped += r[s.ROWS]
            if r[s.TOKENS] is not None:
                tokens[at] += r[s.TOKENS]
    retired = snapshot.scan((pc.field(s.RECORD) == s.RECORD_EVENT)
                            & (pc.field(s.EVENT) == "source_retired")
                            & pc.field(s.RUN_ID).isin(runs), [s.CHECKPOINT_ID, s.DETAIL])
    verdict.retired = sorted({json.loads(d)["source_key"] for c, d in zip(
        retired[s.CHECKPOINT_ID].to_pylist(), retired[s.DETAIL].to_pylist(), strict=True)
        if c in steps})
    for key in sorted(by_group, key=lambda k: (k[0] or "", *k[1:])):
        verdict.violations.extend(_overlaps(head.run_id, key, by_group[key]))
    verdict.violations.extend(_gaps(snapshot, head, chain, _Consumed(by_group, tokens), verdict,
                                    source, storage_options, source_catalog, tokenizer))
    return verdict


def _where(run_id: str, key: Key) -> str:
    source, segment, epoch, file, group = key
    named = "" if source is None else f" source {source!r}"
    return f"run {run_id}{named} segment {segment} epoch {epoch}: {file} row group {group}"


def _overlaps(run_id: str, key: Key, ranges: list[tuple[int, int, int, int]]) -> list[str]:
    out = []
    # a packed record of no row (tokens of a document whose eos a later record holds) is
    # no range: it cannot overlap
    exact = sorted((a, b, step) for a, b, n, step in ranges if n == b - a and a < b)
    reach, by = -1, -1  # the furthest end of the ranges so far, and its step
    for a, b, step in exact:
        if a < reach:
            out.append(f"overlap: {_where(run_id, key)} rows [{a}, {min(reach, b)}) consumed "
                       f"at step {by} and again at step {step}")
        if b > reach:
            reach, by = b, step
    partial: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for a, b, n, step in ranges:
        if n != b - a:
            partial[(a, b)].append((n, step))
    for (a, b), counts in sorted(partial.items()):
        total = sum(n for n, _ in counts)
        if total > b - a:
            out.append(f"overlap: {_where(run_id, key)} range [{a}, {b}) gave {total} rows "
                       f"(steps {sorted(st for _, st in counts)}), it holds {b - a}")
        for ea, eb, step in exact:
            if ea < b and a < eb:
                out.append(f"overlap: {_where(run_id, key)} rows [{ea}, {eb}) consumed at step "
                           f"{step} lie in range [{a}, {b}) consumed in part at steps "
                           f"{sorted(st for _, st in counts)}")
    return out


def _gaps(snapshot: LedgerSnapshot, head: CheckpointRecord, chain: list[CheckpointRecord],
          consumed: _Consumed, verdict: Verdict, source: Any,
          storage_options: Mapping[str, str] | None, source_catalog: Any,
          tokenizer: Any = None) -> list[str]:
    """Row groups of finished passes that did not give exactly their live rows (and packed
    passes that did not give exactly their tokens)."""
    if not head.reader_state:
        return []
    from lakeckpt_tables.mixture.state import reader_states
    from lakeckpt_tables.reader.state import ReaderState, decode_state

    decoded = decode_state(head.reader_state)
    undelivered = _undelivered(snapshot, sorted({r.run_id for r in chain}),
                               {r.checkpoint_id for r in chain})
    verdict.excluded = undelivered.excluded
    out: list[str] = []
    for key, one in reader_states(decoded).items():
        if key is not None:
            verdict.source_passes.setdefault(key, [])
        given = source if key is None else None  # the one source given is a one-table run's
        state = ReaderState.from_dict(one)
        if state.plan is None:
            continue  # nothing read yet
        if state.config.get("refresh") is not None:
            checkpoints = {r.checkpoint_id for r in chain}
            state = replace(state, rounds={**pinned_rounds(snapshot, checkpoints, key),
                                           **state.rounds})
        dataset = dataset_for(state, snapshot, source=given, storage_options=storage_options,
                              source_catalog=source_catalog, tokenizer=tokenizer)
        out.extend(_source_gaps(head.run_id, consumed, undelivered, verdict, key, state,
                                dataset))
    return out


def _source_gaps(run_id: str, consumed: _Consumed, undelivered: _Undelivered,
                 verdict: Verdict, source_key: str | None, state: Any,
                 dataset: Any) -> list[str]:
    """:func:`_gaps` of one reader's state (a Mixture's source ``source_key``)."""
    out: list[str] = []
    by_group = consumed.ranges
    last = max(pos[0] for pos in state.positions())
    for segment, epoch, units, stream in _finished_passes(dataset, state, last):
        if (segment, epoch) not in verdict.finished_passes:
            verdict.finished_passes.append((segment, epoch))
        if source_key is not None and (segment, epoch) not in verdict.source_passes[source_key]:
            verdict.source_passes[source_key].append((segment, epoch))
        for unit in units:
            key = (source_key, segment, epoch, unit.path, unit.row_group)
            got = sum(n for _, _, n, _ in by_group.get(key, ()))
            want = unit.rows - undelivered.rows.get(key, 0)
            if got > want:
                out.append(f"overlap: {_where(run_id, key)} gave {got} rows, it holds "
                           f"{want}")
            elif got < want:
                out.append(f"gap: {_where(run_id, key)} gave {got} of its {want} rows "
                           "in a finished pass")
        paths = {(u.path, u.row_group) for u in units}
        for key in by_group:
            if key[:3] == (source_key, segment, epoch) and key[3:] not in paths:
                out.append(f"overlap: {_where(run_id, key)} is not a row group of the "
                           "pass, yet rows were recorded from it")
        if stream is not None:
            at = (source_key, segment, epoch)
            got = consumed.tokens.get(at, 0)
            want = stream - undelivered.tokens.get(at, 0)
            if got != want:
                named = "" if source_key is None else f" source {source_key!r}"
                out.append(f"{'overlap' if got > want else 'gap'}: run {run_id}{named} "
                           f"segment {segment} epoch {epoch} gave {got} tokens of the "
                           f"{want} its finished pass delivers")
    return out


def _finished_passes(dataset: Any, state: Any,
                     last: int) -> Iterator[tuple[int, int, Any, int | None]]:
    """(segment, epoch, units, stream elements or None) of each pass up to round ``last``
    that ``state`` shows every slice finished: a packed reader's passes are the pinned
    snapshot's epochs, each of all its units and its stream elements (tokens and eos; NOTE
    [ packed accounting ] in ``checkpoint/consumption.py``)."""
    planner = dataset.planner
    packed = state.config.get("pack") is not None
    known = dict(state.rounds)
    for index in range(last + 1):
        stream = None
        if packed:
            if planner.epochs is not None and index >= planner.epochs:
                break  # (a cycling Mixture source's epochs are endless: None)
            token_plan = planner.token_plan(state.plan, index, state.layouts.get(index))
            ends = [token_plan.per_slice] * len(state.positions())
            segment, epoch, units = 0, index, planner.snapshot.units
            stream = int(token_plan.starts[-1])
        else:
            plan, round_units = dataset.round_plan(index, state.plan, dict(state.layouts), known)
            ends = [plan.delivered_rows(g) for g in range(len(state.positions()))]
            segment, epoch, units = plan.segment, plan.epoch, round_units.units
        if all(e > index or (e == index and pos >= end)
               for (e, pos), end in zip(state.positions(), ends, strict=True)):
            yield segment, epoch, units, stream


@dataclass
class _Undelivered:
    """What a lineage's ``undelivered`` and ``excluded`` events name: rows per row group,
    tokens per pass; ``excluded`` counts the rows of the latter."""

    rows: dict[Key, int]
    tokens: dict[Pass, int]
    excluded: int = 0


def _undelivered(snapshot: LedgerSnapshot, runs: list[str],
                 checkpoints: Iterable[str]) -> _Undelivered:
    wanted = set(checkpoints)
    events = snapshot.scan((pc.field(s.RECORD) == s.RECORD_EVENT)
                           & pc.field(s.EVENT).isin(["undelivered", EXCLUDED_EVENT])
                           & pc.field(s.RUN_ID).isin(runs))
    out = _Undelivered(defaultdict(int), defaultdict(int))
    for rec in events.to_pylist():
        if rec[s.CHECKPOINT_ID] not in wanted:
            continue
        detail = json.loads(rec[s.DETAIL])
        if rec[s.EVENT] == EXCLUDED_EVENT:  # a pinned pass's rows the table deleted
            for epoch, ranges in detail["excluded"].items():
                for path, group, r0, r1 in ranges:
                    out.rows[(None, 0, int(epoch), path, int(group))] += r1 - r0
                    out.excluded += r1 - r0
            continue
        at = (detail.get("source_key"), int(detail["segment"]), int(detail["epoch"]))
        for path, group, r0, r1 in detail.get("ranges", ()):
            out.rows[(*at, path, int(group))] += r1 - r0
        out.tokens[at] += int(detail.get("tokens", 0))
    return out
