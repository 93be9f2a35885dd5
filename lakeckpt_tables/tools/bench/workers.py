"""The reader under ``StatefulDataLoader`` at 0 and 2 workers, across batch sizes (issue 12
item 4): what handing batches from worker processes costs, beside the raw in-process limit,
and (``chunked=True``) what :class:`~lakeckpt_tables.ChunkedLoader` gains back.

For each batch size, one round runs, one after the other: the raw pyarrow -> torch loop in
this process, then the library under ``StatefulDataLoader`` (shuffle off) at each worker
count, then ``ChunkedLoader`` at each worker count above 0. Workers run in other processes, so
the figure is wall-clock rows per second of a whole pass, worker start-up included (a chunked
loader's first batch waits for a whole chunk, and its workers prefetch: timing from the first
batch would credit it rows decoded before the clock started); the median over rounds, the
loops' order rotating between rounds. Compare figures of one run only, under the load printed
with them.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq

from lakeckpt_tables.reader.dataset import LakeDataset
from lakeckpt_tables.sources.delta import DeltaSource
from lakeckpt_tables.tools.bench._common import (
    Figure,
    Progress,
    clock,
    machine_note,
    no_loader_warnings,
    quiet,
)
from lakeckpt_tables.tools.bench.data import TOKEN_COLUMNS, ensure_token_table
from lakeckpt_tables.tools.bench.raw import raw_batches

__all__ = ["BATCH_SIZES", "WORKERS", "LoaderGrid", "grid_figures", "grid_lines",
           "measure_loader_grid"]

BATCH_SIZES = (1024, 8192)
WORKERS = (0, 2)


@dataclass(frozen=True)
class LoaderGrid:
    """Wall-clock rows/s per batch size: the raw limit and the library per worker count.

    Attributes:
        rows: rows per pass.
        rounds: rounds per batch size (medians reported).
        raw: batch size -> rows/s of the raw in-process loop.
        library: ``"<workers>@<batch size>"`` -> rows/s of the library under the loader.
        chunked: ``"<workers>@<batch size>"`` -> rows/s of ``ChunkedLoader`` (workers > 0).
    """

    rows: int
    rounds: int
    raw: dict[str, float]
    library: dict[str, float]
    chunked: dict[str, float] = field(default_factory=dict)

    def ratio(self, workers: int, batch_size: int) -> float:
        """Library at ``workers`` workers over the raw limit, at ``batch_size``."""
        return self.library[f"{workers}@{batch_size}"] / self.raw[str(batch_size)]

    def chunked_speedup(self, workers: int, batch_size: int) -> float:
        """``ChunkedLoader`` at ``workers`` workers over the library at 0 workers."""
        return self.chunked[f"{workers}@{batch_size}"] / self.library[f"0@{batch_size}"]

    def to_json(self) -> dict[str, Any]:
        out = {"rows": self.rows, "rounds": self.rounds, "raw": dict(self.raw),
               "library": dict(self.library),
               "ratios": {k: v / self.raw[k.split("@")[1]] for k, v in self.library.items()}}
        if self.chunked:
            out["chunked"] = dict(self.chunked)
            out["chunked_over_0_workers"] = {
                k: v / self.library[f"0@{k.split('@')[1]}"] for k, v in self.chunked.items()}
        return out


def _rate(make: Callable[[], Iterable[Any]], expected: int, column: str = "id") -> float:
    """Rows/s of one whole pass, worker start-up and the first chunk's wait included: a
    loader that prefetches a chunk must not be timed from after it.

    Raises:
        RuntimeError: the pass delivered another number of rows.
    """
    start = clock()
    batches = iter(make())
    rows = 0
    for batch in batches:
        rows += int(batch[column].shape[0])
    elapsed = clock() - start
    del batches  # a loader's workers end here, not during the next loop's pass
    if rows != expected:
        raise RuntimeError(f"a loader pass delivered {rows} rows, expected {expected}")
    return rows / max(elapsed, 1e-9)


def measure_loader_grid(
    uri: str,
    *,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    workers: Sequence[int] = WORKERS,
    rounds: int = 3,
    columns: Sequence[str] = ("id", "x"),
    chunked: bool = False,
    progress: Progress = quiet,
) -> LoaderGrid:
    """Raw limit and library at each worker count, for each batch size (module docstring).

    Args:
        uri: the Delta table.
        batch_sizes: batch sizes, one grid row each.
        workers: DataLoader worker counts.
        rounds: rounds per batch size (medians reported).
        columns: columns read (the first one counts the rows).
        chunked: also ``ChunkedLoader`` at each worker count above 0.
        progress: called with a line per batch size.

    Returns:
        The grid.
    """
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lakeckpt_tables.reader.handoff import ChunkedLoader

    cols = list(columns)

    def dataset(batch: int) -> LakeDataset:
        return LakeDataset(DeltaSource(uri), columns=cols, batch_size=batch, shuffle=False)

    def library(batch: int, w: int) -> Callable[[], Iterable[Any]]:
        def make() -> Iterable[Any]:
            loader: Iterable[Any] = StatefulDataLoader(dataset(batch), batch_size=None,
                                                       num_workers=w)
            return loader
        return make

    def in_chunks(batch: int, w: int) -> Callable[[], Iterable[Any]]:
        return lambda: ChunkedLoader(dataset(batch), num_workers=w)

    probe = dataset(1024)
    units = [(u.path, u.row_group) for u in probe.snapshot.units]
    handles: dict[str, pq.ParquetFile] = {}
    expected = probe.snapshot.rows
    limit: dict[str, float] = {}
    ours: dict[str, float] = {}
    theirs: dict[str, float] = {}
    with no_loader_warnings():
        for batch in batch_sizes:
            makers: dict[str, Callable[[], Iterable[Any]]] = {
                "raw": functools.partial(raw_batches, units, cols, batch, handles=handles)}
            makers.update({f"{w}@{batch}": library(batch, w) for w in workers})
            if chunked:
                makers.update({f"chunked {w}@{batch}": in_chunks(batch, w)
                               for w in workers if w})
            samples: dict[str, list[float]] = {name: [] for name in makers}
            names = list(makers)
            for r in range(rounds):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    samples[name].append(_rate(makers[name], expected, cols[0]))
            limit[str(batch)] = statistics.median(samples.pop("raw"))
            for name, values in samples.items():
                kind, _, key = name.rpartition(" ")
                (theirs if kind else ours)[key] = statistics.median(values)
            progress(f"loader grid, batch {batch}: raw {limit[str(batch)] / 1e6:.2f} Mrows/s; "
                     + ", ".join(f"{w} workers {ours[f'{w}@{batch}'] / 1e6:.2f}"
                                 for w in workers)
                     + "".join(f", chunked {w} workers {theirs[f'{w}@{batch}'] / 1e6:.2f}"
                               for w in workers if w and chunked))
    return LoaderGrid(expected, rounds, limit, ours, theirs)


def grid_figures(grid: LoaderGrid) -> list[Figure]:
    """One figure per (workers, batch size): library under the loader / raw limit."""
    out = []
    for key, rate in grid.library.items():
        w, batch = (int(v) for v in key.split("@"))
        out.append(Figure(f"StatefulDataLoader, {w} workers, batch {batch} / raw",
                          grid.ratio(w, batch), "x", "", None,
                          f"{rate / 1e6:.1f} Mrows/s wall clock, raw "
                          f"{grid.raw[str(batch)] / 1e6:.1f}; median of {grid.rounds}"))
    for key, rate in grid.chunked.items():
        w, batch = (int(v) for v in key.split("@"))
        out.append(Figure(f"ChunkedLoader, {w} workers / 0 workers, batch {batch}",
                          grid.chunked_speedup(w, batch), "x", "", None,
                          f"{rate / 1e6:.2f} Mrows/s wall clock, 0 workers "
                          f"{grid.library[f'0@{batch}'] / 1e6:.2f}; median of {grid.rounds}"))
    return out


def grid_lines(grid: LoaderGrid | None) -> list[str]:
    """The worker grid: rows/s per batch size and loader, and 2 workers in chunks / 0 workers."""
    if grid is None:
        return []
    workers = sorted({int(k.split("@")[0]) for k in grid.library})
    chunked = sorted({int(k.split("@")[0]) for k in grid.chunked})
    head = (["batch", "raw"] + [f"{w} workers" if w == 0 else f"{w} workers, per batch"
                                for w in workers]
            + [f"{w} workers, chunked" for w in chunked]
            + [f"chunked {w} / 0 workers" for w in chunked if 0 in workers])
    lines = ["", f"Workers, whole passes of {grid.rows:,} rows (median of {grid.rounds}), "
             "rows/s:", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for batch in grid.raw:
        cells = [batch, f"{grid.raw[batch]:,.0f}"]
        cells += [f"{grid.library[f'{w}@{batch}']:,.0f}" for w in workers]
        cells += [f"{grid.chunked[f'{w}@{batch}']:,.0f}" for w in chunked]
        cells += [f"{grid.chunked_speedup(w, int(batch)):.2f}x" for w in chunked if 0 in workers]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lakeckpt_tables.tools.bench.workers``: the worker grid of ``lakeckpt bench
    peers`` alone, on its token table (a minute where the whole peers bench takes ten)."""
    import argparse
    import sys
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m lakeckpt_tables.tools.bench.workers",
                                     description=main.__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the token table")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (median taken)")
    parser.add_argument("--batch-sizes", default="256,1024,8192",
                        help="comma-separated batch sizes (default 256,1024,8192)")
    parser.add_argument("--dir", metavar="PATH", default=None,
                        help="keep the token table under PATH and reuse it (default: temporary)")
    args = parser.parse_args(argv)
    sizes = [int(v) for v in args.batch_sizes.split(",")]

    def progress(line: str) -> None:
        print(f"  {line}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="lakeckpt-workers-") as scratch:
        uri, _ = ensure_token_table(args.dir or scratch, args.rows)
        grid = measure_loader_grid(uri, batch_sizes=sizes, workers=WORKERS, rounds=args.rounds,
                                   columns=TOKEN_COLUMNS, chunked=True, progress=progress)
    print("\n".join(grid_lines(grid)))
    print(f"\n{machine_note()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
