"""Helpers shared by the examples: synthetic tables, step logs, child processes, proofs.

Nothing here is needed to *use* lakeckpt-tables; it is what the examples need to show, and to
check, what the library did: tables with unique row ids, a log of the ids each training step
saw, training children that are really SIGKILLed, and exactly-once checks computed from those
ids and, independently, from the ledger's consumption records and the Parquet files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lakeckpt_tables.plan.check import check_exactly_once
from lakeckpt_tables.tools.demo.ledger_proof import covered_twice

__all__ = [
    "FEATURES",
    "Attempt",
    "Coverage",
    "Job",
    "LineReader",
    "StepLog",
    "check_ids",
    "delivered_ids",
    "ledger_coverage",
    "ledger_events",
    "ok",
    "prove_training",
    "read_steps",
    "redelivered_identically",
    "release_stdout",
    "run_trainer",
    "sql_catalog",
    "synthetic_rows",
    "write_delta",
]

FEATURES = 4
"""Features per row: the examples train ``torch.nn.Linear(FEATURES, 1)``."""

_TRUE_WEIGHTS = np.array([1.5, -2.0, 0.5, 1.0], dtype=np.float32)


# ------------------------------------------------------------------------------ tables


def synthetic_rows(lo: int, hi: int, *, seed: int = 0) -> pa.Table:
    """Rows with ids ``[lo, hi)``: ``x`` (4 floats, as a list column) and ``y = x @ w + noise``.

    Delta and Iceberg have no fixed-size list type: ``x`` is ``list<float>``, and the reader
    turns equal-length lists into a 2-D tensor. The values depend on (seed, lo) only, so a
    range written twice is the same data.
    """
    n = hi - lo
    rng = np.random.default_rng([seed, lo])
    x = rng.standard_normal((n, FEATURES), dtype=np.float32)
    y = (x @ _TRUE_WEIGHTS + np.float32(0.1) * rng.standard_normal(n, dtype=np.float32))
    offsets = pa.array(np.arange(0, (n + 1) * FEATURES, FEATURES, dtype=np.int32))
    return pa.table({"id": pa.array(np.arange(lo, hi, dtype=np.int64)),
                     "x": pa.ListArray.from_arrays(offsets, pa.array(x.ravel())),
                     "y": pa.array(y.astype(np.float32))})


def write_delta(uri: str | Path, ranges: Iterable[tuple[int, int]], *, group_rows: int,
                seed: int = 0) -> None:
    """Append one data file per id range to the Delta table at ``uri`` (created if missing)."""
    from deltalake import WriterProperties, write_deltalake

    props = WriterProperties(max_row_group_size=group_rows, write_batch_size=group_rows)
    for lo, hi in ranges:
        write_deltalake(str(uri), synthetic_rows(lo, hi, seed=seed), mode="append",
                        writer_properties=props)


def sql_catalog(uri: str | None, warehouse: Path, name: str = "examples") -> Any:
    """A pyiceberg SQL catalog: SQLite under ``warehouse`` when ``uri`` is None.

    ``uri`` is any SQLAlchemy URL, e.g. ``postgresql+psycopg://user:pw@host/db``.
    """
    from pyiceberg.catalog.sql import SqlCatalog

    warehouse.mkdir(parents=True, exist_ok=True)
    return SqlCatalog(name, uri=uri or f"sqlite:///{warehouse}/catalog.db",
                      warehouse=warehouse.resolve().as_uri())


# --------------------------------------------------------------------------- step logs


class StepLog:
    """One JSON line per trained step, ``{"step": n, "ids": [...]}``, one ``write`` each:
    a SIGKILL loses at most the line being written, which :func:`read_steps` ignores."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)

    def write(self, step: int, ids: Sequence[int]) -> None:
        os.write(self._fd, (json.dumps({"step": step, "ids": list(ids)}) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


def read_steps(path: Path) -> list[tuple[int, list[int]]]:
    """(step, ids) of every complete line of a step log."""
    out = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            break  # the line a SIGKILL cut short
        out.append((int(record["step"]), [int(i) for i in record["ids"]]))
    return out


# ---------------------------------------------------------------- training children


@dataclass
class Attempt:
    """One run of a training child as its parent saw it (from its progress lines)."""

    number: int
    step_log: Path
    resumed_from: int = 0
    last_step: int = 0
    returncode: int = 0
    killed: bool = False
    saving: int | None = None  # a save started and not reported committed
    committed: list[int] = field(default_factory=list)

    @property
    def sigkilled(self) -> bool:
        return self.returncode == -signal.SIGKILL


def release_stdout(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: the worker lets go of stdout, the parent's progress pipe.

    A worker outlives a SIGKILLed trainer for a while (it exits when it next looks for its
    parent) and would otherwise hold the pipe open, so the parent would not see the end of it.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def run_trainer(cmd: Sequence[str], attempt: Attempt, *,
                kill_if: Callable[[str], bool] | None = None,
                stderr: IO[bytes] | None = None) -> Attempt:
    """Run a training child that prints ``resume N``, ``step N ...``, ``save N``,
    ``checkpoint N`` and ``done N``, one per line.

    With ``kill_if``, SIGKILL the child (a real crash: nothing in it runs afterwards) at the
    first progress line for which ``kill_if(line)`` is true. The child may have gone on a
    little meanwhile; what it printed before dying is still read.
    """
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=stderr, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        event, _, value = line.strip().partition(" ")
        if event == "resume":
            attempt.resumed_from = attempt.last_step = int(value)
        elif event == "step":
            attempt.last_step = int(value.split()[0])
        elif event == "save":
            attempt.saving = int(value)
        elif event == "checkpoint":
            attempt.saving = None
            attempt.committed.append(int(value))
        if kill_if is not None and not attempt.killed and kill_if(line.strip()):
            os.kill(proc.pid, signal.SIGKILL)
            attempt.killed = True
    attempt.returncode = proc.wait()
    proc.stdout.close()
    return attempt


def delivered_ids(attempts: Sequence[Attempt]) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids whose training survived, and per crash the (first, last) lost step.

    An attempt's steps after the step its successor restored were lost with the crash; the
    successor trains them again. The ids delivered for training are every attempt's steps up
    to that point, then the last attempt's.
    """
    ids: list[int] = []
    lost: list[tuple[int, int]] = []
    for i, attempt in enumerate(attempts):
        upto = attempts[i + 1].resumed_from if i + 1 < len(attempts) else None
        steps = read_steps(attempt.step_log)
        for step, batch in steps:
            if upto is None or step <= upto:
                ids.extend(batch)
        if upto is not None and steps and steps[-1][0] > upto:
            lost.append((upto + 1, steps[-1][0]))
    return ids, lost


def redelivered_identically(dead: Attempt, successor: Attempt) -> bool:
    """Did ``successor`` train the steps ``dead`` lost with exactly the same ids, in order?"""
    lost = [s for s in read_steps(dead.step_log) if s[0] > successor.resumed_from]
    redone = read_steps(successor.step_log)[: len(lost)]
    return lost == redone


# ----------------------------------------------------------------------------- proofs


def check_ids(ids: Sequence[int], expected: np.ndarray[Any, Any],
              times: int = 1) -> tuple[int, int]:
    """(duplicated, missing) trainings of the rows ``expected``, each due ``times`` times."""
    verdict = check_exactly_once(np.asarray(ids, dtype=np.int64), expected, times=times)
    return verdict.surplus, verdict.shortfall


@dataclass(frozen=True)
class Coverage:
    """What the ledger's consumption records say was consumed, checked against the files.

    Per (segment, epoch, file, row group) named by a record, the rows consumed must add up to
    the row group's row count (read from the Parquet footer), and exact ranges must not
    overlap. Then the ids stored in those row groups must be, per epoch, exactly the expected
    ids: every expected row in exactly one consumed row group, nothing else.
    """

    records: int
    rows: int
    row_groups: int
    row_groups_exact: int
    gap_rows: int
    overlap_rows: int
    ids_per_epoch_ok: bool
    segments: dict[int, int]  # segment -> rows consumed

    @property
    def exactly_once(self) -> bool:
        return (self.row_groups_exact == self.row_groups and self.gap_rows == 0
                and self.overlap_rows == 0 and self.ids_per_epoch_ok)


def ledger_coverage(consumption: pa.Table, expected: np.ndarray[Any, Any],
                    epochs: int = 1) -> Coverage:
    """Check consumption records (``Ledger.consumption()`` columns) against the files they
    name and the ids that should have been consumed, ``epochs`` times each."""
    sums: dict[tuple[int, int, str, int], int] = defaultdict(int)
    exact: dict[tuple[int, int, str, int], list[tuple[int, int]]] = defaultdict(list)
    segments: dict[int, int] = defaultdict(int)
    for r in consumption.select(["segment", "epoch", "file", "row_group", "row_start",
                                 "row_end", "rows"]).to_pylist():
        key = (r["segment"], r["epoch"], r["file"], r["row_group"])
        sums[key] += r["rows"]
        segments[r["segment"]] += r["rows"]
        if r["rows"] == r["row_end"] - r["row_start"]:
            exact[key].append((r["row_start"], r["row_end"]))
    files: dict[str, pq.ParquetFile] = {}
    ids_by_epoch: dict[int, list[np.ndarray[Any, Any]]] = defaultdict(list)
    gap = overlap = good = 0
    for key, got in sums.items():
        _, epoch, path, group = key
        if path not in files:
            files[path] = pq.ParquetFile(path)
        size = files[path].metadata.row_group(group).num_rows
        twice = covered_twice(exact[key])
        gap += max(size - got, 0)
        overlap += max(got - size, 0) + twice
        good += got == size and twice == 0
        ids_by_epoch[epoch].append(
            files[path].read_row_group(group, columns=["id"]).column("id").to_numpy())
    want = np.sort(np.asarray(expected, dtype=np.int64))
    ids_ok = sorted(ids_by_epoch) == list(range(epochs)) and all(
        np.array_equal(np.sort(np.concatenate(parts)), want) for parts in ids_by_epoch.values())
    return Coverage(consumption.num_rows, sum(sums.values()), len(sums), good, gap, overlap,
                    ids_ok, dict(sorted(segments.items())))


def ledger_events(ledger_rows: pa.Table, run_id: str) -> list[tuple[int, str, dict[str, Any]]]:
    """(step, event, detail) of a run's ledger events, oldest first."""
    rows = [r for r in ledger_rows.select(["record", "run_id", "step", "event", "detail",
                                           "committed_at"]).to_pylist()
            if r["record"] == "event" and r["run_id"] == run_id]
    out = [(int(r["step"]), str(r["event"]), json.loads(r["detail"] or "{}")) for r in rows]
    # by checkpoint, then segment, a segment before the commits it skipped
    out.sort(key=lambda e: (e[0], e[2].get("segment", -1), e[1] != "segment",
                            e[2].get("version", -1)))
    return out


@dataclass
class Job:
    """What one training job of ``train_delta.py`` / ``train_iceberg.py`` did."""

    restored: int  # the step it restored (0: a fresh start)
    last_step: int
    ids: list[int]  # row ids it trained, in order
    losses: list[float]


def ok(flag: bool) -> str:
    return "OK" if flag else "FAILED"


def prove_training(first: Job, second: Job, expected: np.ndarray[Any, Any], epochs: int,
                   ledger: Any, run_id: str) -> bool:
    """Print and check the proof of a preempted-and-restarted run (two jobs).

    From the ids: every row trained exactly once per epoch, job 2 continuing right after
    job 1's last checkpoint, and the loss going down. From the ledger and the files: the
    consumption records give every row group exactly once per epoch.
    """
    ids = first.ids + second.ids
    duplicated, missing = check_ids(ids, expected, times=epochs)
    ids_ok = duplicated == 0 and missing == 0 and len(ids) == len(expected) * epochs
    resumed_right = second.restored == first.last_step
    losses = first.losses + second.losses
    k = max(1, min(10, len(losses) // 4))
    early, late = float(np.mean(losses[:k])), float(np.mean(losses[-k:]))
    learned = late < early / 2
    print(f"ids: {len(expected):,} rows x {epochs} epochs, {len(ids):,} trained, "
          f"{duplicated} duplicated, {missing} missing: {ok(ids_ok)}")
    print(f"resume: job 2 continued at step {second.restored + 1}, right after job 1's last "
          f"checkpoint: {ok(resumed_right)}")
    print(f"loss: first {k} steps {early:.3f}, last {k} steps {late:.3f}: {ok(learned)}")
    records = ledger.checkpoints(run_id)
    coverage = ledger_coverage(ledger.consumption(run_id=run_id), expected, epochs=epochs)
    print(f"ledger {ledger.describe()}: {len(records)} checkpoints (steps "
          f"{', '.join(str(r.step) for r in records)}), {coverage.records} consumption "
          f"records, {coverage.rows:,} rows; {coverage.row_groups_exact}/{coverage.row_groups} "
          f"(epoch, row group) pairs consumed exactly once, {coverage.gap_rows} gap rows, "
          f"{coverage.overlap_rows} overlap rows; their ids are the table's, once per epoch: "
          f"{ok(coverage.exactly_once)}")
    proved = ids_ok and resumed_right and learned and coverage.exactly_once
    if proved:
        print(f"PROOF OK: {len(expected):,} rows trained exactly once per epoch over {epochs} "
              f"epochs across a preemption at step {first.last_step} (ids and ledger agree)")
    else:
        print("PROOF FAILED: see the lines above")
    return proved


class LineReader:
    """Reads a child's stdout lines in a thread, so the parent can wait for one of them."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._done = False
        self._thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self._thread.start()

    def _run(self, stream: IO[str]) -> None:
        for line in stream:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def wait_for(self, prefix: str, timeout: float) -> str | None:
        """The first line starting with ``prefix``; None if the stream ended or timed out."""
        with self._cond:
            found = self._cond.wait_for(
                lambda: self._done or any(x.startswith(prefix) for x in self.lines), timeout)
            if not found:
                return None
            return next((x for x in self.lines if x.startswith(prefix)), None)

    def join(self) -> list[str]:
        self._thread.join()
        return self.lines
