"""The proof from the ledger: what the run's committed checkpoints say was consumed.

The checkpoint manager commits, with every checkpoint, consumption records: which rows of which
row group each worker consumed since the previous checkpoint. Summed over the run's committed
checkpoints they must give every row group of the table exactly once per epoch: ranges that are
exact (``rows == row_end - row_start``) never overlap, and per (epoch, file, row group) the rows
add up to the row group's row count. Where a checkpoint fell inside a shuffled window a record
gives the row group range and the count consumed from it; the next checkpoint records the rest.

This is computed from the ledger and the table's footers alone, then cross-checked with the
trainer's own step logs: per checkpoint, the rows the ledger says were consumed, per row group,
are exactly the rows whose ids the trainer logged for the steps the checkpoint covers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lakeckpt_tables.ledger import CheckpointRecord, Ledger, open_ledger
from lakeckpt_tables.tools.demo.runner import Attempt
from lakeckpt_tables.tools.demo.steplog import StepRecord
from lakeckpt_tables.types import Unit

__all__ = [
    "AbortedSave",
    "Coverage",
    "IdLocator",
    "LedgerCheckpoint",
    "LedgerProof",
    "check_coverage",
    "covered_twice",
    "matches_ids",
    "prove_ledger",
    "save_leftovers",
]

_METADATA = ".metadata"  # torch.distributed.checkpoint writes it last: a complete model state


@dataclass(frozen=True)
class Coverage:
    """Per (epoch, file, row group): did the consumption records give its rows exactly once?"""

    records: int
    exact_records: int  # rows == row_end - row_start
    rows: int  # rows the records account for
    rows_expected: int  # table rows x epochs
    row_groups: int  # (epoch, row group) pairs of the table: row groups x epochs
    row_groups_exact: int  # of those, consumed exactly their row count, without overlap
    gap_rows: int  # rows of a row group the records leave out
    overlap_rows: int  # rows counted beyond a row group's count, or covered twice by exact ranges
    invalid_records: int  # of an unknown file/row group/epoch, outside the row group, or rows>range

    @property
    def exactly_once(self) -> bool:
        return (self.gap_rows == self.overlap_rows == self.invalid_records == 0
                and self.row_groups_exact == self.row_groups and self.rows == self.rows_expected)


@dataclass(frozen=True)
class LedgerCheckpoint:
    """One committed checkpoint of the run, as the ledger lists it."""

    step: int
    checkpoint_id: str
    committed_at: datetime
    parent_step: int | None  # the checkpoint it continues from; None for the run's first
    tags: tuple[str, ...]
    model_location: str
    attempt: int | None  # the attempt running when the ledger committed it
    records: int  # its consumption records
    rows: int  # rows they account for
    agrees_with_ids: bool  # per row group, exactly the rows the trainer logged for its steps


@dataclass(frozen=True)
class AbortedSave:
    """A save killed by its crash point, and what it left behind."""

    attempt: int
    step: int
    crash_at: str
    leftovers: tuple[str, ...]  # directories it wrote (relative to the root), found after it died
    files: int  # files in them, still on disk at the end
    metadata: bool  # DCP's .metadata was among them: the model state was completely written
    named_in_ledger: bool  # some ledger row names a leftover directory (must not)
    committed_in_attempt: tuple[int, ...]  # steps >= step the ledger committed while it ran
    recommitted_by: int | None  # the attempt that later committed this step

    @property
    def ok(self) -> bool:
        return not self.named_in_ledger and not self.committed_in_attempt


@dataclass(frozen=True)
class LedgerProof:
    """Everything the ledger says about the run, checked."""

    ledger: str
    run_id: str
    checkpoints: tuple[LedgerCheckpoint, ...]
    coverage: Coverage
    orphan_records: int  # consumption rows of no committed checkpoint
    parent_chain: bool  # each checkpoint continues from the one committed before it
    aborted: AbortedSave | None

    @property
    def ids_agree(self) -> bool:
        return all(c.agrees_with_ids for c in self.checkpoints)

    @property
    def ok(self) -> bool:
        return (bool(self.checkpoints) and self.coverage.exactly_once and self.orphan_records == 0
                and self.parent_chain and self.ids_agree
                and (self.aborted is None or self.aborted.ok))

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for c in out["checkpoints"]:
            c["committed_at"] = c["committed_at"].isoformat()
        out["coverage"]["exactly_once"] = self.coverage.exactly_once
        if self.aborted is not None:
            out["aborted"]["ok"] = self.aborted.ok
        out.update(ids_agree=self.ids_agree, ok=self.ok)
        return out


# ---------------------------------------------------------------------- the table's rows


class IdLocator:
    """Where each row id of the demo table lives: its unit (index in ``units``) and its row."""

    def __init__(self, units: Sequence[Unit]) -> None:
        self.units = tuple(units)
        self.index = {(u.path, u.row_group): i for i, u in enumerate(self.units)}
        self.stride = max(u.rows for u in self.units) + 1
        total = sum(u.rows for u in self.units)
        self.unit_of = np.full(total, -1, dtype=np.int64)
        self.row_of = np.full(total, -1, dtype=np.int64)
        files: dict[str, pq.ParquetFile] = {}
        for i, u in enumerate(self.units):
            if u.path not in files:
                files[u.path] = pq.ParquetFile(u.path)
            ids = files[u.path].read_row_group(u.row_group, columns=["id"]).column("id")
            ids_np = ids.to_numpy()
            self.unit_of[ids_np] = i
            self.row_of[ids_np] = np.arange(len(ids_np), dtype=np.int64)
        if (self.unit_of < 0).any():
            raise ValueError("the table's ids are not exactly 0..rows-1")


# ------------------------------------------------------------------------------- checks


def check_coverage(consumption: pa.Table, units: Sequence[Unit], epochs: int) -> Coverage:
    """Check consumption records (``Ledger.consumption`` columns) against the table's units."""
    known = {(u.path, u.row_group): u.rows for u in units}
    sums: dict[tuple[int, str, int], int] = defaultdict(int)
    exact: dict[tuple[int, str, int], list[tuple[int, int]]] = defaultdict(list)
    invalid = n_exact = rows = 0
    for r in consumption.select(["epoch", "file", "row_group", "row_start", "row_end", "rows"]
                                ).to_pylist():
        size = known.get((r["file"], r["row_group"]))
        span = r["row_end"] - r["row_start"]
        rows += r["rows"]
        if (size is None or not 0 <= r["epoch"] < epochs or r["row_start"] < 0
                or r["row_end"] > size or not 0 < r["rows"] <= span):
            invalid += 1
            continue
        key = (r["epoch"], r["file"], r["row_group"])
        sums[key] += r["rows"]
        if r["rows"] == span:
            n_exact += 1
            exact[key].append((r["row_start"], r["row_end"]))
    gap = overlap = good = 0
    for epoch in range(epochs):
        for (path, group), size in known.items():
            key = (epoch, path, group)
            twice = covered_twice(exact.get(key, []))
            got = sums.get(key, 0)
            gap += max(size - got, 0)
            overlap += max(got - size, 0) + twice
            good += got == size and twice == 0
    return Coverage(consumption.num_rows, n_exact, rows, sum(known.values()) * epochs,
                    len(known) * epochs, good, gap, overlap, invalid)


