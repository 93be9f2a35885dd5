"""``lakeckpt bench follow``: how fast a follower sees appends, and what a long backlog costs.

Two families of figures for follow mode (``LakeDataset(follow=True)``, see
:mod:`lakeckpt_tables.reader.rounds`):

1. **Append-to-batch latency**, p50/p99: a writer thread appends single-row commits to a Delta
   table at jittered intervals, recording when each ``write_deltalake`` call returned (the
   commit is on disk by then; the table is created with a checkpoint interval too large to be
   reached, so no log checkpoint is written after a commit and the return follows the commit
   by well under a millisecond). Each row also carries the wall-clock time its write started
   (``written_at``), which any process can compare. A follower with ``min_segment_rows=1``
   records when each id first appears in a batch it yields. Measured with the follower in
   this process (``num_workers=0``) and in one ``StatefulDataLoader`` worker. The follower
   polls the log every ``poll_interval``: expect ~poll/2 at p50 and ~poll at p99, plus the
   cost of reading the commit and the file.
2. **Segment formation after a backlog**: a Delta table with N tiny append commits (10,000;
   1,000 under ``--quick``) after version 0 — built once under ``--dir`` and reused (NOTE
   [ backlog build ]) — and a follower pinned at version 0 with ``min_segment_rows`` spanning all
   N commits: the time from its first batch (the pinned row) to the first batch of segment 1,
   which lists every commit of the log, reads the footer of every file it added, plans the
   segment and reads the first window. Footers are cached per process; the cache is emptied
   before each measurement, as in a newly started follower (every DataLoader worker forms
   segments on its own, so this is paid once per worker). The commit-log scan alone is timed
   on the side.

No figure here has a target in DESIGN.md; the verdicts check only that every appended row was
delivered exactly once.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lakeckpt_tables.plan.check import check_exactly_once
from lakeckpt_tables.reader.dataset import LakeDataset
from lakeckpt_tables.sources import footers
from lakeckpt_tables.sources.delta import DeltaSource
from lakeckpt_tables.tools.bench._common import (
    Figure,
    Progress,
    figure_lines,
    machine_note,
    no_loader_warnings,
    passed,
    percentile,
    quiet,
    scratch,
)

__all__ = [
    "DEFAULT_BACKLOG",
    "DEFAULT_COMMITS",
    "DEFAULT_INTERVAL",
    "DEFAULT_POLL",
    "QUICK_BACKLOG",
    "QUICK_COMMITS",
    "BacklogTable",
    "FollowBenchReport",
    "LatencyResult",
    "SegmentCostResult",
    "ensure_backlog_table",
    "format_report",
    "measure_latency",
    "measure_segment_cost",
    "run_follow_bench",
]

DEFAULT_POLL = 0.1
DEFAULT_COMMITS = 60
QUICK_COMMITS = 15
DEFAULT_INTERVAL = 0.2
"""Mean seconds between the writer's commits (each interval drawn from 0.5x-1.5x of it)."""
DEFAULT_BACKLOG = 10_000
QUICK_BACKLOG = 1_000

_SCHEMA = pa.schema([("id", pa.int64()), ("written_at", pa.float64())])
_NO_LOG_CHECKPOINTS = {"delta.checkpointInterval": "1000000000"}

def _row(i: int) -> pa.Table:
    return pa.table({"id": pa.array([i], pa.int64()),
                     "written_at": pa.array([time.time()], pa.float64())}, schema=_SCHEMA)


# ----------------------------------------------------------------------------- latency


@dataclass(frozen=True)
class LatencyResult:
    """Append-to-batch delays of one follower configuration.

    Attributes:
        mode: ``"in-process"`` or ``"DataLoader, N worker(s)"``.
        workers: DataLoader workers (0: the dataset iterated in this process).
        poll_interval: the follower's ``poll_interval``, seconds.
        commits: single-row commits the writer made.
        interval: mean seconds between commits.
        delivered: appended ids the follower yielded (each counted once).
        duplicates: appended ids it yielded more than once.
        unexpected: ids it yielded that no commit appended.
        latency_ms: per commit, ms from ``write_deltalake`` returning to the id in a batch.
        from_write_ms: per commit, ms from ``written_at`` (wall clock before the write) to the
            id in a batch (wall clock).
        write_ms: per commit, ms the ``write_deltalake`` call took.
    """

    mode: str
    workers: int
    poll_interval: float
    commits: int
    interval: float
    delivered: int
    duplicates: int
    unexpected: int
    latency_ms: tuple[float, ...]
    from_write_ms: tuple[float, ...]
    write_ms: tuple[float, ...]

    @property
    def exactly_once(self) -> bool:
        return self.delivered == self.commits and not (self.duplicates or self.unexpected)

    @property
    def p50_ms(self) -> float:
        return percentile(self.latency_ms, 50)

    @property
    def p99_ms(self) -> float:
        return percentile(self.latency_ms, 99)


