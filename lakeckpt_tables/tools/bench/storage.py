"""``lakeckpt bench read --uri s3://|az://|gs://...``: the reader on an object store, against
pyarrow.dataset.

Figures (issue "tables and checkpoints on object storage"):

1. Requests per row group read: GET requests on data files during a pass, divided by the row
   groups read (target <= 2: pyarrow's pre-buffering coalesces a row group's columns), and
   metadata requests (HEAD; GCS: a JSON-API object GET) per data file. Counted by the server
   when it is a local test server (``python -m lakeckpt_tables.tools.s3server``, or
   ``python -m lakeckpt_tables.tools.emulators azure|gcs``), which counts every request.
2. Footers: read once per file per process (a second source over the same table reads none).
3. Throughput: rows/s of a ``LakeDataset`` pass (in process, batches of torch tensors) as a
   ratio to a ``pyarrow.dataset`` scan of the same files and columns through the same
   filesystem, each converted to torch; passes interleaved, the median ratio (target >= 0.9).
4. With ``--latency-ms``: the reader's throughput with that latency injected per request by
   the local server, as a ratio to the figure without, and the data requests in flight
   during that pass (mean and peak, from the server's request spans).

Every figure is the median of paired rounds: each round runs the reader, pyarrow.dataset and
(with ``--latency-ms``) the reader with latency back to back, and its ratios compare passes of
that round only, so load that comes and goes on a shared machine shifts both sides of a ratio
alike. Passes of a 2 M row table take seconds; ratios of a single pass vary 2x under load.

A missing table at ``--uri`` is created (a synthetic Delta table) first, and on a local
server its bucket or container.
"""

from __future__ import annotations

import json
import statistics
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import torch

from lakeckpt_tables.io import Storage, s3_settings
from lakeckpt_tables.io.options import (
    AZURE_SCHEMES,
    GCS_SCHEMES,
    S3_SCHEMES,
    azure_settings,
    gcs_settings,
    without_own,
)
from lakeckpt_tables.reader.dataset import LakeDataset
from lakeckpt_tables.sources import footers
from lakeckpt_tables.sources.delta import DeltaSource

__all__ = ["StoreReadReport", "format_report", "run_store_read_bench"]

COLUMNS = ["id", "x"]
BATCH = 4096
ROW_GROUP_ROWS = 16_384
VECTOR = 32


@dataclass
class StoreReadReport:
    """What ``lakeckpt bench read --uri`` measured."""

    uri: str
    rows: int
    files: int
    row_groups: int
    requests_per_row_group: float | None
    heads_per_file: float | None
    footer_reads_first: int
    footer_reads_again: int
    reader_rows_per_s: float
    dataset_rows_per_s: float
    ratio: float
    latency_ms: int = 0
    latency_ratio: float | None = None
    ratios: list[float] = field(default_factory=list)
    latency_ratios: list[float] = field(default_factory=list)
    in_flight_mean: float | None = None
    in_flight_peak: int | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["passed"] = bool(
            (self.requests_per_row_group is None or self.requests_per_row_group <= 2)
            and self.footer_reads_first == self.files and self.footer_reads_again == 0
            and self.ratio >= 0.9
            and (self.latency_ratio is None or self.latency_ratio >= 0.8))
        return out


def _server(storage: Storage, options: dict[str, str]) -> str | None:
    """The endpoint, when it is the local server that counts requests (the S3 server, or an
    emulator behind its front: ``python -m lakeckpt_tables.tools.emulators``)."""
    if storage.scheme in S3_SCHEMES:
        endpoint = s3_settings(options)["endpoint"]
    elif storage.scheme in AZURE_SCHEMES:
        endpoint = azure_settings(without_own(options), storage.uri)["endpoint"]
    elif storage.scheme in GCS_SCHEMES:
        endpoint = gcs_settings(without_own(options))["endpoint"]
    else:
        return None
    parsed = urlparse(endpoint)
    endpoint = f"{parsed.scheme}://{parsed.netloc}"  # Azurite's has the account in its path
    try:
        with urllib.request.urlopen(f"{endpoint}/_lakeckpt/requests", timeout=5):
            return endpoint
    except OSError:
        return None


def _metadata(request: list[str]) -> bool:
    """Whether a request asks for a file's metadata: a HEAD, or GCS's JSON-API object GET."""
    return request[0] == "HEAD" or request[1].startswith("/storage/v1/")


