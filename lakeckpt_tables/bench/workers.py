"""The reader under ``StatefulDataLoader`` at 0 and 2 workers, across batch sizes (issue 12
item 4): what handing batches from worker processes costs, beside the raw in-process limit.

For each batch size, one round runs, one after the other: the raw pyarrow -> torch loop of
``bench read`` in this process, then the library under ``StatefulDataLoader`` (shuffle off)
at each worker count. Workers run in other processes, so the figure is wall-clock rows per
second, from the first batch to the last (worker start-up excluded: it is paid once per pass,
not per batch); the median over rounds, the loops' order rotating between rounds. Compare
figures of one run only, under the load printed with them.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow.parquet as pq

from lakeckpt_tables.bench._common import Figure, Progress, clock, no_loader_warnings, quiet
from lakeckpt_tables.reader.dataset import LakeDataset
from lakeckpt_tables.sources.delta import DeltaSource

__all__ = ["BATCH_SIZES", "WORKERS", "LoaderGrid", "grid_figures", "measure_loader_grid"]

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
    """

    rows: int
    rounds: int
    raw: dict[str, float]
    library: dict[str, float]

    def ratio(self, workers: int, batch_size: int) -> float:
        """Library at ``workers`` workers over the raw limit, at ``batch_size``."""
        return self.library[f"{workers}@{batch_size}"] / self.raw[str(batch_size)]

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "rounds": self.rounds, "raw": dict(self.raw),
                "library": dict(self.library),
                "ratios": {k: v / self.raw[k.split("@")[1]] for k, v in self.library.items()}}


def _rate(make: Callable[[], Iterable[Any]], expected: int) -> float:
    """Rows/s of one pass, from its first batch to its end.

    Raises:
        RuntimeError: the pass delivered another number of rows.
    """
    batches = iter(make())
    first = next(batches)
    rows = int(first["id"].shape[0])
    start = clock()
    for batch in batches:
        rows += int(batch["id"].shape[0])
    elapsed = clock() - start
    if rows != expected:
        raise RuntimeError(f"a loader pass delivered {rows} rows, expected {expected}")
    return (rows - int(first["id"].shape[0])) / max(elapsed, 1e-9)


def measure_loader_grid(
    uri: str,
    *,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    workers: Sequence[int] = WORKERS,
    rounds: int = 3,
    progress: Progress = quiet,
) -> LoaderGrid:
    """Raw limit and library at each worker count, for each batch size (module docstring)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lakeckpt_tables.bench.read import raw_batches

    def library(batch: int, w: int) -> Callable[[], Iterable[Any]]:
        def make() -> Iterable[Any]:
            dataset = LakeDataset(DeltaSource(uri), columns=["id", "x"], batch_size=batch,
                                  shuffle=False)
            loader: Iterable[Any] = StatefulDataLoader(dataset, batch_size=None, num_workers=w)
            return loader
        return make

    probe = LakeDataset(DeltaSource(uri), columns=["id", "x"], batch_size=1024, shuffle=False)
    units = [(u.path, u.row_group) for u in probe.snapshot.units]
    handles = {p: pq.ParquetFile(p) for p in dict.fromkeys(p for p, _ in units)}
    expected = probe.snapshot.rows
    raw: dict[str, float] = {}
    ours: dict[str, float] = {}
    with no_loader_warnings():
        for batch in batch_sizes:
            makers: dict[str, Callable[[], Iterable[Any]]] = {
                "raw": functools.partial(raw_batches, handles, units, ["id", "x"], batch)}
            makers.update({f"{w}@{batch}": library(batch, w) for w in workers})
            samples: dict[str, list[float]] = {name: [] for name in makers}
            names = list(makers)
            for r in range(rounds):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    samples[name].append(_rate(makers[name], expected))
            raw[str(batch)] = statistics.median(samples.pop("raw"))
            ours.update({name: statistics.median(v) for name, v in samples.items()})
            progress(f"loader grid, batch {batch}: raw {raw[str(batch)] / 1e6:.1f} Mrows/s; "
                     + ", ".join(f"{w} workers {ours[f'{w}@{batch}'] / 1e6:.1f}"
                                 for w in workers))
    return LoaderGrid(expected, rounds, raw, ours)


def grid_figures(grid: LoaderGrid) -> list[Figure]:
    """One figure per (workers, batch size): library under the loader / raw limit."""
    out = []
    for key, rate in grid.library.items():
        w, batch = (int(v) for v in key.split("@"))
        out.append(Figure(f"StatefulDataLoader, {w} workers, batch {batch} / raw",
                          grid.ratio(w, batch), "x", "", None,
                          f"{rate / 1e6:.1f} Mrows/s wall clock, raw "
                          f"{grid.raw[str(batch)] / 1e6:.1f}; median of {grid.rounds}"))
    return out