class _Writer(threading.Thread):
    """Appends ``commits`` single-row commits with ids ``first, first+1, ...``."""

    def __init__(self, uri: str, first: int, commits: int, interval: float, seed: int) -> None:
        super().__init__(name="bench-follow-writer", daemon=True)
        self.uri, self.first, self.commits, self.interval = uri, first, commits, interval
        self.rng = np.random.default_rng(seed)
        self.started: dict[int, float] = {}
        self.committed: dict[int, float] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        from deltalake import DeltaTable, write_deltalake

        try:
            table = DeltaTable(self.uri)
            for k in range(self.commits):
                time.sleep(self.interval * float(self.rng.uniform(0.5, 1.5)))
                i = self.first + k
                self.started[i] = time.perf_counter()
                write_deltalake(table, _row(i), mode="append")
                self.committed[i] = time.perf_counter()
        except BaseException as exc:  # reported by the main thread
            self.error = exc


def measure_latency(
    root: str | Path,
    *,
    workers: int = 0,
    poll_interval: float = DEFAULT_POLL,
    commits: int = DEFAULT_COMMITS,
    interval: float = DEFAULT_INTERVAL,
    seed: int = 0,
    progress: Progress = quiet,
) -> LatencyResult:
    """Follow a new table under ``root`` while a writer thread appends ``commits`` commits.

    The follower is started and has yielded the pinned snapshot's row before the writer
    starts, so process and worker start-up are not counted.

    Raises:
        RuntimeError: the writer failed, or the follower ended before the last commit.
    """
    from deltalake import write_deltalake

    uri = str(Path(root) / f"latency-{workers}w-{time.monotonic_ns()}")
    write_deltalake(uri, _row(-1), configuration=_NO_LOG_CHECKPOINTS)
    dataset = LakeDataset(DeltaSource(uri), columns=["id", "written_at"], batch_size=64,
                          shuffle=False, version=0, follow=True, until_version=commits,
                          poll_interval=poll_interval, min_segment_rows=1,
                          max_idle=max(30.0, 20 * interval))
    seen: dict[int, float] = {}
    seen_wall: dict[int, float] = {}
    written_at: dict[int, float] = {}
    ids_delivered: list[int] = []
    writer = _Writer(uri, 0, commits, interval, seed)
    with no_loader_warnings():
        source: Any = dataset
        if workers:
            from torchdata.stateful_dataloader import StatefulDataLoader

            source = StatefulDataLoader(dataset, batch_size=None, num_workers=workers)
        batches = iter(source)
        next(batches)  # the pinned row: the follower is up
        writer.start()
        for batch in batches:
            now, wall = time.perf_counter(), time.time()
            for i, t in zip(batch["id"].tolist(), batch["written_at"].tolist(), strict=True):
                ids_delivered.append(i)
                if i not in seen:
                    seen[i], seen_wall[i], written_at[i] = now, wall, t
    writer.join()
    if writer.error is not None:
        raise RuntimeError(f"the writer failed: {writer.error!r}") from writer.error
    ids = sorted(writer.committed)
    check = check_exactly_once(ids_delivered, ids)
    if check.missing:
        raise RuntimeError(f"the follower ended without ids {list(check.missing[:10])} of {uri}")
    mode = "in-process" if not workers else f"DataLoader, {workers} worker(s)"
    result = LatencyResult(
        mode, workers, poll_interval, commits, interval, len(ids) - len(check.missing),
        len(check.duplicated), len(check.unexpected),
        tuple((seen[i] - writer.committed[i]) * 1e3 for i in ids),
        tuple((seen_wall[i] - written_at[i]) * 1e3 for i in ids),
        tuple((writer.committed[i] - writer.started[i]) * 1e3 for i in ids))
    progress(f"latency ({mode}, poll {poll_interval} s, {commits} commits): p50 "
             f"{result.p50_ms:.1f} ms, p99 {result.p99_ms:.1f} ms")
    return result


