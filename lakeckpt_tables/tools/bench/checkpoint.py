"""``lakeckpt bench checkpoint``: the checkpoint figures, each measured side by side in one run.

Three families of figures, for DESIGN.md ("Figures we hold ourselves to"):

1. **Ledger commit latency**, p50/p99, for 1, 4 and 8 ranks (target p50 <= 100 ms on local
   disk). A real job per configuration: ranks are ``torchrun`` processes over gloo (one rank
   runs in this process, a world of one), each training a tiny model from a
   ``StatefulDataLoader`` with 2 workers over a Delta table of small row groups, and saving
   every few steps through :class:`CheckpointManager`. *Commit* is phase 2 as the coordinator
   sees it: gather the ranks' reports, build the records, one ledger commit holding the
   checkpoint and every (rank, worker)'s consumption records, broadcast the outcome
   (NOTE [ what the commit figure times ]). *Save* is the whole ``save()`` on rank 0: DCP
   write, checksums, commit and the retention scan after it. Delta is the default ledger;
   an Iceberg ledger on SQLite (and on PostgreSQL when a server answers) is measured for one
   rank alongside.
2. **Step-time overhead** (:mod:`.overhead`) of sync and async saves of a small
   MLP (a few MB, Adam) while it trains from a :class:`LakeDataset` over a synthetic Delta table:
   blocks of N steps with no checkpoints, with ``save()`` every k steps, and with
   ``async_save=True`` every k steps, interleaved in rotating order over several rounds; the
   overhead is the median over rounds of each block's time over the no-checkpoint block of the same
   round. The *tracking* cost (capturing the merged reader state and the rows consumed since the
   previous checkpoint, ``CheckpointManager._capture_reader``) is timed alone and given as a share
   of the training time between checkpoints every 500 steps (target < 0.5%).
3. **Ledger bytes per checkpoint**: growth of the ledger (Delta: the ``_ledger`` directory,
   data files and ``_delta_log``; Iceberg: the table's warehouse directory) over the saves of
   each job of (1), and what is left after ``ledger.compact()``.

NOTE [ what the commit figure times ]
The manager is subclassed here (measurement stays out of the library) to time ``_commit`` on
rank 0, minus the retention scan ``_retire_old`` that runs after the outcome is broadcast, and
``ledger.commit`` alone. Before ``_commit`` the subclass waits at a barrier of the protocol's
group, so the figure holds the commit and its collectives, not the time the coordinator waits
for a slower rank to finish writing its shard (which ``save total`` keeps). Ranks other than 0
sit idle in the broadcast meanwhile, so 8 ranks on 2 cores measure a commit faithfully.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lakeckpt_tables.tools.bench._common import Figure, figure_lines, machine_note, passed, scratch
from lakeckpt_tables.tools.bench._timing import Progress, clock, percentile, quiet
from lakeckpt_tables.tools.bench.commit_job import (
    CommitJobSpec,
    LedgerKind,
    drop_iceberg_ledger,
    ensure_commit_table,
    run_commit_job,
)
from lakeckpt_tables.tools.bench.data import SyntheticTable, ensure_synthetic_table
from lakeckpt_tables.tools.bench.overhead import (
    MODES,
    TRACKING_INTERVAL,
    OverheadResult,
    measure_overhead,
)

__all__ = [
    "COMMIT_TARGET_MS",
    "DEFAULT_PG_URI",
    "TRACKING_INTERVAL",
    "TRACKING_TARGET",
    "CheckpointBenchReport",
    "CommitJobSpec",
    "CommitResult",
    "LedgerKind",
    "OverheadResult",
    "build_report",
    "ensure_commit_table",
    "format_report",
    "measure_commit",
    "measure_overhead",
    "postgres_uri",
    "run_checkpoint_bench",
    "run_commit_job",
]

COMMIT_TARGET_MS = 100.0
TRACKING_TARGET = 0.005

DEFAULT_PG_URI = "postgresql+psycopg://lakeckpt:lakeckpt@127.0.0.1:5432/lakeckpt"
"""Where ``scripts/postgres.sh`` starts PostgreSQL; ``LAKECKPT_TEST_PG_URI`` overrides it."""

_LEDGER_LABELS: dict[str, str] = {"delta": "delta", "iceberg-sqlite": "iceberg (SQLite)",
                                  "iceberg-postgres": "iceberg (PostgreSQL)"}
_JOB_MODULE = "lakeckpt_tables.tools.bench.commit_job"


# ------------------------------------------------------------------------ commit figures


@dataclass(frozen=True)
class CommitResult:
    """Commit latency and ledger growth of one job (ledger backend x ranks).

    Attributes:
        ledger: ledger backend.
        ranks: processes of the job.
        workers: DataLoader workers per rank.
        saves: measured saves (after warm-up).
        committed: checkpoints committed in all, warm-up included.
        commit_ms: phase 2 on rank 0 per save (gather + ledger commit + broadcast).
        ledger_commit_ms: ``ledger.commit`` alone per save.
        gather_ms: gathering the ranks' reports (phase 2's first collective) per save.
        broadcast_ms: broadcasting the outcome (its last) per save.
        save_ms: ``save()`` on rank 0 per save.
        retire_ms: the retention scan after each commit (inside ``save()``).
        records: consumption records per commit.
        reader_state_bytes: encoded merged reader state of the last checkpoint.
        model_bytes: DCP files of the last checkpoint.
        ledger_before: ledger footprint before the first save.
        ledger_after: after the last.
        ledger_compacted: after ``compact()``.
        live_after_compact: Delta: bytes the current snapshot needs after ``compact()``
            (named data files + log); None for Iceberg.
        compact_ms: time of ``compact()``.
        wall_s: wall time of the whole job, process start-up included.
    """

    ledger: str
    ranks: int
    workers: int
    saves: int
    committed: int
    commit_ms: tuple[float, ...]
    ledger_commit_ms: tuple[float, ...]
    gather_ms: tuple[float, ...]
    broadcast_ms: tuple[float, ...]
    save_ms: tuple[float, ...]
    retire_ms: tuple[float, ...]
    records: tuple[int, ...]
    reader_state_bytes: int
    model_bytes: int
    ledger_before: dict[str, int]
    ledger_after: dict[str, int]
    ledger_compacted: dict[str, int]
    live_after_compact: int | None
    compact_ms: float
    wall_s: float

    @property
    def label(self) -> str:
        return f"{self.ranks} rank{'s' if self.ranks > 1 else ''}, {_LEDGER_LABELS[self.ledger]}"

    def p(self, name: str, q: float) -> float:
        """Percentile ``q`` of one of the ``*_ms`` series."""
        values: tuple[float, ...] = getattr(self, f"{name}_ms")
        return percentile(values, q)

    def bytes_per_checkpoint(self, key: str = "bytes", stage: str = "after") -> float:
        """Growth of the ledger footprint ``key`` per committed checkpoint, at ``stage``."""
        now = self.ledger_after if stage == "after" else self.ledger_compacted
        return (now[key] - self.ledger_before[key]) / self.committed

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["label"] = self.label
        out["percentiles_ms"] = {name: {"p50": self.p(name, 50), "p99": self.p(name, 99)}
                                 for name in ("commit", "ledger_commit", "gather", "broadcast",
                                              "save", "retire")}
        out["bytes_per_checkpoint"] = self.bytes_per_checkpoint()
        out["bytes_per_checkpoint_after_compact"] = self.bytes_per_checkpoint(stage="compacted")
        clean: dict[str, Any] = json.loads(json.dumps(out))  # plain JSON types: lists
        return clean


def _job_env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("LAKECKPT_CRASH_AT", None)
    return env


def _torchrun(spec: CommitJobSpec, ranks: int, timeout: float) -> dict[str, Any]:
    out = Path(spec.root) / "result.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={ranks}", "--max-restarts=0", "-m", _JOB_MODULE,
           "--spec", spec.to_json(), "--out", str(out)]
    proc = subprocess.run(cmd, env=_job_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)
    if proc.returncode != 0 or not out.exists():
        tail = "\n".join(proc.stderr.strip().splitlines()[-25:])
        raise RuntimeError(f"the {ranks}-rank commit job failed (exit {proc.returncode}):\n"
                           f"{tail}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def measure_commit(
    table: str,
    root: str | Path,
    *,
    ranks: int = 1,
    ledger: LedgerKind = "delta",
    saves: int = 50,
    warmup: int = 2,
    steps_between: int = 10,
    batch_size: int = 64,
    workers: int = 2,
    pg_uri: str | None = None,
    timeout: float = 900.0,
) -> CommitResult:
    """Run one commit job: in this process for one rank, under ``torchrun`` (gloo) otherwise.

    ``root`` gets a fresh checkpoint root of the job, removed afterwards, as is the job's
    namespace in a PostgreSQL catalog.

    Raises:
        RuntimeError: the multi-rank job failed (its stderr is in the message).
    """
    job_root = Path(root) / f"commit-{ledger}-{ranks}-{uuid.uuid4().hex[:8]}"
    job_root.mkdir(parents=True)
    spec = CommitJobSpec(table=table, root=str(job_root), ledger=ledger, saves=saves,
                         warmup=warmup, steps_between=steps_between, batch_size=batch_size,
                         workers=workers, pg_uri=pg_uri,
                         namespace=f"lakeckpt_bench_{uuid.uuid4().hex[:10]}")
    t0 = clock()
    try:
        if ranks == 1:
            raw = run_commit_job(spec)
            assert raw is not None
        else:
            raw = _torchrun(spec, ranks, timeout)
    finally:
        wall = clock() - t0
        if ledger == "iceberg-postgres":
            drop_iceberg_ledger(spec)
        shutil.rmtree(job_root, ignore_errors=True)

    def ms(key: str) -> tuple[float, ...]:
        return tuple(v * 1e3 for v in raw[key])

    return CommitResult(
        ledger=raw["ledger"], ranks=raw["ranks"], workers=raw["workers"], saves=raw["saves"],
        committed=raw["committed"], commit_ms=ms("commit_s"),
        ledger_commit_ms=ms("ledger_commit_s"), gather_ms=ms("gather_s"),
        broadcast_ms=ms("broadcast_s"), save_ms=ms("save_s"), retire_ms=ms("retire_s"),
        records=tuple(raw["records"]), reader_state_bytes=raw["reader_state_bytes"],
        model_bytes=raw["model_bytes"], ledger_before=raw["before"], ledger_after=raw["after"],
        ledger_compacted=raw["compacted"], live_after_compact=raw["live_after_compact"],
        compact_ms=raw["compact_s"] * 1e3, wall_s=wall)


def postgres_uri() -> tuple[str | None, str]:
    """A reachable PostgreSQL for the Iceberg catalog, or None, and where it was looked for.

    ``LAKECKPT_TEST_PG_URI`` if set, else :data:`DEFAULT_PG_URI`; a server that does not
    answer within 2 s counts as absent.
    """
    uri = os.environ.get("LAKECKPT_TEST_PG_URI") or DEFAULT_PG_URI
    where = uri.split("@", 1)[-1]
    try:
        import sqlalchemy

        engine = sqlalchemy.create_engine(uri, connect_args={"connect_timeout": 2})
        try:
            with engine.connect():
                pass
        finally:
            engine.dispose()
    except Exception as exc:  # no driver, no server, bad credentials: all mean "skip"
        return None, f"{where}: {type(exc).__name__}"
    return uri, where


# ------------------------------------------------------------------------------ report


@dataclass
class CheckpointBenchReport:
    """Everything ``lakeckpt bench checkpoint`` measured."""

    commit: list[CommitResult]
    overhead: OverheadResult
    commit_table: str
    table: SyntheticTable
    skipped: list[str] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types only (lists, not tuples), as ``--json`` prints it."""
        out: dict[str, Any] = json.loads(json.dumps({
            "commit": [c.to_json() for c in self.commit],
            "overhead": self.overhead.to_json(),
            "commit_table": self.commit_table,
            "table": asdict(self.table),
            "skipped": self.skipped,
            "figures": [f.to_json() for f in self.figures],
            "passed": passed(self.figures),
        }))
        return out


