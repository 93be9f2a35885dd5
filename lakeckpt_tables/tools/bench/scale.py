"""``lakeckpt bench scale``: a 256-rank job on paper, simulated in one process (issue 23).

Ranks x workers readers over a metadata-only table of N files x R row groups
(``tools/synthetic.py``: nothing is read, the bench never iterates rows), with the real reader,
plan, accounting, checkpoint commit and Delta ledger (in a temporary directory). Wall clock:

- **plan per rank**: a fresh reader of one rank (``LakeDataset``: its units and its round's
  plan) and the windows of each of its workers' slices; time, and tracemalloc's peak while
  building it (the pinned snapshot's own listing, shared by every plan, is not counted: it
  is reported apart). Ranks are measured one at a time, each as if alone.
- **state bytes**: every worker's ``state_dict()`` (JSON) at the last save; max and p50.
- **commit**: per save, the slowest rank's sealing of its consumption rows (checksums
  included; ranks seal in parallel, so the slowest counts: its CPU time, as the simulated ranks
  share this machine's cores), the gather (the slowest rank's pickling of its report, CPU time
  too, then rank 0 unpickling every one, as ``gather_object`` does; no network) and rank
  0's ``Committer.decide`` (merge, encode, one ledger commit holding every rank's rows) and
  ``committed`` (retention: keep the last 3 checkpoints, read the run's tags, delete the
  model directory pushed out; compaction every 100 saves); p50 and p99. Each rank's
  consumption records are computed by the real accounting before (in a job every rank does
  it in parallel, in phase 1: ``capture`` is timed for one rank, alone).
- **restore**: a fresh reader of one rank of the smaller world loads the last checkpoint's
  state (read back from the ledger) and re-plans it (``start_cursor``): its first slice's
  windows are ready.
- **ledger size** after ``--ledger-saves`` saves (the same records; bytes and files on disk,
  after the manager's compaction cadence), extrapolated linearly to 10^4 saves.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import pickle
import statistics
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from lakeckpt_tables.checkpoint.commit import Attempt, Committer, Prepared, sealed
from lakeckpt_tables.checkpoint.consumption import consumed_between, segment_events
from lakeckpt_tables.checkpoint.retention import Retention
from lakeckpt_tables.io.checkpoint_storage import CheckpointStorage
from lakeckpt_tables.ledger import DeltaLedger, Ledger, LedgerEvent
from lakeckpt_tables.ledger.settling import now_utc
from lakeckpt_tables.plan import EpochPlan, Piece
from lakeckpt_tables.plan.rounds import Round, RoundUnits
from lakeckpt_tables.reader import LakeDataset, decode_state, merge_states
from lakeckpt_tables.reader.loop import start_cursor
from lakeckpt_tables.reader.planner import Cursor
from lakeckpt_tables.reader.state import PlanShape, ReaderState
from lakeckpt_tables.tools.synthetic import SyntheticSource

__all__ = ["ScaleReport", "format_report", "register", "run", "run_scale_bench"]

TARGETS = {"plan_s": 2.0, "plan_mib": 64.0, "commit_p50_ms": 200.0, "restore_s": 5.0,
           "state_kib": 64.0}
GOAL_LEDGER_SAVES = 10_000
BATCH_SIZE = 1024
GROUP_ROWS = 4096
QUICK = {"ranks": 8, "workers": 2, "files": 2_000, "row_groups": 4, "saves": 4,
         "ledger_saves": 8, "elastic_ranks": 6, "steps": 3}


@dataclass
class ScaleReport:
    """What ``lakeckpt bench scale`` measured (times in seconds unless named)."""

    ranks: int
    workers: int
    files: int
    row_groups: int
    elastic_ranks: int
    units: int
    rows: int
    listing_mib: float
    plan_s_each: list[float]
    plan_cpu_s_each: list[float]
    plan_mib_each: list[float]
    state_bytes_max: int
    state_bytes_p50: int
    merged_state_bytes: int
    replanned_state_bytes: int
    capture_s: float
    records_per_save: int
    commit_ms: list[float]
    commit_cpu_ms: list[float]
    gather_ms: list[float]
    seal_ms: list[float]
    restore_s_each: list[float]
    restore_cpu_s_each: list[float]
    restore_rows: int
    consumed_rows: int
    recorded_rows: int
    ledger_saves: int
    ledger_bytes: int
    ledger_files: int
    load_average: tuple[float, float, float] = field(default_factory=os.getloadavg)
    ledger_format: str = "delta"

    def figures(self) -> dict[str, float]:
        commits = sorted(self.commit_ms)
        return {"plan_s": max(self.plan_s_each), "plan_mib": max(self.plan_mib_each),
                "commit_p50_ms": statistics.median(commits),
                "commit_p99_ms": commits[min(len(commits) - 1, int(0.99 * len(commits)))],
                "restore_s": max(self.restore_s_each),
                "state_kib": max(self.state_bytes_max, self.replanned_state_bytes) / 1024}

    def to_json(self) -> dict[str, Any]:
        figures = self.figures()
        met = {k: figures[k] <= v for k, v in TARGETS.items()}
        per_save = self.ledger_bytes / max(self.ledger_saves, 1)
        return {**asdict(self), **figures, "targets": TARGETS, "met": met,
                "ledger_bytes_at_goal": int(per_save * GOAL_LEDGER_SAVES),
                "ledger_extrapolated": self.ledger_saves < GOAL_LEDGER_SAVES,
                "passed": all(met.values())}


class _SharedPlans:
    """The accounting's planner for every simulated rank at once: one reader's round plans,
    kept (the ranks' records are inputs to the commit figure, not the plan figure)."""

    def __init__(self, dataset: LakeDataset) -> None:
        self.dataset = dataset
        self.follows = False
        self._plans: dict[Any, tuple[EpochPlan, RoundUnits]] = {}

    def reshape(self, state: ReaderState, shape: PlanShape) -> ReaderState:
        return self.dataset.reshape(state, shape)

    def round_plan(self, index: int, shape: PlanShape, layouts: Mapping[int, tuple[Piece, ...]],
                   known: Mapping[int, Round]) -> tuple[EpochPlan, RoundUnits]:
        key = (index, shape, layouts.get(index))
        if key not in self._plans:
            self._plans[key] = self.dataset.round_plan(index, shape, layouts, known)
        return self._plans[key]

    def round_at(self, index: int, shape: PlanShape, layouts: Mapping[int, tuple[Piece, ...]],
                 known: Mapping[int, Round]) -> Round | None:
        return self.dataset.round_at(index, shape, layouts, known)


def _reader(source: SyntheticSource, rank: int, world: int) -> LakeDataset:
    return LakeDataset(source, batch_size=BATCH_SIZE, rank=rank, world_size=world, seed=0)


def _plan_rank(source: SyntheticSource, rank: int, ranks: int,
               workers: int) -> tuple[float, float, float]:
    """Wall time, CPU time and tracemalloc peak (MiB) of one fresh rank's plan and its
    workers' windows."""
    gc.collect()
    tracemalloc.start()
    started, cpu = time.perf_counter(), time.process_time()
    dataset = _reader(source, rank, ranks)
    plan, _ = dataset.round_plan(0, (ranks, workers, BATCH_SIZE), {}, {})
    for g in range(rank * workers, (rank + 1) * workers):
        plan.windows(g)
        plan.batch_ends(g)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return elapsed, cpu, peak


def _worker_states(dataset: LakeDataset, rank: int, shape: PlanShape,
                   position: Callable[[int], int]) -> list[dict[str, Any]]:
    """Each worker's ``state_dict()`` with its slice at ``position(g)`` (what a DataLoader
    worker reports after that many rows)."""
    out = []
    for g in range(rank * shape[1], (rank + 1) * shape[1]):
        dataset._cursor = Cursor(g, shape, {}, 0, position(g), {})
        out.append(dataset.state_dict())
    dataset._cursor = None
    return out


def run_scale_bench(*, ranks: int = 256, workers: int = 8, files: int = 10**6,
                    row_groups: int = 8, saves: int = 50, ledger_saves: int = 200,
                    elastic_ranks: int = 192, steps: int = 50, plan_ranks: int = 3,
                    root: str | None = None, ledger_format: str = "delta",
                    progress: Callable[[str], None] = lambda _: None) -> ScaleReport:
    """Simulate the job and measure; ``steps``: batches every slice reads between saves;
    ``ledger_format``: ``delta``, or ``iceberg`` (a SQLite catalog beside it)."""
    started = time.perf_counter()
    source = SyntheticSource(files, row_groups, GROUP_ROWS)
    units = source.snapshot().units
    listing_mib = units.rows.nbytes / 2**20
    shape: PlanShape = (ranks, workers, BATCH_SIZE)
    progress(f"{len(units):,} units, {int(units.rows.sum()):,} rows; listing {listing_mib:.0f} "
             f"MiB ({time.perf_counter() - started:.1f} s)")

    plan_s, plan_cpu_s, plan_mib = [], [], []
    for rank in sorted({0, ranks // 2, ranks - 1})[:plan_ranks]:
        s, cpu, mib = _plan_rank(source, rank, ranks, workers)
        plan_s.append(s)
        plan_cpu_s.append(cpu)
        plan_mib.append(mib)
        progress(f"plan of rank {rank}: {s:.2f} s ({cpu:.2f} s CPU), peak {mib:.1f} MiB")

    readers = [_reader(source, r, ranks) for r in range(ranks)]
    shared = _SharedPlans(readers[0])
    plan, _ = shared.round_plan(0, shape, {}, {})
    total_saves = max(saves, ledger_saves)
    ends = [plan.batch_ends(g)[:total_saves * steps] for g in range(ranks * workers)]
    batches = min(len(e) for e in ends)

    def at(save: int) -> Callable[[int], int]:
        k = min(save * steps, batches) - 1
        return lambda g: int(ends[g][k]) if k >= 0 else 0

    with tempfile.TemporaryDirectory(dir=root) as tmp:
        ledger = _ledger(ledger_format, os.path.join(tmp, "_ledger"))
        storage = CheckpointStorage(tmp)
        retention = Retention(ledger, storage, "scale", keep_last=3, compact_every=100)
        committer = Committer(ledger, storage, retention, run_id="scale",
                              owner=str(uuid.uuid4().int >> 66), config_hash="scale")
        baseline: dict[str, Any] | None = None
        head = None
        commit_ms: list[float] = []
        commit_cpu_ms: list[float] = []
        gather_ms: list[float] = []
        seal_ms: list[float] = []
        states: list[dict[str, Any]] = []
        capture_s = 0.0
        records = recorded = 0
        for save in range(1, total_saves + 1):
            reports = []
            for rank in range(ranks):
                states = _worker_states(readers[rank], rank, shape, at(save))
                t0 = time.perf_counter()
                after = merge_states(states)  # the rank's state, as capture() takes it
                before = None if baseline is None else ReaderState.from_dict(baseline)
                consumed = consumed_between(shared, before, after)
                events = segment_events(shared, before, after)
                if rank == 0 and save == 1:
                    capture_s = time.perf_counter() - t0
                reports.append(Prepared(True, reader=after.to_dict(), consumed=consumed,
                                        events=[LedgerEvent(*e) for e in events]))
            count = sum(len(r.consumed) for r in reports)
            recorded += sum(c.rows if c.rows >= 0 else c.row_end - c.row_start
                            for r in reports for c in r.consumed)
            # phase 2: rank 0 fixes the timestamp, every rank seals its rows (in parallel: the
            # slowest counts) and sends them
            stamp = now_utc()
            _model_files(tmp, save)
            attempts = [Attempt(save, f"ckpt-{save}", f"scale/step-{save}", (), report,
                                committed_at=stamp) for report in reports]
            seal = send = 0.0
            sent = []
            for each in attempts:  # CPU time: here 256 ranks share the machine's cores
                s0 = time.process_time()
                ready = sealed(each, "scale", committer.owner)
                s1 = time.process_time()
                sent.append(pickle.dumps(ready))  # each rank pickles its own
                seal, send = max(seal, s1 - s0), max(send, time.process_time() - s1)
            t0, c0 = time.perf_counter(), time.process_time()
            gathered = [pickle.loads(b) for b in sent]  # rank 0 unpickles every one
            t1 = time.perf_counter()
            outcome = committer.decide(attempts[0], gathered, head, ranks)
            if not hasattr(outcome, "checkpoint_id"):
                raise RuntimeError(f"save {save} was not committed: {outcome}")
            committer.committed(outcome)
            t2, c2 = time.perf_counter(), time.process_time()
            head, baseline = outcome, decode_state(outcome.reader_state)
            if save <= saves:
                seal_ms.append(seal * 1000)
                gather_ms.append((t1 - t0 + send) * 1000)
                commit_ms.append((t2 - t0 + seal + send) * 1000)
                commit_cpu_ms.append((c2 - c0 + seal + send) * 1000)
                records = max(records, count)
                final = baseline
            if save % 10 == 0 or save == total_saves:
                progress(f"save {save}: {count:,} records, commit "
                         f"{(t2 - t0 + seal + send) * 1000:.0f} ms (seal {seal * 1000:.0f} ms "
                         f"a rank, gather {(t1 - t0 + send) * 1000:.0f} ms)")
        ledger_bytes, ledger_files = _disk(os.path.join(tmp, "_ledger"))
        worker_bytes = sorted(len(json.dumps(s, separators=(",", ":")))
                              for rank in range(ranks)
                              for s in _worker_states(readers[rank], rank, shape, at(saves)))
        stored = ledger.latest("scale")
        assert stored is not None
        restored = decode_state(stored.reader_state)
        del readers, shared, plan
        restore_s, restore_cpu_s, restore_rows, replanned_bytes = _restore(
            source, restored, elastic_ranks, workers)
        progress(f"restore on {elastic_ranks} ranks: {max(restore_s):.2f} s "
                 f"({max(restore_cpu_s):.2f} s CPU)")
    consumed_rows = sum(p for _, p in ReaderState.from_dict(restored).positions())
    return ScaleReport(
        ranks, workers, files, row_groups, elastic_ranks, len(units), int(units.rows.sum()),
        listing_mib, plan_s, plan_cpu_s, plan_mib, worker_bytes[-1],
        worker_bytes[len(worker_bytes) // 2], len(json.dumps(final, separators=(",", ":"))),
        replanned_bytes,
        capture_s, records, commit_ms, commit_cpu_ms, gather_ms, seal_ms, restore_s, restore_cpu_s,
        restore_rows, consumed_rows, recorded, total_saves, ledger_bytes, ledger_files,
        ledger_format=ledger_format)


def _restore(source: SyntheticSource, state: dict[str, Any], ranks: int,
             workers: int) -> tuple[list[float], list[float], int, int]:
    """Seconds for one fresh rank (first and last) of ``ranks`` to load ``state`` and stand
    ready at its first slice's windows; the rows the re-planned round holds, and the bytes
    of a worker's ``state_dict()`` there (it carries the re-planned layout)."""
    times, cpus, rows, size = [], [], 0, 0
    shape: PlanShape = (ranks, workers, BATCH_SIZE)
    for rank in sorted({0, ranks - 1}):
        gc.collect()
        started, cpu = time.perf_counter(), time.process_time()
        dataset = _reader(source, rank, ranks)
        dataset.load_state_dict(state)
        cursor = start_cursor(dataset.planner, dataset._resume, shape, 0, own=False)
        plan, _ = dataset.round_plan(cursor.epoch, shape, cursor.layouts, cursor.rounds)
        plan.windows(cursor.slice_index)
        times.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu)
        rows = plan.rows
        dataset._cursor = cursor
        size = max(size, len(json.dumps(dataset.state_dict(), separators=(",", ":"))))
    return times, cpus, rows, size


def _ledger(ledger_format: str, where: str) -> Ledger:
    """The bench's ledger at ``where``: Delta, or Iceberg with its SQLite catalog inside."""
    if ledger_format == "delta":
        return DeltaLedger(where)
    if ledger_format != "iceberg":
        raise ValueError(f"ledger format must be 'delta' or 'iceberg', not {ledger_format!r}")
    from pyiceberg.catalog.sql import SqlCatalog

    from lakeckpt_tables.ledger import IcebergLedger

    os.makedirs(where)
    catalog = SqlCatalog("scale", uri=f"sqlite:///{where}/catalog.db",
                         warehouse=pathlib.Path(where).as_uri())
    return IcebergLedger("scale.ledger", catalog=catalog)


def _model_files(root: str, save: int) -> None:
    """A save's model directory (one small file), as phase 1 leaves it: retention then lists,
    pushes out and deletes checkpoints, and reads the run's tags, as it does in a job."""
    folder = os.path.join(root, "scale", f"step-{save}")
    os.makedirs(folder)
    with open(os.path.join(folder, "__0_0.distcp"), "wb") as f:
        f.write(b"\0" * 4096)


def _disk(path: str) -> tuple[int, int]:
    size = count = 0
    for folder, _, names in os.walk(path):
        for name in names:
            size += os.path.getsize(os.path.join(folder, name))
            count += 1
    return size, count


def format_report(report: ScaleReport) -> str:
    data = report.to_json()
    mark = {k: "ok" if v else "NOT MET" for k, v in data["met"].items()}
    return "\n".join([
        f"scale: {report.ranks} ranks x {report.workers} workers over {report.files:,} files x "
        f"{report.row_groups} row groups ({report.units:,} units, {report.rows:,} rows); "
        f"load average {report.load_average[0]:.1f}",
        f"  listing (the snapshot's, shared)  {report.listing_mib:8.1f} MiB",
        f"  plan per rank                     {data['plan_s']:8.2f} s    (<= 2 s: "
        f"{mark['plan_s']}; CPU {max(report.plan_cpu_s_each):.2f} s)",
        f"  plan memory per rank (peak)       {data['plan_mib']:8.1f} MiB  (<= 64: "
        f"{mark['plan_mib']})",
        f"  worker state max / p50            {report.state_bytes_max:8,} / "
        f"{report.state_bytes_p50:,} B; merged {report.merged_state_bytes:,} B; a worker's "
        f"after the re-plan {report.replanned_state_bytes:,} B (<= 64 KiB: {mark['state_kib']})",
        f"  capture per rank (accounting)     {report.capture_s:8.2f} s",
        f"  seal per rank p50 / max           {statistics.median(report.seal_ms):8.1f} / "
        f"{max(report.seal_ms):.1f} ms CPU (its consumption rows, checksums included)",
        f"  commit p50 / p99                  {data['commit_p50_ms']:8.0f} / "
        f"{data['commit_p99_ms']:.0f} ms (<= 200: {mark['commit_p50_ms']}; CPU p50 "
        f"{statistics.median(report.commit_cpu_ms):.0f} ms); "
        f"{report.records_per_save:,} records a save, {report.ledger_format} ledger",
        f"  restore + re-plan to {report.elastic_ranks} ranks      {data['restore_s']:8.2f} s   "
        f" (<= 5 s: {mark['restore_s']}; CPU {max(report.restore_cpu_s_each):.2f} s)",
        f"  ledger after {report.ledger_saves:,} saves          {report.ledger_bytes / 2**20:8.1f}"
        f" MiB in {report.ledger_files:,} files; at 10^4 saves ~"
        f"{data['ledger_bytes_at_goal'] / 2**30:.1f} GiB (extrapolated)",
        "PASSED" if data["passed"] else "FAILED"])


def register(sub: Any) -> None:
    """Add ``scale`` to the ``lakeckpt bench`` subcommands ``sub``."""
    parser = sub.add_parser("scale", help="256 ranks x 8 workers simulated: plan, state, "
                            "commit, elastic restore, ledger size",
                            description=__doc__.split("\n\n")[1] if __doc__ else None)
    parser.add_argument("--ranks", type=int, default=256, help="ranks (default 256)")
    parser.add_argument("--workers", type=int, default=8, help="workers per rank (default 8)")
    parser.add_argument("--files", type=int, default=10**6, help="files (default 10^6)")
    parser.add_argument("--row-groups", type=int, default=8,
                        help="row groups per file (default 8)")
    parser.add_argument("--saves", type=int, default=50, help="timed saves (default 50)")
    parser.add_argument("--ledger-saves", type=int, default=200,
                        help="saves before the ledger is measured (default 200; the size at "
                        "10^4 is extrapolated from it)")
    parser.add_argument("--elastic-ranks", type=int, default=192,
                        help="ranks of the elastic restore (default 192)")
    parser.add_argument("--steps", type=int, default=50,
                        help="batches every slice reads between saves (default 50)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 8 ranks x 2 workers over 2,000 files x 4 row groups")
    parser.add_argument("--dir", metavar="PATH", default=None,
                        help="put the ledger under PATH (default: a temporary directory)")
    parser.add_argument("--ledger", choices=("delta", "iceberg"), default="delta",
                        help="the ledger's format (default delta; iceberg: a SQLite catalog)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    """Run ``lakeckpt bench scale``; 0 when every goal is met."""
    def progress(line: str) -> None:
        print(f"  {line}", file=sys.stderr, flush=True)

    sizes = dict(QUICK) if args.quick else {
        "ranks": args.ranks, "workers": args.workers, "files": args.files,
        "row_groups": args.row_groups, "saves": args.saves, "ledger_saves": args.ledger_saves,
        "elastic_ranks": args.elastic_ranks, "steps": args.steps}
    report = run_scale_bench(**sizes, root=args.dir, ledger_format=args.ledger,
                             progress=progress)
    data = report.to_json()
    print(json.dumps(data, indent=2) if args.json else format_report(report))
    return 0 if data["passed"] else 1