# ----------------------------------------------------------------------------- backlog


@dataclass(frozen=True)
class BacklogTable:
    """A Delta table: one row at version 0, then ``commits`` single-row append commits.

    Attributes:
        uri: table root.
        commits: append commits after version 0 (the row of version v has id v).
        reused: the table was found complete under the benchmark directory.
        build_s: seconds spent writing commits in this run (0 when reused).
    """

    uri: str
    commits: int
    reused: bool
    build_s: float


def ensure_backlog_table(root: str | Path, commits: int, *,
                         progress: Progress = quiet) -> BacklogTable:
    """Build ``root/follow-commits-<commits>`` or reuse it; an interrupted build is resumed.

    NOTE [ backlog build ]
    Version 0 is written by ``write_deltalake``; each later commit is written the way
    ``write_deltalake`` writes an append — a snappy Parquet file, then ``_delta_log/<v>.json``
    holding a ``commitInfo`` (operation WRITE, mode Append) and one ``add`` with full
    statistics — created put-if-absent (hard link of a complete temporary file). Through
    ``write_deltalake`` itself the cost of a commit grows with the files already in the
    table (measured here: ~14 ms at 250 files, ~50 ms at 1,000, with the default log
    checkpoints; worse without), so 10,000 commits would take most of an hour; written
    directly they take seconds. deltalake reads the result back as version ``commits``.
    """
    from deltalake import DeltaTable, write_deltalake

    if commits < 1:
        raise ValueError(f"commits must be positive, got {commits}")
    path = Path(root) / f"follow-commits-{commits}"
    log = path / "_delta_log"
    if not (log / f"{0:020d}.json").exists():
        if path.exists():
            shutil.rmtree(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_deltalake(str(path), _row(0))
    have = max(int(p.name[:20]) for p in log.glob("*.json") if p.name[:20].isdigit())
    if have > commits:
        raise RuntimeError(f"{path} has {have} commits after version 0, expected {commits}; "
                           "remove it")
    if have == commits and int(DeltaTable(str(path)).version()) == commits:
        return BacklogTable(str(path), commits, True, 0.0)
    t0 = time.perf_counter()
    for v in range(have + 1, commits + 1):
        _append_commit(path, v)
        if v % 2000 == 0 or v == commits:
            progress(f"backlog table: {v:,}/{commits:,} commits ({time.perf_counter() - t0:.1f} s)")
    version = int(DeltaTable(str(path)).version())
    if version != commits:
        raise RuntimeError(f"deltalake reads {path} at version {version}, expected {commits}")
    return BacklogTable(str(path), commits, False, time.perf_counter() - t0)


def _append_commit(path: Path, version: int) -> None:
    """Commit ``version``: one new file holding the row with id ``version``."""
    table = _row(version)
    name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    pq.write_table(table, path / name, compression="snappy")
    now = int(time.time() * 1000)
    row = table.to_pylist()[0]
    stats = {"numRecords": 1, "minValues": row, "maxValues": row,
             "nullCount": dict.fromkeys(row, 0)}
    actions = [
        {"commitInfo": {"timestamp": now, "operation": "WRITE",
                        "operationParameters": {"mode": "Append"},
                        "engineInfo": "lakeckpt bench follow",
                        "operationMetrics": {"num_added_files": 1, "num_removed_files": 0,
                                             "num_added_rows": 1}}},
        {"add": {"path": name, "partitionValues": {}, "size": (path / name).stat().st_size,
                 "modificationTime": now, "dataChange": True, "stats": json.dumps(stats)}},
    ]
    final = path / "_delta_log" / f"{version:020d}.json"
    tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text("".join(json.dumps(a) + "\n" for a in actions))
    try:
        os.link(tmp, final)  # put-if-absent: never replaces a commit
    finally:
        tmp.unlink()


@dataclass(frozen=True)
class SegmentCostResult:
    """Time for a follower pinned at version 0 to reach segment 1 over ``commits`` commits.

    Attributes:
        commits: commits in the segment.
        rounds: measurements (the median is reported).
        first_batch_s: per round, from the pinned batch to the first batch of segment 1.
        scan_s: per round, the commit-log scan alone (commit JSON + footers of added files).
        rows: rows of segment 1 (one per commit).
        verified: every round's segment held exactly the rows appended after version 0.
    """

    commits: int
    rounds: int
    first_batch_s: tuple[float, ...]
    scan_s: tuple[float, ...]
    rows: int
    verified: bool

    @property
    def first_batch(self) -> float:
        return statistics.median(self.first_batch_s)

    @property
    def scan(self) -> float:
        return statistics.median(self.scan_s)

    @property
    def per_commit_ms(self) -> float:
        return self.first_batch / self.commits * 1e3


def _backlog_dataset(table: BacklogTable) -> LakeDataset:
    return LakeDataset(DeltaSource(table.uri), columns=["id"], batch_size=1, version=0,
                       follow=True, until_version=table.commits,
                       min_segment_rows=table.commits, poll_interval=0.01, max_idle=1.0)


def _cold_footers() -> None:
    """Empty this process's footer cache, as a newly started follower has it."""
    footers.forget()


def measure_segment_cost(table: BacklogTable, *, rounds: int = 3,
                         progress: Progress = quiet) -> SegmentCostResult:
    """Time to the first batch of segment 1, and the commit-log scan alone; one warm-up."""
    firsts: list[float] = []
    scans: list[float] = []
    verified = True
    rows = 0
    for r in range(rounds + 1):  # round 0 warms the page cache and is not counted
        gc.collect()
        _cold_footers()
        dataset = _backlog_dataset(table)
        batches = iter(dataset)
        pinned = next(batches)
        t0 = time.perf_counter()
        first = next(batches)
        t1 = time.perf_counter()
        segment = dataset.rounds.get(1, {}, wait=False)
        units = dataset.rounds.units(segment) if segment is not None else None
        rows = int(units.rows.sum()) if units is not None else 0
        verified = verified and (pinned["id"].tolist() == [0] and segment is not None
                                 and (segment.base, segment.to) == (0, table.commits)
                                 and rows == table.commits
                                 and 1 <= int(first["id"][0]) <= table.commits)
        _cold_footers()
        fresh = _backlog_dataset(table)
        t2 = time.perf_counter()
        fresh.rounds.get(1, {}, wait=False)
        t3 = time.perf_counter()
        if r:
            firsts.append(t1 - t0)
            scans.append(t3 - t2)
            progress(f"segment over {table.commits:,} commits, round {r}/{rounds}: first "
                     f"batch {t1 - t0:.2f} s, log scan {t3 - t2:.2f} s")
    return SegmentCostResult(table.commits, rounds, tuple(firsts), tuple(scans), rows, verified)


# ------------------------------------------------------------------------------ report


@dataclass
class FollowBenchReport:
    """Everything ``lakeckpt bench follow`` measured."""

    latency: list[LatencyResult]
    backlog: BacklogTable
    segment: SegmentCostResult
    figures: list[Figure] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types only, as ``--json`` prints it."""
        latency = []
        for r in self.latency:
            out = asdict(r)
            for key in ("latency_ms", "from_write_ms", "write_ms"):
                out[key] = [round(v, 3) for v in out[key]]
            out.update(p50_ms=r.p50_ms, p99_ms=r.p99_ms, exactly_once=r.exactly_once)
            latency.append(out)
        s = self.segment
        segment = {**asdict(s), "first_batch_s": list(s.first_batch_s),
                   "scan_s": list(s.scan_s), "first_batch": s.first_batch, "scan": s.scan,
                   "per_commit_ms": s.per_commit_ms}
        return {"latency": latency, "backlog": asdict(self.backlog), "segment": segment,
                "figures": [f.to_json() for f in self.figures],
                "passed": passed(self.figures)}


def _figures(latency: list[LatencyResult], backlog: BacklogTable,
             s: SegmentCostResult) -> list[Figure]:
    out: list[Figure] = []
    for r in latency:
        expect = f"poll {r.poll_interval:g} s: expect ~{r.poll_interval * 500:.0f} ms + read"
        out.append(Figure(f"append -> batch p50, {r.mode}", r.p50_ms, "ms", "", None,
                          f"{r.commits} single-row commits ~{r.interval:g} s apart; {expect}"))
        out.append(Figure(f"append -> batch p99, {r.mode}", r.p99_ms, "ms", "", None,
                          f"max {max(r.latency_ms):.1f} ms; from the write's start p50 "
                          f"{percentile(r.from_write_ms, 50):.1f} ms (wall clock)"))
        out.append(Figure(f"appended rows delivered, {r.mode}", r.delivered, "rows",
                          "exactly once", r.exactly_once,
                          f"{r.duplicates} duplicated, {r.commits - r.delivered} missing, "
                          f"{r.unexpected} unexpected"))
    write = [w for r in latency for w in r.write_ms]
    if write:
        out.append(Figure("append commit (write_deltalake) p50", percentile(write, 50), "ms",
                          "", None, f"p99 {percentile(write, 99):.1f} ms, the writer side"))
    n = s.commits
    built = "reused" if backlog.reused else f"built in {backlog.build_s:.0f} s"
    out.extend([
        Figure(f"segment over {n:,} commits: first batch", s.first_batch, "s", "", None,
               f"follower pinned at version 0, min_segment_rows={n:,}; cold footer cache; "
               f"median of {s.rounds}"),
        Figure("  of which commit-log scan + footers", s.scan, "s", "", None,
               f"{n:,} commit JSON files and {n:,} footers read one by one"),
        Figure("  per commit", s.per_commit_ms, "ms", "", None,
               "paid once per DataLoader worker (each forms segments on its own)"),
        Figure(f"segment over {n:,} commits holds them all", s.rows, "rows", "exactly once",
               s.verified, f"table {built}"),
    ])
    return out


def run_follow_bench(
    *,
    quick: bool = False,
    root: str | Path | None = None,
    poll_interval: float = DEFAULT_POLL,
    commits: int | None = None,
    interval: float = DEFAULT_INTERVAL,
    backlog: int | None = None,
    workers: Sequence[int] = (0, 1),
    segment_rounds: int = 3,
    progress: Progress = quiet,
) -> FollowBenchReport:
    """Measure both families; the backlog table is kept under ``root`` (temporary if None).

    Args:
        quick: fewer commits (:data:`QUICK_COMMITS`) and a smaller backlog
            (:data:`QUICK_BACKLOG`).
        root: directory keeping the backlog table for later runs.
        poll_interval: the follower's ``poll_interval``.
        commits: commits per latency measurement (default by ``quick``).
        interval: mean seconds between the writer's commits.
        backlog: commits of the backlog table (default by ``quick``).
        workers: DataLoader worker counts to measure latency with (0: in-process).
        segment_rounds: measurements of the segment formation.
        progress: called with a line of text as measurements come in.
    """
    commits = commits or (QUICK_COMMITS if quick else DEFAULT_COMMITS)
    backlog = backlog or (QUICK_BACKLOG if quick else DEFAULT_BACKLOG)
    with scratch(root, "lakeckpt-bench-follow-") as path:
        return _run(path, poll_interval, commits, interval, backlog, workers, segment_rounds,
                    progress)


def _run(root: Path, poll_interval: float, commits: int, interval: float, backlog: int,
         workers: Sequence[int], segment_rounds: int, progress: Progress) -> FollowBenchReport:
    with tempfile.TemporaryDirectory(prefix="latency-", dir=root) as tmp:
        latency = [measure_latency(tmp, workers=w, poll_interval=poll_interval,
                                   commits=commits, interval=interval, seed=w,
                                   progress=progress) for w in workers]
    table = ensure_backlog_table(root, backlog, progress=progress)
    progress(f"backlog table {table.uri}: {backlog:,} commits "
             f"({'reused' if table.reused else f'built in {table.build_s:.0f} s'})")
    segment = measure_segment_cost(table, rounds=segment_rounds, progress=progress)
    report = FollowBenchReport(latency, table, segment)
    report.figures = _figures(latency, table, segment)
    return report


def format_report(report: FollowBenchReport) -> str:
    """The figures as a plain-text table, like ``lakeckpt bench read``."""
    lines = figure_lines(report.figures)
    verdict = "every appended row delivered exactly once" if report.to_json()["passed"] \
        else "rows MISSED or DUPLICATED"
    lines.append("")
    lines.append(f"backlog table: {report.backlog.uri}; local disk, {machine_note()}; {verdict}")
    return "\n".join(lines)