def _control(endpoint: str, what: str, method: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{endpoint}/_lakeckpt/{what}", data=data, method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _ensure_table(uri: str, storage: Storage, rows: int, local_server: bool) -> None:
    from deltalake import WriterProperties, write_deltalake

    bucket = storage.fs_path("").split("/", 1)[0]
    if storage.scheme in S3_SCHEMES and storage.has_options:
        _create_bucket(storage, bucket)
    elif local_server and storage.fsspec_client() is not None:  # the emulator's: the bench's
        client = storage.fsspec_client()
        if not client.exists(bucket):
            client.mkdir(bucket)
    if storage.exists("_delta_log"):
        return
    props = WriterProperties(max_row_group_size=ROW_GROUP_ROWS)
    per_file = max(rows // 4, 1)
    for start in range(0, rows, per_file):
        ids = np.arange(start, min(start + per_file, rows), dtype=np.int64)
        x = np.random.default_rng(start).random((len(ids), VECTOR), dtype=np.float32)
        table = pa.table({"id": ids, "x": pa.FixedSizeListArray.from_arrays(
            pa.array(x.ravel()), VECTOR)})
        write_deltalake(uri, table, mode="append", writer_properties=props,
                        storage_options=storage.delta_options())


def _create_bucket(storage: Storage, bucket: str) -> None:
    import pyarrow.fs as pafs

    from lakeckpt_tables.io.filesystems import arrow_s3 as _arrow_s3

    assert storage._options is not None
    fs = _arrow_s3(s3_settings(storage._options), allow_bucket_creation=True)
    if fs.get_file_info(bucket).type == pafs.FileType.NotFound:
        fs.create_dir(bucket)


def _reader_pass(uri: str, options: dict[str, str] | None) -> tuple[int, float]:
    dataset = LakeDataset(DeltaSource(uri, storage_options=options), columns=COLUMNS,
                          batch_size=BATCH, shuffle=False)
    started = time.perf_counter()
    rows = 0
    for batch in dataset:
        rows += len(batch["id"])
    return rows, time.perf_counter() - started


def _dataset_pass(paths: list[str], storage: Storage) -> tuple[int, float]:
    started = time.perf_counter()
    files = [storage.fs_path(p) for p in paths]
    scan = pads.dataset(files, format="parquet", filesystem=storage.filesystem)
    rows = 0
    for batch in scan.to_batches(columns=COLUMNS, batch_size=BATCH):
        ids = torch.from_numpy(batch.column(0).to_numpy())
        vec = batch.column(1)
        torch.from_numpy(vec.flatten().to_numpy().reshape(len(vec), -1))
        rows += len(ids)
    return rows, time.perf_counter() - started


def run_store_read_bench(uri: str, options: dict[str, str] | None, *, rows: int = 400_000,
                         rounds: int = 3, latency_ms: int = 0,
                         progress: Callable[[str], None] = lambda _: None) -> StoreReadReport:
    """Measure the figures of the module docstring on the table at ``uri``."""
    storage = Storage(uri, options)
    endpoint = _server(storage, options or {})
    _ensure_table(uri, storage, rows, endpoint is not None)
    reads_before = footers.footer_reads()
    snapshot = DeltaSource(uri, storage_options=options).snapshot()
    first = footers.footer_reads() - reads_before
    paths = sorted({u.path for u in snapshot.units})
    progress(f"{len(paths)} files, {len(snapshot.units)} row groups, {snapshot.rows:,} rows")

    if endpoint:
        _control(endpoint, "requests", "DELETE")
    _reader_pass(uri, options)
    per_row_group = heads = None
    if endpoint:
        seen = _control(endpoint, "requests", "GET")["requests"]
        data = [r for r in seen if r[1].endswith(".parquet")]
        per_row_group = sum(r[0] == "GET" and not _metadata(r) for r in data) / len(
            snapshot.units)
        heads = sum(_metadata(r) for r in data) / len(paths)
        progress(f"{per_row_group:.2f} GET per row group read, {heads:.2f} HEAD per file")
    again = footers.footer_reads()
    DeltaSource(uri, storage_options=options).snapshot()
    again = footers.footer_reads() - again

    ratios, reader_rates, dataset_rates, slow_ratios = [], [], [], []
    flights: list[tuple[float, int]] = []
    for i in range(rounds):
        n, reader_s = _reader_pass(uri, options)
        m, dataset_s = _dataset_pass(paths, storage)
        assert n == m == snapshot.rows, (n, m, snapshot.rows)
        reader_rates.append(n / reader_s)
        dataset_rates.append(m / dataset_s)
        ratios.append(dataset_s / reader_s)
        line = (f"round {i + 1}: reader {n / reader_s:,.0f} rows/s, pyarrow.dataset "
                f"{m / dataset_s:,.0f} rows/s, ratio {dataset_s / reader_s:.2f}")
        if latency_ms and endpoint:
            slow_s, flight = _slow_pass(uri, options, endpoint, latency_ms, snapshot.rows)
            slow_ratios.append(reader_s / slow_s)
            flights.append(flight)
            line += (f"; with {latency_ms} ms per request {n / slow_s:,.0f} rows/s, "
                     f"{reader_s / slow_s:.2f}x, {flight[0]:.1f} requests in flight "
                     f"(peak {flight[1]})")
        progress(line)
    latency_ratio = statistics.median(slow_ratios) if slow_ratios else None
    return StoreReadReport(
        uri=uri, rows=snapshot.rows, files=len(paths), row_groups=len(snapshot.units),
        requests_per_row_group=per_row_group, heads_per_file=heads, footer_reads_first=first,
        footer_reads_again=again, reader_rows_per_s=statistics.median(reader_rates),
        dataset_rows_per_s=statistics.median(dataset_rates), ratio=statistics.median(ratios),
        latency_ms=latency_ms, latency_ratio=latency_ratio, ratios=ratios,
        latency_ratios=slow_ratios,
        in_flight_mean=statistics.median(f[0] for f in flights) if flights else None,
        in_flight_peak=max(f[1] for f in flights) if flights else None)


def _slow_pass(uri: str, options: dict[str, str] | None, endpoint: str, latency_ms: int,
               rows: int) -> tuple[float, tuple[float, int]]:
    """A reader pass with ``latency_ms`` injected per request: its seconds, and the data
    requests in flight (mean over the pass, peak)."""
    _control(endpoint, "faults", "PUT", {"latency_ms": latency_ms})
    _control(endpoint, "requests", "DELETE")
    try:
        n, slow_s = _reader_pass(uri, options)
    finally:
        _control(endpoint, "faults", "PUT", {})
    assert n == rows, (n, rows)
    log = _control(endpoint, "requests", "GET")
    spans = [span for span, (_, path, _) in zip(log["spans"], log["requests"], strict=True)
             if path.endswith(".parquet") and span[1] >= 0]
    busy = sum(end - begin for begin, end in spans)
    return slow_s, (busy / slow_s, int(log["peak"]))


def format_report(report: StoreReadReport) -> str:
    """The report as text, one figure per line with its target."""
    def fmt(value: float | None, spec: str) -> str:
        return "not counted (the server does not count requests)" if value is None \
            else format(value, spec)

    lines = [
        f"object store read: {report.uri} ({report.rows:,} rows, {report.files} files, "
        f"{report.row_groups} row groups)",
        f"  requests per row group read  {fmt(report.requests_per_row_group, '.2f')}"
        "   (target <= 2)",
        f"  HEAD requests per data file  {fmt(report.heads_per_file, '.2f')}",
        f"  footer reads                 {report.footer_reads_first} for {report.files} "
        f"files, {report.footer_reads_again} by a second source   (target: once per file)",
        f"  reader                       {report.reader_rows_per_s:,.0f} rows/s",
        f"  pyarrow.dataset              {report.dataset_rows_per_s:,.0f} rows/s",
        f"  ratio                        {report.ratio:.2f}x   (target >= 0.9)",
    ]
    if report.latency_ratio is not None:
        lines.append(f"  with {report.latency_ms} ms/request       {report.latency_ratio:.2f}x "
                     "of the figure without   (target >= 0.8)")
        lines.append(f"  requests in flight then      {report.in_flight_mean:.1f} on average, "
                     f"{report.in_flight_peak} at most")
    lines.append(f"  median of {len(report.ratios)} paired rounds; ratios of each round: "
                 + ", ".join(f"{r:.2f}" for r in report.ratios)
                 + ("" if not report.latency_ratios else "; with latency: "
                    + ", ".join(f"{r:.2f}" for r in report.latency_ratios)))
    lines.append("PASSED" if report.to_json()["passed"] else "FAILED")
    return "\n".join(lines)
