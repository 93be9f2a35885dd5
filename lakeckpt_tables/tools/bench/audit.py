"""``lakeckpt bench audit``: progress, verify, maintain and commit latency on a ledger at scale.

DESIGN.md's figure: a ledger of 100,000 checkpoints with 64 consumption records each; issue 23
item 3's: 10^4 checkpoints x 100 records (``--records 1000000 --per-checkpoint 100``) on the
Delta and the Iceberg ledger. After ``lakeckpt maintain``, ``progress`` answers in < 1 s,
``verify`` of one run in < 10 s, ``maintain`` stays under 1 GB, and a commit stays <= 100 ms
p50.

The ledger is written through the ledger's own rows and files (checksummed rows, the backend's
data files and commits), many checkpoints per commit: committing 10^4 checkpoints one by one
would take many minutes. Before ``maintain`` it holds one file per ``--batch`` checkpoints, as
a run between two maintains would. The three commands run as the CLI in a child process each,
whose wall time, CPU time and peak memory are reported.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["AuditReport", "Command", "format_report", "run_audit_bench"]

DEFAULT_CHECKPOINTS = 100_000
QUICK_CHECKPOINTS = 2_000
RECORDS = 64  # 8 ranks x 8 workers
RUNS = 10
BATCH = 100
"""Checkpoints per commit while the ledger is built."""
LEDGERS = ("delta", "iceberg")


@dataclass
class Command:
    """One CLI command run in a child process."""

    argv: list[str]
    wall_s: float
    cpu_s: float
    peak_mb: float


@dataclass
class AuditReport:
    checkpoints: int
    records: int
    ledger_rows: int
    build_s: float
    maintain_s: float
    progress_s: float
    verify_s: float
    commit_p50_ms: float
    progress_cpu_s: float = 0.0
    """CPU seconds of the progress query (this process): what wall time would be on an idle
    machine; the wall figures rise with the load of a shared machine."""
    verify_cpu_s: float = 0.0
    load: float = 0.0
    """The machine's 1-minute load average when the figures were taken."""
    ledger: str = "delta"
    files_before: int = 0
    """Data files of the ledger before maintain (one per commit)."""
    commands: dict[str, Command] = field(default_factory=dict)
    """``progress_before`` (before maintain), ``maintain``, ``progress``, ``verify``: the CLI in
    a child process (its start-up included)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.__dict__)
        out["commands"] = {k: dict(v.__dict__) for k, v in self.commands.items()}
        out["passed"] = (self.progress_s < 1.0 and self.verify_s < 10.0
                         and self.commit_p50_ms <= 100.0 and self._maintain_mb() <= 1024)
        # on a shared machine wall time is mostly waiting for a core: CPU time is what the
        # same run takes on an idle one (a single-threaded query; DuckDB's threads only help)
        out["passed_cpu"] = (self.progress_cpu_s < 1.0 and self.verify_cpu_s < 10.0
                             and self.commit_p50_ms <= 100.0 and self._maintain_mb() <= 1024)
        return out

    def _maintain_mb(self) -> float:
        maintain = self.commands.get("maintain")
        return maintain.peak_mb if maintain is not None else 0.0


def run_audit_bench(*, checkpoints: int = DEFAULT_CHECKPOINTS, records: int = RECORDS,
                    ledger: str = "delta", batch: int = BATCH, root: str | None = None,
                    cli: bool = True, commits: int = 20,
                    progress: Callable[[str], None] = lambda _: None) -> AuditReport:
    """Build the ledger, maintain it, time progress, verify and commits.

    Args:
        checkpoints: checkpoints in the ledger, over :data:`RUNS` runs.
        records: consumption records per checkpoint.
        ledger: ``delta`` or ``iceberg`` (a SQLite catalog beside the warehouse).
        batch: checkpoints per commit while building.
        root: where to build (default: a temporary directory, removed afterwards).
        cli: also run ``progress``, ``maintain`` and ``verify`` as the CLI in child processes.
        commits: checkpoints committed one by one at the end, for the commit latency.
    """
    if ledger not in LEDGERS:
        raise ValueError(f"ledger must be one of {LEDGERS}, got {ledger!r}")
    with tempfile.TemporaryDirectory(prefix="lakeckpt-bench-audit-") as tmp:
        where = Path(root or tmp) / f"ledger-{ledger}-{checkpoints}x{records}"
        target, catalog, opened = _ledger(ledger, where)
        started = time.perf_counter()
        rows = _build(opened, checkpoints, records, batch, progress)
        build_s = time.perf_counter() - started
        progress(f"built {rows:,} ledger rows in {build_s:.1f} s")
        commands: dict[str, Command] = {}
        base = [target] + (["--catalog", catalog] if catalog else [])
        if cli:
            commands["progress_before"] = _cli(["progress", *base, "--output", "json"])
            progress(f"progress before maintain: {_said(commands['progress_before'])}")
            commands["maintain"] = _cli(["maintain", *base])
            progress(f"maintain: {_said(commands['maintain'])}")
            maintain_s = commands["maintain"].wall_s
            opened = _ledger(ledger, where)[2]
        else:
            started = time.perf_counter()
            opened.compact()
            maintain_s = time.perf_counter() - started
            progress(f"maintain: {maintain_s:.1f} s")
        from lakeckpt_tables.audit.registry import load_catalog as opened_catalog
        from lakeckpt_tables.audit.views import connect

        started, cpu = time.perf_counter(), time.process_time()
        con = connect(target, catalog=opened_catalog(catalog))
        answer = con.sql("SELECT * FROM progress").to_arrow_table()
        progress_s = time.perf_counter() - started
        progress_cpu = time.process_time() - cpu
        consumed = sum(answer["rows_consumed"].to_pylist())
        progress(f"progress: {progress_s:.2f} s ({progress_cpu:.2f} s CPU), "
                 f"{answer.num_rows} passes, {consumed:,} rows consumed")
        from lakeckpt_tables.audit.exactly_once import verify

        started, cpu = time.perf_counter(), time.process_time()
        (verdict,) = verify(target, run="run-0", catalog=opened_catalog(catalog))
        verify_s = time.perf_counter() - started
        verify_cpu = time.process_time() - cpu
        progress(f"verify run-0 ({verdict.records:,} records): {verify_s:.2f} s "
                 f"({verify_cpu:.2f} s CPU), ok={verdict.ok}")
        if not verdict.ok:
            raise AssertionError(f"the bench ledger fails verify: {verdict.violations[:3]}")
        if cli:
            commands["progress"] = _cli(["progress", *base, "--output", "json"])
            progress(f"progress (CLI): {_said(commands['progress'])}")
            commands["verify"] = _cli(["verify", *base, "--run", "run-0", "--output", "json"])
            progress(f"verify run-0 (CLI): {_said(commands['verify'])}")
        latencies = _commit_latencies(opened, checkpoints // RUNS, records, commits)
        p50 = statistics.median(latencies) * 1000
        progress(f"commit p50: {p50:.1f} ms")
    return AuditReport(checkpoints, records, rows, build_s, maintain_s, progress_s, verify_s,
                       p50, progress_cpu, verify_cpu, os.getloadavg()[0], ledger,
                       -(-checkpoints // RUNS // batch) * RUNS, commands)


def _ledger(kind: str, where: Path) -> tuple[str, str | None, Any]:
    """The ledger's CLI target, its catalog URI (Iceberg) and the ledger, created if absent."""
    if kind == "delta":
        from lakeckpt_tables.ledger import DeltaLedger

        return f"delta:{where}", None, DeltaLedger(str(where))
    from pyiceberg.catalog.sql import SqlCatalog

    from lakeckpt_tables.ledger.iceberg import IcebergLedger

    (where / "warehouse").mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{where}/catalog.db"
    catalog = SqlCatalog("lakeckpt", uri=uri, warehouse=(where / "warehouse").as_uri())
    return "iceberg:bench.ledger", uri, IcebergLedger("bench.ledger", catalog=catalog)


