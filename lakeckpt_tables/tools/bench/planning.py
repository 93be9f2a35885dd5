"""``lakeckpt bench planning``: pinning a Delta table of many small files (issues 9.8, 23.2).

Pinned with ``units="files"``, a snapshot's units are its files, their row counts from the log:
no footer is read (NOTE [ lazy footers ] in ``sources/lazy.py``). Pinned with row-group units
(the default), every file's Parquet footer is read, on a thread pool, cached per process
(:mod:`lakeckpt_tables.sources.footers`). Figures, per store (local disk, and an object store
with ``--uri`` or the local S3 server with ``--local-s3``, ``--latency-ms`` per request):

1. ``pin``: ``DeltaSource(uri, units="files").snapshot()`` in a process that has read none of
   the footers, and the footers it read (0 when the log has every row count). Target for
   100,000 files: <= 5 s on local disk, <= 30 s on the local S3 server at 20 ms per request;
2. ``pin again``: a second source over the same table in the same process;
3. with ``--row-groups``: the pin with row-group units (every footer read) and the footer
   reads alone (``read_footers`` over the same files, cache cleared).

``pin`` is also given in CPU time (every thread of the process): on shared cores the wall time
stretches with the load, the CPU time much less.

The table (one row group of 10 rows per file; the log's version 1 adds all but the first) is
created under ``--dir`` or at ``--uri`` when absent, and reused when present. The machine's
load average is printed with the figures: on shared cores they vary with it.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from lakeckpt_tables.io import Storage
from lakeckpt_tables.sources import footers
from lakeckpt_tables.sources.delta import DeltaSource
from lakeckpt_tables.tools.s3server import spawn

__all__ = ["PlanningFigure", "PlanningReport", "format_report", "register", "run",
           "run_planning_bench"]

DEFAULT_FILES = 100_000
TARGET_S = 5.0
"""Pin on local disk, seconds."""
TARGET_REMOTE_S = 30.0
"""Pin on an object store (the local S3 server at 20 ms per request), seconds."""
DEFAULT_LATENCY_MS = 20
_ROWS_PER_FILE = 10


@dataclass
class PlanningFigure:
    """Pinning one table on one store."""

    uri: str
    files: int
    pin_s: float
    pin_cpu_s: float
    pin_again_s: float
    footer_reads: int
    target_s: float
    latency_ms: int = 0
    pin_row_groups_s: float | None = None
    footer_reads_row_groups: int | None = None
    footers_s: float | None = None

    @property
    def passed(self) -> bool:
        return self.pin_s <= self.target_s


@dataclass
class PlanningReport:
    """What ``lakeckpt bench planning`` measured."""

    figures: list[PlanningFigure]
    load_average: tuple[float, float, float]
    cpus: int

    def to_json(self) -> dict[str, Any]:
        return {"figures": [asdict(f) | {"passed": f.passed} for f in self.figures],
                "load_average": list(self.load_average), "cpus": self.cpus,
                "passed": all(f.passed for f in self.figures)}


def _parquet(i: int) -> bytes:
    ids = pa.array(range(i * _ROWS_PER_FILE, (i + 1) * _ROWS_PER_FILE), pa.int64())
    out = io.BytesIO()
    pq.write_table(pa.table({"id": ids}), out)
    return out.getvalue()


def ensure_table(uri: str, storage: Storage, files: int,
                 progress: Callable[[str], None] = lambda _: None) -> None:
    """A Delta table of ``files`` one-row-group files at ``uri``, unless one is there."""
    from deltalake import write_deltalake

    if storage.exists("_delta_log/00000000000000000001.json"):
        return
    progress(f"writing {files:,} files to {uri}")
    write_deltalake(uri, pa.table({"id": pa.array(range(_ROWS_PER_FILE), pa.int64())}),
                    storage_options=storage.delta_options())
    now = int(time.time() * 1000)
    stats = json.dumps({"numRecords": _ROWS_PER_FILE, "nullCount": {"id": 0}})

    def write(i: int) -> str:
        name = f"part-{i:05d}-{uuid.uuid4()}.parquet"
        data = _parquet(i)
        storage.put(name, data)
        return json.dumps({"add": {"path": name, "size": len(data), "partitionValues": {},
                                   "modificationTime": now, "dataChange": True,
                                   "stats": stats}})

    with ThreadPoolExecutor(max_workers=16) as pool:
        adds = list(pool.map(write, range(1, files)))
    info = json.dumps({"commitInfo": {"operation": "WRITE", "timestamp": now}})
    storage.put("_delta_log/00000000000000000001.json",
                ("\n".join([info, *adds]) + "\n").encode())


def _pin(uri: str, options: dict[str, str] | None, units: str) -> tuple[Any, float, float, int]:
    """(snapshot, wall s, CPU s, footers read) of a cold pin of ``uri`` with ``units``."""
    footers.forget()
    reads = footers.footer_reads()
    started, cpu = time.perf_counter(), time.process_time()
    snapshot = DeltaSource(uri, storage_options=options, units=units).snapshot()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    return snapshot, wall, cpu, footers.footer_reads() - reads


def measure(uri: str, options: dict[str, str] | None, *, row_groups: bool = False,
            target_s: float = TARGET_S, latency_ms: int = 0) -> PlanningFigure:
    """Time pinning ``uri`` cold with whole-file units and again warm; with ``row_groups``,
    also cold with row-group units and its footer reads alone."""
    snapshot, pin_s, pin_cpu_s, reads = _pin(uri, options, "files")
    started = time.perf_counter()
    DeltaSource(uri, storage_options=options, units="files").snapshot()
    figure = PlanningFigure(uri=uri, files=len({u.path for u in snapshot.units}), pin_s=pin_s,
                            pin_cpu_s=pin_cpu_s, pin_again_s=time.perf_counter() - started,
                            footer_reads=reads, target_s=target_s, latency_ms=latency_ms)
    if row_groups:
        snapshot, figure.pin_row_groups_s, _, figure.footer_reads_row_groups = _pin(
            uri, options, "row_groups")
        files = {u.path: u.file.size_bytes for u in snapshot.units}
        footers.forget()
        started = time.perf_counter()
        footers.read_footers(sorted(files), [files[p] for p in sorted(files)],
                             Storage(uri, options))
        figure.footers_s = time.perf_counter() - started
    return figure


def run_planning_bench(stores: list[tuple[str, dict[str, str] | None]], *,
                       files: int = DEFAULT_FILES, row_groups: bool = False,
                       latency: Callable[[str, int], None] | None = None,
                       latency_ms: int = DEFAULT_LATENCY_MS,
                       progress: Callable[[str], None] = lambda _: None) -> PlanningReport:
    """Build (if absent) and pin a table of ``files`` files on each store ``(uri, options)``;
    ``latency(uri, ms)`` sets a store's latency per request (the local S3 server's), else
    it is what the store has (0 counted)."""
    figures = []
    for uri, options in stores:
        ensure_table(uri, Storage(uri, options), files, progress)
        remote = not Storage(uri, options).is_local
        ms = latency_ms if remote and latency is not None else 0
        if ms and latency is not None:
            latency(uri, ms)
        try:
            figure = measure(uri, options, row_groups=row_groups, latency_ms=ms,
                             target_s=TARGET_REMOTE_S if remote else TARGET_S)
        finally:
            if ms and latency is not None:
                latency(uri, 0)
        progress(f"{uri}: pinned {figure.files:,} files in {figure.pin_s:.2f} s "
                 f"({figure.footer_reads} footers read), again {figure.pin_again_s:.2f} s")
        figures.append(figure)
    return PlanningReport(figures, os.getloadavg(), os.cpu_count() or 1)


def format_report(report: PlanningReport) -> str:
    """The report as text, one store per block, with the target."""
    lines = [f"planning (pinning) a table of many files; load average "
             f"{report.load_average[0]:.1f} on {report.cpus} cores"]
    for f in report.figures:
        latency = f", {f.latency_ms} ms per request" if f.latency_ms else ""
        lines += [
            f"  {f.uri} ({f.files:,} files{latency})",
            f"    pin (whole files)    {f.pin_s:6.2f} s   (target <= {f.target_s:.0f} s; "
            f"{f.footer_reads:,} footers read)",
            f"    pin, CPU time        {f.pin_cpu_s:6.2f} s   (all threads: what a loaded "
            "machine stretches)",
            f"    pin again            {f.pin_again_s:6.2f} s",
        ]
        if f.pin_row_groups_s is not None:
            lines += [
                f"    pin (row groups)     {f.pin_row_groups_s:6.2f} s   "
                f"({f.footer_reads_row_groups:,} footers read)",
                f"    footer reads alone   {f.footers_s or 0:6.2f} s",
            ]
    lines.append("PASSED" if report.to_json()["passed"] else "FAILED")
    return "\n".join(lines)


class _LocalS3:
    """The local S3 test server (``python -m lakeckpt_tables.tools.s3server``) for one run."""

    def __init__(self) -> None:
        self.proc, port = spawn()
        self.options = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret",
                        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                        "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
        endpoint = self.options["AWS_ENDPOINT_URL"]
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/planning", method="PUT"),
                               timeout=10).close()  # moto accepts an unsigned bucket create

    def latency(self, uri: str, ms: int) -> None:
        """Every request of the server waits ``ms`` before its answer (its own URIs only)."""
        if uri.startswith("s3://planning/"):
            body = json.dumps({"latency_ms": ms}).encode()
            request = urllib.request.Request(
                f"{self.options['AWS_ENDPOINT_URL']}/_lakeckpt/faults", data=body, method="PUT")
            urllib.request.urlopen(request, timeout=10).close()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def register(sub: Any) -> None:
    """Add ``planning`` to the ``lakeckpt bench`` subcommands ``sub``."""
    parser = sub.add_parser("planning", help="pin a table of 100,000 files (footer reads)",
                            description=__doc__.split("\n\n")[1] if __doc__ else None)
    parser.add_argument("--files", type=int, default=DEFAULT_FILES,
                        help=f"files of the table (default {DEFAULT_FILES:,})")
    parser.add_argument("--dir", metavar="PATH", default=None,
                        help="keep the local table under PATH and reuse it (default: temporary)")
    parser.add_argument("--uri", default=None,
                        help="also pin the table at this object store URI (created if absent)")
    parser.add_argument("--storage-options", default=None, metavar="JSON",
                        help="storage options for --uri, as a JSON object")
    parser.add_argument("--local-s3", action="store_true",
                        help="also pin it on the local S3 test server (started for the run)")
    parser.add_argument("--latency-ms", type=int, default=DEFAULT_LATENCY_MS,
                        help="latency per request of the local S3 server while pinning "
                        f"(default {DEFAULT_LATENCY_MS})")
    parser.add_argument("--row-groups", action="store_true",
                        help="also pin with row-group units (every footer read)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    """Run ``lakeckpt bench planning``; 0 when every pin meets the target."""
    def progress(line: str) -> None:
        print(f"  {line}", file=sys.stderr, flush=True)

    server = _LocalS3() if args.local_s3 else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            stores: list[tuple[str, dict[str, str] | None]] = [
                (os.path.join(args.dir or tmp, "many"), None)]
            if args.uri:
                options = json.loads(args.storage_options) if args.storage_options else None
                stores.append((args.uri, options))
            if server is not None:
                stores.append(("s3://planning/many", server.options))
            report = run_planning_bench(
                stores, files=args.files, row_groups=args.row_groups, progress=progress,
                latency=server.latency if server is not None else None,
                latency_ms=args.latency_ms)
    finally:
        if server is not None:
            server.stop()
    print(json.dumps(report.to_json(), indent=2) if args.json else format_report(report))
    return 0 if report.to_json()["passed"] else 1
