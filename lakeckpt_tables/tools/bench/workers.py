"""``lakeckpt bench workers``: what DataLoader workers cost and gain, per batch, on this machine.

For each batch size, rounds of whole passes, one after the other (the order rotating between
rounds; NOTE [ fair rounds ] in :mod:`.peers`): the raw pyarrow read in this process, the
library under ``StatefulDataLoader`` (shuffle off) at each worker count, and
:class:`~lakeckpt_tables.ChunkedLoader` at each worker count above 0. Figures are wall-clock
rows/s of whole passes, worker start-up included (a chunked loader's first batch waits for a
whole chunk: timing from the first batch would credit it rows decoded before the clock
started); ratios are medians of the rounds' paired ratios.

Beside them, what one batch costs (CPU microseconds), which decides when workers pay:

- ``decode``: the raw read in this process (pyarrow decode, batches cut, handed to torch);
- ``library``: the library at 0 workers (decode plus its bookkeeping), which each worker pays;
- ``copy``: moving a batch's tensors into shared memory, which a worker adds to hand it over;
- ``hand-off``: the main process's CPU per batch at ``w`` workers (taking each batch from the
  queue, unpickling, the loader's own work): the share no number of workers takes away.

The whole bench runs with one torch thread in this process, as in each DataLoader worker:
with more, idle OpenMP threads spin after every torch call and the CPU clock charges a batch's
copy 10-20x its cost (7.7 ms instead of 43 us to clone a 1024-row token batch, measured).

With ``c`` cores, ``w`` workers deliver at most ``min(w, c) / (library + copy)`` batches a
second, and the main process takes at most ``1 / hand-off``: workers pay when both exceed
``1 / library``, the rate of 0 workers. The ``model`` column prints that bound as a speedup.
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from lakeckpt_tables.reader.dataset import LakeDataset
from lakeckpt_tables.sources.delta import DeltaSource
from lakeckpt_tables.tools.bench._common import (
    Figure,
    LoopTime,
    Progress,
    machine_note,
    no_loader_warnings,
    quiet,
    timed_pass,
    warm_up,
)
from lakeckpt_tables.tools.bench.data import warm_page_cache
from lakeckpt_tables.tools.bench.raw import raw_batches

__all__ = ["BATCH_SIZES", "WORKERS", "BatchCosts", "WorkersReport", "format_workers",
           "grid_figures", "measure_workers"]

BATCH_SIZES = (1024, 8192)
WORKERS = (0, 2, 4, 8)


@dataclass(frozen=True)
class BatchCosts:
    """CPU microseconds one batch costs (module docstring).

    Attributes:
        decode_us: the raw read, in this process.
        library_us: the library at 0 workers, in this process (read-ahead threads included).
        copy_us: a batch's tensors moved into shared memory.
        handoff_us: workers -> the main process's CPU per batch, one batch per hand-off.
        chunked_handoff_us: workers -> the main process's CPU per batch under ChunkedLoader.
    """

    decode_us: float
    library_us: float
    copy_us: float
    handoff_us: dict[int, float] = field(default_factory=dict)
    chunked_handoff_us: dict[int, float] = field(default_factory=dict)

    def model(self, workers: int, cores: int) -> float:
        """The speedup over 0 workers that ``workers`` workers can reach at most."""
        if workers == 0:
            return 1.0
        per_batch = max(self.handoff_us.get(workers, 0.0),
                        (self.library_us + self.copy_us) / min(workers, cores))
        return self.library_us / max(per_batch, 1e-9)


@dataclass
class WorkersReport:
    """Passes per loop (``raw@B``, ``library w@B``, ``chunked w@B``) and per-batch costs."""

    table: str
    rows: int
    rounds: int
    workers: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    cores: int
    passes: dict[str, list[LoopTime]] = field(default_factory=dict)
    costs: dict[int, BatchCosts] = field(default_factory=dict)
    machine: str = ""

    def rate(self, loop: str) -> float:
        """Median rows per wall-clock second."""
        return statistics.median(p.wall_rate for p in self.passes[loop])

    def ratio(self, a: str, b: str) -> float | None:
        """``a`` over ``b`` in rows/s: the median of the rounds' paired ratios."""
        if a not in self.passes or b not in self.passes:
            return None
        return statistics.median(pb.wall_s / max(pa_.wall_s, 1e-9)
                                 for pa_, pb in zip(self.passes[a], self.passes[b], strict=True))

    def ratio_names(self) -> dict[str, tuple[str, str]]:
        """Printed name -> (loop, reference loop) of every ratio figure."""
        out = {}
        for b in self.batch_sizes:
            for w in self.workers:
                out[f"batch {b}: library {w} workers / raw read"] = (f"library {w}@{b}",
                                                                     f"raw@{b}")
                if w and 0 in self.workers:
                    out[f"batch {b}: library {w} workers / 0 workers"] = (f"library {w}@{b}",
                                                                          f"library 0@{b}")
                    out[f"batch {b}: chunked {w} workers / library 0 workers"] = (
                        f"chunked {w}@{b}", f"library 0@{b}")
        return {name: pair for name, pair in out.items() if pair[0] in self.passes}

    def ratios(self) -> dict[str, float | None]:
        return {name: self.ratio(a, b) for name, (a, b) in self.ratio_names().items()}

    def to_json(self) -> dict[str, Any]:
        return {"bench": "workers", "shape": self.table, "rows": self.rows,
                "rounds": self.rounds, "workers": list(self.workers),
                "batch_sizes": list(self.batch_sizes), "cores": self.cores,
                "machine": self.machine,
                "rows_per_s": {loop: self.rate(loop) for loop in self.passes},
                "costs_us": {str(b): {**asdict(c), "model": {
                    str(w): c.model(w, self.cores) for w in self.workers}}
                    for b, c in self.costs.items()},
                "ratios": self.ratios(), "passed": True}