def covered_twice(ranges: Iterable[tuple[int, int]]) -> int:
    """Rows that more than one of the half-open ``ranges`` cover (counted once per extra)."""
    twice, reach = 0, None
    for start, end in sorted(ranges):
        if reach is not None and start < reach:
            twice += min(end, reach) - start
        reach = end if reach is None else max(reach, end)
    return twice


def matches_ids(records: Sequence[Mapping[str, Any]], ids: np.ndarray[Any, Any],
            locator: IdLocator) -> bool:
    """Do ``records`` (one checkpoint's) name exactly the rows with ``ids``, per row group?"""
    if ids.size and (ids.min() < 0 or ids.max() >= locator.unit_of.size):
        return False
    units, rows = locator.unit_of[ids], locator.row_of[ids]
    seen = np.bincount(units, minlength=len(locator.units))
    claimed = np.zeros(len(locator.units), dtype=np.int64)
    keys = np.unique(units * locator.stride + rows)
    for r in records:
        u = locator.index.get((r["file"], r["row_group"]))
        if u is None:
            return False
        claimed[u] += r["rows"]
        if r["rows"] == r["row_end"] - r["row_start"]:  # an exact range: all of it was trained
            lo, hi = np.searchsorted(keys, [u * locator.stride + r["row_start"],
                                            u * locator.stride + r["row_end"]])
            if hi - lo != r["rows"]:
                return False
    return bool(np.array_equal(seen, claimed))


