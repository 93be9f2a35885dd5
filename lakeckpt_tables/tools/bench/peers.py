"""``lakeckpt bench peers``: the library beside the loops users would otherwise write.

One token table (``id`` int64, ``tokens`` list<int32> of 8-64 tokens) is read, in one run, by:

- ``raw``: a plain pyarrow loop (row groups, batches cut in place, columns handed to torch
  zero-copy, token lists as values + offsets), no DataLoader: the decode limit;
- ``plain``: torchdata's ``StatefulDataLoader`` over a plain ``IterableDataset`` doing that same
  read: the ceiling for any dataset under that loader (per-batch hand-off included);
- ``library``: the same loader over :class:`~lakeckpt_tables.LakeDataset` (shuffle off, so the
  rows read are the same);
- ``chunked``: :class:`~lakeckpt_tables.ChunkedLoader` over the same dataset, at each worker
  count above 0 (workers convert, hand over shared-memory chunks; batches cut in this process);
- ``hf``: Hugging Face ``datasets`` streaming the same Parquet files under the same loader
  (installed through the ``bench`` extra; reported as skipped when absent).

Each loader runs at 0 and 2 DataLoader workers. Then a grid across batch sizes
(``bench/workers.py``): the library at 0 workers, at 2 workers one batch per hand-off
(``StatefulDataLoader``) and 2 workers in chunks, beside the raw loop. Resume: time to the first
batch after resuming at 0, 50 and 90% of a pass, for the library (a seek), a naive skip-ahead
resume (read and drop the rows already delivered: what a loader without positions does) and
``hf``.

NOTE [ fair rounds ]
The loaders run one after the other in rounds (raw, plain, library, hf, raw, ...), and each
figure is the median over rounds of rows/s, so a burst of load from elsewhere on a shared
machine lands in one round of one loader, not in one loader's every pass.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from lakeckpt_tables.tools.bench._common import Progress, quiet
from lakeckpt_tables.tools.bench.data import TOKEN_COLUMNS as COLUMNS
from lakeckpt_tables.tools.bench.data import ensure_token_table
from lakeckpt_tables.tools.bench.raw import Batch, raw_batches, units_of
from lakeckpt_tables.tools.bench.workers import LoaderGrid, grid_lines, measure_loader_grid

__all__ = [
    "DEFAULT_ROWS",
    "QUICK_ROWS",
    "PeersReport",
    "PlainParquetDataset",
    "format_peers",
    "run_peers_bench",
]

DEFAULT_ROWS = 2_000_000
QUICK_ROWS = 200_000
BATCH_SIZE = 1024
RESUME_FRACTIONS = (0.0, 0.5, 0.9)
GRID_BATCH_SIZES = (256, 1024, 8192)


# ------------------------------------------------------------------------------ the table


class PlainParquetDataset(IterableDataset[Batch]):
    """A plain ``IterableDataset`` over row groups: each worker takes every n-th row group.

    Its state is the rows it delivered; a resume reads and drops them (naive skip-ahead).
    """

    def __init__(self, files: Sequence[str], batch_size: int) -> None:
        self.units = units_of(files)
        self.batch_size = batch_size
        self.skip = 0
        self.delivered = 0

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        units = self.units if info is None else self.units[info.id::info.num_workers]
        self.delivered = self.skip
        for batch in raw_batches(units, COLUMNS, self.batch_size, skip=self.skip):
            self.delivered += len(batch["id"])
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"delivered": self.delivered}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.skip = int(state["delivered"])


def _hf_collate(rows: list[dict[str, Any]]) -> Batch:
    """A batch of HF rows as the same tensors the others produce (values + offsets)."""
    lengths = np.fromiter((len(r["tokens"]) for r in rows), np.int64, len(rows))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = np.fromiter(itertools.chain.from_iterable(r["tokens"] for r in rows), np.int32,
                         int(offsets[-1]))
    return {"id": torch.tensor([r["id"] for r in rows], dtype=torch.int64),
            "tokens_values": torch.from_numpy(values),
            "tokens_offsets": torch.from_numpy(offsets)}


def hf_available() -> bool:
    return importlib.util.find_spec("datasets") is not None


def _hf_dataset(files: Sequence[str]) -> Any:
    from datasets import load_dataset

    return load_dataset("parquet", data_files=list(files), streaming=True, split="train")


# ------------------------------------------------------------------------------ loaders


def _loader(dataset: Any, workers: int, **kwargs: Any) -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(dataset, num_workers=workers,
                              multiprocessing_context="fork" if workers else None, **kwargs)


def _library(uri: str, batch_size: int) -> Any:
    from lakeckpt_tables import DeltaSource, LakeDataset

    return LakeDataset(DeltaSource(uri), columns=list(COLUMNS), batch_size=batch_size,
                       shuffle=False)


def _rows(batch: Any) -> int:
    return int(batch["id"].shape[0])


@dataclass
class PeersReport:
    """Rows/s per (peer, workers), resume seconds per (peer, fraction), and ratios."""

    rows: int
    batch_size: int
    rounds: int
    throughput: dict[str, float] = field(default_factory=dict)
    resume_s: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    grid: LoaderGrid | None = None

    def ratio(self, a: str, b: str) -> float | None:
        if a in self.throughput and b in self.throughput and self.throughput[b] > 0:
            return self.throughput[a] / self.throughput[b]
        return None

    def ratios(self) -> dict[str, float | None]:
        return {
            "library/plain, 0 workers": self.ratio("library@0", "plain@0"),
            "library/raw, 0 workers (token column)": self.ratio("library@0", "raw"),
            "library 2 workers / 0 workers": self.ratio("library@2", "library@0"),
            "chunked 2 workers / library 0 workers": self.ratio("chunked@2", "library@0"),
            "plain 2 workers / 0 workers": self.ratio("plain@2", "plain@0"),
            "library/hf, 0 workers": self.ratio("library@0", "hf@0"),
            "library/hf, 2 workers": self.ratio("library@2", "hf@2"),
        }

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "grid": None if self.grid is None else self.grid.to_json(),
                "ratios": self.ratios()}


def _timed_pass(name: str, make: Callable[[], Any], expected: int) -> float:
    """Rows/s of one full pass of the iterable ``make()`` builds (build time included).

    Raises:
        RuntimeError: the pass did not deliver the table's rows: its figure would compare
            different work.
    """
    started = time.perf_counter()
    rows = sum(_rows(b) for b in make())
    elapsed = time.perf_counter() - started
    if rows != expected:
        raise RuntimeError(f"bench peers: {name} delivered {rows} rows of {expected}")
    return rows / elapsed


def _throughput_makers(uri: str, files: Sequence[str], batch: int,
                       workers: Sequence[int]) -> dict[str, Callable[[], Any]]:
    units = units_of(files)
    makers: dict[str, Callable[[], Any]] = {
        "raw": functools.partial(raw_batches, units, COLUMNS, batch)}
    for w in workers:
        makers[f"plain@{w}"] = functools.partial(_plain_loader, files, batch, w)
        makers[f"library@{w}"] = functools.partial(_library_loader, uri, batch, w)
        if w:
            makers[f"chunked@{w}"] = functools.partial(_chunked_loader, uri, batch, w)
        if hf_available():
            makers[f"hf@{w}"] = functools.partial(_hf_loader, files, batch, w)
    return makers


def _plain_loader(files: Sequence[str], batch: int, workers: int) -> Any:
    return _loader(PlainParquetDataset(files, batch), workers, batch_size=None)


def _library_loader(uri: str, batch: int, workers: int) -> Any:
    return _loader(_library(uri, batch), workers, batch_size=None)


def _chunked_loader(uri: str, batch: int, workers: int) -> Any:
    from lakeckpt_tables import ChunkedLoader

    return ChunkedLoader(_library(uri, batch), num_workers=workers)


def _hf_loader(files: Sequence[str], batch: int, workers: int) -> Any:
    return _loader(_hf_dataset(files), workers, batch_size=batch, collate_fn=_hf_collate)


def _state_at(make_loader: Callable[[], Any], batches: int) -> Any:
    loader = make_loader()
    it = iter(loader)
    for _ in range(batches):
        next(it)
    state = loader.state_dict()
    del it
    return state


def _first_batch_s(make_loader: Callable[[], Any], state: Any,
                   load: Callable[[Any, Any], None]) -> float:
    started = time.perf_counter()
    loader = make_loader()
    load(loader, state)
    next(iter(loader))
    return time.perf_counter() - started


def _measure_resume(report: PeersReport, uri: str, files: Sequence[str], rows: int,
                    batch: int, progress: Progress) -> None:
    def load_dataset_state(loader: Any, state: Any) -> None:
        loader.dataset.load_state_dict(state)

    def load_loader_state(loader: Any, state: Any) -> None:
        loader.load_state_dict(state)

    total_batches = rows // batch
    peers: list[tuple[str, Callable[[], Any], Callable[[Any, Any], None], bool]] = [
        ("library", functools.partial(_library_loader, uri, batch, 0), load_loader_state, False),
        ("naive-skip", functools.partial(_plain_loader, files, batch, 0), load_dataset_state,
         True),
    ]
    if hf_available():
        peers.append(("hf", functools.partial(_hf_loader, files, batch, 0), load_loader_state,
                      False))
    for fraction in RESUME_FRACTIONS:
        at = int(total_batches * fraction)
        for name, make, load, naive in peers:
            progress(f"resume {name} at {fraction:.0%}")
            if naive:
                state: Any = {"delivered": at * batch}
            else:
                state = _state_at(make, at)
            report.resume_s[f"{name}@{fraction:.0%}"] = min(
                _first_batch_s(make, state, load) for _ in range(2))


def run_peers_bench(root: str | Path, *, rows: int = DEFAULT_ROWS, batch_size: int = BATCH_SIZE,
                    rounds: int = 3, workers: Sequence[int] = (0, 2),
                    grid_batch_sizes: Sequence[int] = GRID_BATCH_SIZES,
                    progress: Progress = quiet) -> PeersReport:
    """Build (or reuse) the token table under ``root`` and measure every peer side by side,
    then the worker grid across ``grid_batch_sizes`` (none: no grid)."""
    uri, files = ensure_token_table(root, rows)
    report = PeersReport(rows, batch_size, rounds)
    if not hf_available():
        report.skipped["hf"] = "Hugging Face datasets not installed (pip install '.[bench]')"
    makers = _throughput_makers(uri, files, batch_size, workers)
    samples: dict[str, list[float]] = {name: [] for name in makers}
    for r in range(rounds):
        for name, make in makers.items():
            progress(f"round {r + 1}/{rounds}: {name}")
            samples[name].append(_timed_pass(name, make, rows))
    report.throughput = {name: statistics.median(v) for name, v in samples.items()}
    progress("throughput (rows/s): " + ", ".join(f"{name} {value:,.0f}"
                                                  for name, value in report.throughput.items()))
    if grid_batch_sizes:
        report.grid = measure_loader_grid(
            uri, batch_sizes=grid_batch_sizes, workers=workers, rounds=rounds,
            columns=COLUMNS, chunked=True, progress=progress)
    _measure_resume(report, uri, files, rows, batch_size, progress)
    return report


def format_peers(report: PeersReport) -> str:
    """The report as markdown: throughput, ratios, resume times."""
    lines = [f"Token table: {report.rows:,} rows, batch {report.batch_size}, median of "
             f"{report.rounds} rounds", "", "| loader | workers | rows/s |", "|---|---|---|"]
    for name, value in report.throughput.items():
        peer, _, w = name.partition("@")
        lines.append(f"| {peer} | {w or '-'} | {value:,.0f} |")
    lines += ["", "| ratio | value |", "|---|---|"]
    for name, ratio in report.ratios().items():
        lines.append(f"| {name} | {'n/a' if ratio is None else f'{ratio:.2f}x'} |")
    lines += grid_lines(report.grid)
    lines += ["", "| resume: first batch after | seconds |", "|---|---|"]
    for name, seconds in report.resume_s.items():
        lines.append(f"| {name} | {seconds:.3f} |")
    for peer, why in report.skipped.items():
        lines.append(f"\nskipped {peer}: {why}")
    return "\n".join(lines)


def write_json(report: PeersReport, path: str | Path) -> None:
    Path(path).write_text(json.dumps(report.to_json(), indent=2) + "\n")