def _copy_us(units: Sequence[tuple[str, int]], columns: Sequence[str], batch: int) -> float:
    """CPU microseconds per batch to move its tensors into shared memory, as a worker does."""
    spent, batches = 0.0, 0
    for b in raw_batches(units, columns, batch):
        started = time.process_time()
        for tensor in b.values():
            tensor.share_memory_()  # type: ignore[no-untyped-call]
        spent += time.process_time() - started
        batches += 1
        del b  # its shared memory is released here
    return spent / max(batches, 1) * 1e6


def measure_workers(
    uri: str,
    *,
    table: str = "",
    columns: Sequence[str] = ("id", "x"),
    batch_sizes: Sequence[int] = BATCH_SIZES,
    workers: Sequence[int] = WORKERS,
    rounds: int = 3,
    chunked: bool = True,
    progress: Progress = quiet,
) -> WorkersReport:
    """Passes and per-batch costs for each batch size (module docstring).

    Args:
        uri: the Delta table.
        table: its shape, as printed.
        columns: columns read (``id`` counts the rows).
        batch_sizes: batch sizes, one grid row each.
        workers: DataLoader worker counts.
        rounds: rounds per batch size (medians reported).
        chunked: also ``ChunkedLoader`` at each worker count above 0.
        progress: called with a line per round.
    """
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lakeckpt_tables.reader.handoff import ChunkedLoader

    cols = list(columns)

    def dataset(batch: int) -> LakeDataset:
        return LakeDataset(DeltaSource(uri), columns=cols, batch_size=batch, shuffle=False)

    def library(batch: int, w: int) -> Callable[[], Iterable[Any]]:
        return lambda: StatefulDataLoader(dataset(batch), batch_size=None, num_workers=w)

    def in_chunks(batch: int, w: int) -> Callable[[], Iterable[Any]]:
        return lambda: ChunkedLoader(dataset(batch), num_workers=w)

    probe = dataset(1024).snapshot
    units = [(u.path, u.row_group) for u in probe.units]
    warm_page_cache([p for p, _ in units])
    report = WorkersReport(table or uri, probe.rows, rounds, tuple(workers),
                           tuple(batch_sizes), os.cpu_count() or 1)
    handles: dict[str, Any] = {}
    with no_loader_warnings(), _one_torch_thread():
        for batch in batch_sizes:
            makers: dict[str, Callable[[], Iterable[Any]]] = {
                f"raw@{batch}": functools.partial(raw_batches, units, cols, batch,
                                                  handles=handles)}
            makers.update({f"library {w}@{batch}": library(batch, w) for w in workers})
            if chunked:
                makers.update({f"chunked {w}@{batch}": in_chunks(batch, w)
                               for w in workers if w})
            names = list(makers)
            warm_up(makers)
            for name in names:
                report.passes[name] = []
            for r in range(rounds):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    report.passes[name].append(timed_pass(name, makers[name], probe.rows))
                progress(f"batch {batch}, round {r + 1}/{rounds}: " + ", ".join(
                    f"{n.removesuffix(f'@{batch}')} {report.passes[n][-1].wall_rate / 1e6:.2f}"
                    for n in names) + " Mrows/s")
            report.costs[batch] = _costs(report, batch, _copy_us(units, cols, batch))
    report.machine = machine_note()
    return report