def _kb(n: float) -> str:
    return f"{n / 1024:,.1f} KB"


def _commit_figures(results: list[CommitResult]) -> list[Figure]:
    out: list[Figure] = []
    for c in results:
        delta = c.ledger == "delta"
        records = statistics.fmean(c.records) if c.records else 0.0
        out.append(Figure(
            f"ledger commit p50, {c.label}", c.p("commit", 50), "ms",
            f"<= {COMMIT_TARGET_MS:g} ms" if delta else "",
            c.p("commit", 50) <= COMMIT_TARGET_MS if delta else None,
            f"p99 {c.p('commit', 99):.1f} ms; p50 of its parts: gather "
            f"{c.p('gather', 50):.1f}, ledger.commit {c.p('ledger_commit', 50):.1f} (p99 "
            f"{c.p('ledger_commit', 99):.1f}), broadcast {c.p('broadcast', 50):.1f} ms; "
            f"{records:.0f} consumption records/commit from {c.ranks}x{c.workers} "
            f"(rank, worker); {c.saves} saves"))
        n = max(len(c.retire_ms) // 5, 1)
        first, last = (statistics.median(c.retire_ms[:n]), statistics.median(c.retire_ms[-n:]))
        out.append(Figure(
            f"save total p50, {c.label}", c.p("save", 50), "ms", "", None,
            f"p99 {c.p('save', 99):.1f} ms; DCP write of {_kb(c.model_bytes)} + checksums + "
            f"commit + retention scan (p50 {c.p('retire', 50):.1f} ms: {first:.0f} ms over "
            f"the first {n} saves, {last:.0f} ms over the last {n})"))
    return out


def _overhead_figures(o: OverheadResult) -> list[Figure]:
    share = o.tracking_share()
    mean_save = {m: statistics.fmean(o.save_s[m]) * 1e3 for m in MODES[1:]}
    ranges = {m: f"{min(o.overheads(m)):+.1%}..{max(o.overheads(m)):+.1%}" for m in MODES[1:]}
    cpu = {m: f"{o.overhead(m, cpu=True):+.1%}" for m in MODES[1:]}
    return [
        Figure("step time, no checkpoints", o.step_ms, "ms", "", None,
               f"MLP of {o.model_params * 4 / 1e6:.1f} MB + Adam, batch {o.batch_size}, "
               f"{o.workers} loader workers; {o.rounds} rounds x {o.steps} steps per mode"),
        Figure(f"sync save every {o.every} steps: step-time overhead", o.overhead("sync") * 100,
               "%", "", None,
               f"wall, median of {o.rounds} rounds ({ranges['sync']}), CPU {cpu['sync']}; "
               f"save() {mean_save['sync']:.1f} ms mean, {_kb(o.checkpoint_bytes)} of DCP "
               f"files; +{o.cost_per_save_ms('sync'):.0f} ms per save = "
               f"{o.overhead_at('sync'):.2%} at every {TRACKING_INTERVAL} steps"),
        Figure(f"async save every {o.every} steps: step-time overhead",
               o.overhead("async") * 100, "%", "", None,
               f"wall, median of {o.rounds} rounds ({ranges['async']}), CPU {cpu['async']}; "
               f"save() blocks "
               f"{mean_save['async']:.1f} ms mean (commit of the previous save + staging), "
               f"wait() {statistics.fmean(o.wait_s) * 1e3:.1f} ms; "
               f"+{o.cost_per_save_ms('async'):.0f} ms per save = "
               f"{o.overhead_at('async'):.2%} at every {TRACKING_INTERVAL} steps"),
        Figure(f"reader tracking at a checkpoint every {TRACKING_INTERVAL} steps", share * 100,
               "%", f"< {TRACKING_TARGET:.1%}", share < TRACKING_TARGET,
               f"reader state capture + consumption {o.capture_ms:.2f} ms per checkpoint "
               f"(median of {len(o.capture_s)}); {o.tracking_share(o.every):.2%} at every "
               f"{o.every} steps"),
    ]


def _bytes_figures(results: list[CommitResult]) -> list[Figure]:
    out: list[Figure] = []
    for c in results:
        if c.ledger == "iceberg-postgres":
            continue  # the same files as SQLite; the catalog's rows live in the server
        grown = c.bytes_per_checkpoint()
        kind = "log" if c.ledger == "delta" else "metadata"
        note = (f"data {_kb(c.bytes_per_checkpoint('data_bytes'))} + {kind} "
                f"{_kb(c.bytes_per_checkpoint('log_bytes'))}, "
                f"{c.bytes_per_checkpoint('files'):.1f} files; reader state "
                f"{_kb(c.reader_state_bytes)}; over {c.committed} checkpoints. After compact() "
                f"({c.compact_ms:.0f} ms): {_kb(c.bytes_per_checkpoint(stage='compacted'))} "
                f"on disk")
        if c.live_after_compact is not None:
            live = (c.live_after_compact - c.ledger_before["bytes"]) / c.committed
            note += (f", {_kb(live)} live (replaced files stay until VACUUM); "
                     f"{c.ledger_after['data_files']} -> "
                     f"{c.ledger_compacted['data_files']} data files on disk")
        else:
            note += " (replaced files and expired metadata stay until orphan removal)"
        out.append(Figure(f"ledger bytes per checkpoint, {c.label}", grown / 1024, "KB", "",
                          None, note))
    return out


def run_checkpoint_bench(
    *,
    quick: bool = False,
    root: str | Path | None = None,
    ranks: Sequence[int] | None = None,
    pg: bool = True,
    progress: Progress = quiet,
) -> CheckpointBenchReport:
    """Measure every checkpoint figure (see the module docstring).

    Args:
        quick: a smoke run of ~30 s: 1 and 2 ranks, 8 saves each, 3 short overhead rounds.
        root: directory that keeps the source tables for later runs; a temporary one if None.
        ranks: rank counts of the Delta commit jobs (default 1, 4, 8; quick 1, 2).
        pg: also measure an Iceberg ledger on PostgreSQL when a server answers.
        progress: called with a line of text as measurements come in.
    """
    with scratch(root, "lakeckpt-bench-") as path:
        return _run(quick, path, ranks, pg, progress)


def _run(quick: bool, root: Path, ranks: Sequence[int] | None, pg: bool,
         progress: Progress) -> CheckpointBenchReport:
    rank_counts = tuple(ranks) if ranks is not None else ((1, 2) if quick else (1, 4, 8))
    saves = 8 if quick else 50
    t0 = clock()
    commit_table = ensure_commit_table(root)
    synthetic = ensure_synthetic_table(root, 200_000 if quick else 1_000_000)
    progress(f"tables ready in {clock() - t0:.1f} s: {commit_table}, {synthetic.uri}")
    work = Path(tempfile.mkdtemp(prefix="ckpt-", dir=root))
    try:
        jobs: list[tuple[int, LedgerKind, str | None]] = [(n, "delta", None)
                                                          for n in rank_counts]
        jobs.append((1, "iceberg-sqlite", None))
        skipped: list[str] = []
        if pg:
            uri, where = postgres_uri()
            if uri is None:
                skipped.append(f"iceberg (PostgreSQL): no server answered at {where}; set "
                               "LAKECKPT_TEST_PG_URI or run scripts/postgres.sh")
            else:
                jobs.append((1, "iceberg-postgres", uri))
        results = []
        for n, kind, uri in jobs:
            result = measure_commit(commit_table, work, ranks=n, ledger=kind, saves=saves,
                                    pg_uri=uri)
            progress(f"commit {result.label}: p50 {result.p('commit', 50):.1f} ms, save p50 "
                     f"{result.p('save', 50):.1f} ms ({result.wall_s:.1f} s)")
            results.append(result)
        overhead = measure_overhead(synthetic.uri, work,
                                    steps=40 if quick else 100, every=20 if quick else 50,
                                    rounds=3 if quick else 10,
                                    capture_repeats=10 if quick else 30, progress=progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return build_report(results, overhead, commit_table, synthetic, skipped)


def build_report(commit: list[CommitResult], overhead: OverheadResult, commit_table: str,
                 table: SyntheticTable, skipped: Sequence[str] = ()) -> CheckpointBenchReport:
    """The report of measurements made, with its figures and their targets."""
    report = CheckpointBenchReport(commit, overhead, commit_table, table, list(skipped))
    report.figures = [*_commit_figures(commit), *_overhead_figures(overhead),
                      *_bytes_figures(commit)]
    return report


def format_report(report: CheckpointBenchReport) -> str:
    """The figures as a plain-text table, like ``lakeckpt bench read``."""
    lines = figure_lines(report.figures)
    lines.append("")
    for line in report.skipped:
        lines.append(f"skipped: {line}")
    verdict = "all targets met" if report.to_json()["passed"] else "some targets MISSED"
    lines.append(f"local disk, {machine_note()}; {verdict}")
    return "\n".join(lines)