def _build(ledger: Any, checkpoints: int, records: int, batch: int,
           progress: Callable[[str], None]) -> int:
    """Commit ``checkpoints`` checkpoints over :data:`RUNS` runs, ``batch`` per commit.

    The rows are the ledger's own (:func:`~lakeckpt_tables.ledger.records.commit_rows`,
    checksummed), written and committed by the backend's two phases, the last checkpoint of a
    batch named in its commit (Delta's app transaction, Iceberg's snapshot summary) as a
    commit of that checkpoint would.
    """
    import pyarrow as pa

    from lakeckpt_tables.ledger.records import commit_rows

    per_run = checkpoints // RUNS
    total = 0
    for run in range(RUNS):
        run_id = f"run-{run}"
        for first in range(1, per_run + 1, batch):
            steps = range(first, min(first + batch, per_run + 1))
            made = [_checkpoint(run_id, step, records) for step in steps]
            rows = pa.concat_tables([commit_rows(c, cons, ()) for c, cons in made])
            prepared = ledger._prepare(rows)
            ledger._refresh()
            if not ledger._publish(prepared, run_id=run_id, checkpoint=made[-1][0]):
                raise RuntimeError(f"the bench's commit of {run_id} steps {first}.. lost a race")
            total += rows.num_rows
        progress(f"{run_id}: {per_run:,} checkpoints written")
    return total