def save_leftovers(root: Path, run_id: str, step: int) -> tuple[str, ...]:
    """Directories under ``root/run_id`` of saves of ``step`` (locations relative to ``root``)."""
    run_dir = root / run_id
    if not run_dir.is_dir():
        return ()
    return tuple(sorted(f"{run_id}/{d.name}" for d in run_dir.iterdir()
                        if d.is_dir() and d.name.startswith(f"step-{step:09d}-")))


# -------------------------------------------------------------------------------- proof


def prove_ledger(root: Path, run_id: str, locator: IdLocator, epochs: int,
                 delivered: Sequence[StepRecord], attempts: Sequence[Attempt],
                 leftovers: Sequence[str] = (), *, ledger: Ledger | None = None) -> LedgerProof:
    """Check the run's ledger, and cross-check it with the steps the trainer delivered.

    Args:
        root: the checkpoint root (the default ledger lives at ``<root>/_ledger``).
        run_id: the run.
        locator: the table's ids and where they live.
        epochs: epochs the run read.
        delivered: the steps whose training is in the final model (see ``proof.delivered``).
        attempts: the run's attempts, in order; one of them may have died inside a save.
        leftovers: directories the aborted save left, listed right after it died.
        ledger: the ledger, when not the default one under ``root``.
    """
    ledger = ledger if ledger is not None else open_ledger(None, root=str(root))
    records = ledger.checkpoints(run_id)
    consumption = ledger.consumption(run_id=run_id)
    by_checkpoint: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in consumption.to_pylist():
        by_checkpoint[r["checkpoint_id"]].append(r)
    steps = np.array([r.step for r in delivered], dtype=np.int64)
    ids = [r.ids for r in delivered]
    step_of = {r.checkpoint_id: r.step for r in records}
    listed = []
    previous = 0
    for record in records:
        mine = by_checkpoint.get(record.checkpoint_id, [])
        lo, hi = np.searchsorted(steps, [previous, record.step], side="right")
        trained = np.concatenate(ids[lo:hi]) if hi > lo else np.empty(0, np.int64)
        listed.append(LedgerCheckpoint(
            record.step, record.checkpoint_id, _committed_at(record),
            None if record.parent_id is None else step_of.get(record.parent_id, -1),
            record.tags, record.model_location, _attempt_of(record, attempts), len(mine),
            sum(r["rows"] for r in mine), matches_ids(mine, trained, locator)))
        previous = record.step
    chain = all(r.parent_id == (records[i - 1].checkpoint_id if i else None)
                for i, r in enumerate(records))
    orphans = sum(len(v) for k, v in by_checkpoint.items() if k not in step_of)
    return LedgerProof(ledger.describe(), run_id, tuple(listed),
                       check_coverage(consumption, locator.units, epochs), orphans, chain,
                       _aborted(root, ledger, attempts, listed, leftovers))


def _committed_at(record: CheckpointRecord) -> datetime:
    assert record.committed_at is not None, "the ledger sets committed_at"
    return record.committed_at


def _attempt_of(record: CheckpointRecord, attempts: Sequence[Attempt]) -> int | None:
    at = record.committed_at
    for a in attempts:
        if at is not None and a.started is not None and a.ended is not None \
                and a.started <= at <= a.ended:
            return a.number
    return None


def _aborted(root: Path, ledger: Ledger, attempts: Sequence[Attempt],
             listed: Sequence[LedgerCheckpoint], leftovers: Sequence[str]) -> AbortedSave | None:
    dead = next((a for a in attempts if a.died_in_save), None)
    if dead is None or dead.saving is None or dead.crash_at is None:
        return None
    named = set(ledger.to_arrow().column("model_location").drop_null().to_pylist())
    files = [p for loc in leftovers for p in (root / loc).iterdir()] \
        if all((root / loc).is_dir() for loc in leftovers) else []
    return AbortedSave(
        attempt=dead.number, step=dead.saving, crash_at=dead.crash_at,
        leftovers=tuple(leftovers), files=len(files),
        metadata=any(p.name == _METADATA for p in files),
        named_in_ledger=any(loc in named for loc in leftovers),
        committed_in_attempt=tuple(c.step for c in listed
                                   if c.attempt == dead.number and c.step >= dead.saving),
        recommitted_by=next((c.attempt for c in listed if c.step == dead.saving), None))