@contextlib.contextmanager
def _one_torch_thread() -> Iterator[None]:
    """One torch thread in this process, as in a DataLoader worker (module docstring)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _costs(report: WorkersReport, batch: int, copy_us: float) -> BatchCosts:
    batches = -(-report.rows // batch)  # the raw loop cuts per row group: close enough

    def per_batch(loop: str) -> float:
        return statistics.median(p.cpu_s for p in report.passes[loop]) / batches * 1e6

    return BatchCosts(
        per_batch(f"raw@{batch}"), per_batch(f"library 0@{batch}") if 0 in report.workers
        else float("nan"), copy_us,
        {w: per_batch(f"library {w}@{batch}") for w in report.workers if w},
        {w: per_batch(f"chunked {w}@{batch}") for w in report.workers
         if f"chunked {w}@{batch}" in report.passes})


def format_workers(report: WorkersReport) -> str:
    """The grid (rows/s), the ratios and the per-batch costs, as markdown."""
    workers = [w for w in report.workers if w]
    head = (["batch", "raw"] + [f"{w} workers" for w in report.workers]
            + [f"{w} workers, chunked" for w in workers
               if f"chunked {w}@{report.batch_sizes[0]}" in report.passes])
    lines = [f"{report.table}; whole passes, wall clock, median of {report.rounds} rounds; "
             f"{report.cores} cores", "", "Mrows/s:", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in report.batch_sizes:
        loops = [f"raw@{b}"] + [f"library {w}@{b}" for w in report.workers] + [
            f"chunked {w}@{b}" for w in workers if f"chunked {w}@{b}" in report.passes]
        lines.append("| " + " | ".join([str(b)] + [f"{report.rate(n) / 1e6:.2f}"
                                                   for n in loops]) + " |")
    lines += ["", "| ratio | wall clock |", "|---|---|"]
    lines += [f"| {name} | {value:.2f}x |" for name, value in report.ratios().items()
              if value is not None]
    lines += ["", "Per batch, CPU microseconds (the main process's share at w workers); "
              "model: the speedup over 0 workers those costs allow on "
              f"{report.cores} cores, beside the measured one:", "",
              "| batch | decode | library | copy | " + " | ".join(
                  f"hand-off {w}w | model {w}w | measured {w}w" for w in workers) + " |",
              "|" + "---|" * (4 + 3 * len(workers))]
    for b, c in report.costs.items():
        cells = [str(b), f"{c.decode_us:,.0f}", f"{c.library_us:,.0f}", f"{c.copy_us:,.0f}"]
        for w in workers:
            measured = report.ratio(f"library {w}@{b}", f"library 0@{b}")
            cells += [f"{c.handoff_us[w]:,.0f}", f"{c.model(w, report.cores):.2f}x",
                      "n/a" if measured is None else f"{measured:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", report.machine]
    return "\n".join(lines)


def grid_figures(report: WorkersReport) -> list[Figure]:
    """One figure per ratio (``bench read`` prints them among its own)."""
    return [Figure(f"StatefulDataLoader grid: {name}", value, "x", "", None,
                   f"wall clock, median of {report.rounds} paired rounds")
            for name, value in report.ratios().items() if value is not None]


def run_workers_bench(root: str | Path, *, shape: str, rows: int, files: int, row_groups: int,
                      workers: Sequence[int] = WORKERS,
                      batch_sizes: Sequence[int] = BATCH_SIZES, rounds: int = 3,
                      chunked: bool = True, progress: Progress = quiet) -> WorkersReport:
    """Build (or reuse under ``root``) a table of ``shape`` and measure the grid on it."""
    from lakeckpt_tables.tools.bench.shapes import ensure_shape_table

    table = ensure_shape_table(root, shape, rows, files=files, row_groups=row_groups)
    progress(table.describe())
    return measure_workers(table.uri, table=table.describe(), columns=table.columns,
                           batch_sizes=batch_sizes, workers=workers, rounds=rounds,
                           chunked=chunked, progress=progress)