def _checkpoint(run_id: str, step: int, records: int) -> tuple[Any, list[Any]]:
    """A checkpoint and its consumption: every (rank, worker) read 16 rows of its own row group
    since the previous checkpoint, contiguously, so the ranges tile without overlap."""
    from lakeckpt_tables.ledger import CheckpointRecord, ConsumptionRecord

    record = CheckpointRecord(
        run_id=run_id, checkpoint_id=f"{run_id}-{step}", step=step,
        parent_id=None if step == 1 else f"{run_id}-{step - 1}",
        model_location=f"{run_id}/step-{step}", manifest={}, reader_state="", source=None,
        source_version=None, world_size=max(1, records // 8), tags=(), config_hash="bench",
        wall_time_s=float(step), committed_at=datetime.now(UTC))
    consumption = [ConsumptionRecord(g // 8, g % 8, 0, 0, f"s3://bucket/table/part-{g:05d}."
                                     "parquet", 0, (step - 1) * 16, step * 16)
                   for g in range(records)]
    return record, consumption


_MEASURE = """
import json, resource, subprocess, sys
done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps([done.returncode, done.stderr.decode(errors="replace"),
                  usage.ru_utime + usage.ru_stime, usage.ru_maxrss]))
"""
"""Runs a command and reports its exit status, errors, CPU time and peak memory. The command
is started from this small process: a child forked from the bench process would count the
bench's own memory in its peak (Linux keeps the high-water mark across fork and exec)."""


def _cli(argv: list[str]) -> Command:
    """Run ``lakeckpt ARGV`` in a child process: its wall time, CPU time and peak memory."""
    command = [sys.executable, "-c", _MEASURE, sys.executable, "-m", "lakeckpt_tables.cli",
               *argv]
    started = time.perf_counter()
    out = subprocess.run(command, capture_output=True, check=True, text=True).stdout
    wall = time.perf_counter() - started
    status, errors, cpu, peak_kb = json.loads(out)
    if status != 0:
        raise RuntimeError(f"lakeckpt {' '.join(argv)} exited {status}: {errors}")
    return Command(argv, wall, cpu, peak_kb / 1024)  # ru_maxrss is in kilobytes on Linux


def _said(command: Command) -> str:
    return f"{command.wall_s:.2f} s ({command.cpu_s:.2f} s CPU), peak {command.peak_mb:.0f} MB"


def _commit_latencies(ledger: Any, last_step: int, records: int,
                      count: int) -> list[float]:
    out = []
    for i in range(count):
        record, consumption = _checkpoint("run-0", last_step + 1 + i, records)
        started = time.perf_counter()
        ledger.commit(record, consumption)
        out.append(time.perf_counter() - started)
    return out


def format_report(report: AuditReport) -> str:
    r = report.to_json()
    lines = [
        f"audit at scale ({report.ledger} ledger): {report.checkpoints:,} checkpoints x "
        f"{report.records} records ({report.ledger_rows:,} ledger rows; "
        f"{report.files_before:,} files before maintain)",
        f"  maintain (compact)       {report.maintain_s:8.2f} s",
        f"  progress (connect+query) {report.progress_s:8.2f} s   target < 1 s "
        f"({report.progress_cpu_s:.2f} s CPU)",
        f"  verify one run           {report.verify_s:8.2f} s   target < 10 s "
        f"({report.verify_cpu_s:.2f} s CPU)",
        f"  commit p50               {report.commit_p50_ms:8.1f} ms  target <= 100 ms",
    ]
    for name, command in report.commands.items():
        lines.append(f"  CLI {name:20} {command.wall_s:8.2f} s   {command.cpu_s:.2f} s CPU, "
                     f"peak {command.peak_mb:,.0f} MB")
    lines.append(f"{'PASSED' if r['passed'] else 'NOT MET'} on wall time (load average "
                 f"{report.load:.1f} on {os.cpu_count()} cores); "
                 f"{'PASSED' if r['passed_cpu'] else 'NOT MET'} on CPU time")
    return "\n".join(lines)
