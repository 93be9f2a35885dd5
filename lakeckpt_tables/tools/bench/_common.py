"""What every ``lakeckpt bench`` benchmark shares: figures and their table, paired timing of
loops, scratch directories, table writing, progress lines.

A benchmark module keeps only what it measures; how a figure prints, how loops are timed side
by side, and how a Delta table is written for measuring live here once.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

__all__ = [
    "Figure",
    "LoopTime",
    "Progress",
    "clock",
    "figure_lines",
    "interleaved_pass",
    "interleaved_rounds",
    "machine_note",
    "no_loader_warnings",
    "passed",
    "percentile",
    "quiet",
    "scratch",
    "timed_pass",
    "warm_up",
    "write_delta",
]

Progress = Callable[[str], None]
"""Called with one line of text as measurements come in (the CLI prints it on stderr)."""


def quiet(_: str) -> None:
    """A :data:`Progress` that prints nothing."""


def clock() -> float:
    return time.perf_counter()


def machine_note() -> str:
    """CPUs, load and pyarrow's memory pool, to print beside timings measured on a shared
    machine (the pool decides how much a shuffled read's fresh memory costs: with mimalloc,
    shuffle on / off on the token table measured 0.36x wall against 0.66-0.97x with
    ``ARROW_DEFAULT_MEMORY_POOL=system``)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{os.cpu_count()} CPUs, load average {load:.1f} at the end, pyarrow memory pool "
            f"{pa.default_memory_pool().backend_name}")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``values``; 0 for none."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else 0.0


@contextlib.contextmanager
def no_loader_warnings() -> Iterator[None]:
    """Silence the warnings a measured loop would print on every pass."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*set_vital.*")  # torchdata 0.11, on iter()
        # Arrow buffers are read-only; torch warns about it once (the reader does the same).
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        yield


@contextlib.contextmanager
def scratch(root: str | Path | None, prefix: str) -> Iterator[Path]:
    """``root`` (created; kept for later runs), or a temporary directory removed afterwards."""
    if root is not None:
        path = Path(root)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp)


# ------------------------------------------------------------------------------ figures


@dataclass(frozen=True)
class Figure:
    """One printed figure with its target.

    Attributes:
        name: what is measured.
        value: the measured value.
        unit: unit of ``value`` ("x" for ratios).
        target: the target as text, e.g. ``">= 0.9x"``.
        passed: whether ``value`` meets the target; None for figures without a target.
        note: context printed after the figure.
    """

    name: str
    value: float
    unit: str
    target: str
    passed: bool | None
    note: str = ""

    @property
    def verdict(self) -> str:
        return "" if self.passed is None else ("PASS" if self.passed else "MISS")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"] = self.verdict
        return out


def passed(figures: Iterable[Figure]) -> bool:
    """No figure missed its target (figures without one do not count)."""
    return all(f.passed is not False for f in figures)


def figure_lines(figures: Sequence[Figure]) -> list[str]:
    """The figures as the aligned text table every ``lakeckpt bench`` command prints."""
    header = ("figure", "value", "target", "", "note")
    rows = [(f.name, f"{f.value:,.{0 if f.unit == 'rows' else 2}f} {f.unit}", f.target,
             f.verdict, f.note) for f in figures]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    lines = []
    for r in [header, *rows]:
        cells = [r[0].ljust(widths[0]), r[1].rjust(widths[1]), r[2].ljust(widths[2]),
                 r[3].ljust(widths[3]), r[4]]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "-" * len(lines[0]))
    return lines


# ---------------------------------------------------------------------- paired timing


@dataclass(frozen=True)
class LoopTime:
    """What one loop of an interleaved pass delivered and spent.

    Attributes:
        rows: rows delivered.
        wall_s: wall-clock seconds spent inside the loop's ``next()`` calls.
        cpu_s: CPU seconds of this process (all its threads) spent inside them.
    """

    rows: int
    wall_s: float
    cpu_s: float

    @property
    def cpu_rate(self) -> float:
        """Rows per CPU second."""
        return self.rows / max(self.cpu_s, 1e-9)

    @property
    def wall_rate(self) -> float:
        """Rows per wall-clock second."""
        return self.rows / max(self.wall_s, 1e-9)


def timed_pass(name: str, make: Callable[[], Iterable[Mapping[str, torch.Tensor]]],
               expected: int, column: str = "id") -> LoopTime:
    """One whole pass of the iterable ``make()`` builds, building it (workers starting)
    included: a loader that prefetches must not be timed from its first batch. CPU time is
    this (the main) process's.

    Raises:
        RuntimeError: the pass did not deliver ``expected`` rows: its figure would compare
            different work.
    """
    wall, cpu = clock(), time.process_time()
    batches = iter(make())
    rows = sum(int(b[column].shape[0]) for b in batches)
    out = LoopTime(rows, clock() - wall, time.process_time() - cpu)
    del batches  # a loader's workers end here, not during the next loop's pass
    if rows != expected:
        raise RuntimeError(f"{name}: a pass delivered {rows} rows, expected {expected}")
    return out


def warm_up(makers: Mapping[str, Callable[[], Iterable[Any]]]) -> None:
    """Take one batch of each loop, uncounted: the first use of a code path (imports, kernels,
    thread pools) lands here, not in the first measured pass of whichever loop runs first."""
    for make in makers.values():
        batches = iter(make())
        next(batches, None)
        del batches


def interleaved_pass(
    loops: Mapping[str, Iterable[Mapping[str, torch.Tensor]]], column: str
) -> dict[str, LoopTime]:
    """Run ``loops`` together, one batch of each in turn, timing each ``next()`` separately.

    NOTE [ interleaving ]
    On a small machine that other work shares, load comes in bursts of tens of milliseconds;
    passes run one after the other land in different bursts, and their wall-clock ratio swings
    by 2x. Alternating batch by batch (~0.1 ms each) spreads the bursts over all loops, and
    the process's CPU time (``time.process_time``: every thread of this process, pyarrow's
    decoding threads included, none of the other processes) does not count the time another
    process held the core at all. Measured under a load average of 4 on 2 cores, the CPU
    ratio of ten rounds stayed within 0.95-0.97 while the wall-clock ratio ranged 0.81-1.20.

    Returns:
        Rows and time spent per loop.
    """
    active = {name: iter(loop) for name, loop in loops.items()}
    wall = dict.fromkeys(active, 0.0)
    cpu = dict.fromkeys(active, 0.0)
    rows = dict.fromkeys(active, 0)
    cpu_clock = time.process_time
    gc.collect()
    gc.disable()  # a collection would charge one loop for every loop's garbage
    try:
        while active:
            for name, it in list(active.items()):
                t0, c0 = clock(), cpu_clock()
                batch = next(it, None)
                cpu[name] += cpu_clock() - c0
                wall[name] += clock() - t0
                if batch is None:
                    del active[name]
                else:
                    rows[name] += batch[column].shape[0]
    finally:
        gc.enable()
    return {name: LoopTime(rows[name], wall[name], cpu[name]) for name in loops}


def interleaved_rounds(
    loops: Callable[[], Mapping[str, Iterable[Mapping[str, torch.Tensor]]]],
    column: str,
    expected: Mapping[str, int],
    *,
    rounds: int,
    min_seconds: float = 0.0,
    max_rounds: int = 50,
    on_round: Callable[[int, dict[str, LoopTime]], None] | None = None,
) -> list[dict[str, LoopTime]]:
    """Interleaved passes of ``loops()`` after one uncounted warm-up pass.

    At least ``rounds`` rounds, more (up to ``max_rounds``) until ``min_seconds`` have been
    spent, so a small table still gives enough batches for a stable median.

    Args:
        loops: builds the loops of one round (each iterated once).
        column: a column every batch has (its length counts the rows).
        expected: rows each loop must deliver.
        rounds: least counted rounds.
        min_seconds: keep adding rounds until this much time is spent.
        max_rounds: most counted rounds.
        on_round: called after each counted round with its number (1-based) and times.

    Raises:
        RuntimeError: a loop delivered another number of rows than ``expected`` (its figure
            would compare different work).
    """
    with no_loader_warnings():
        interleaved_pass(loops(), column)  # warm-up: open handles, fault pages in, pools
        out: list[dict[str, LoopTime]] = []
        start = clock()
        while len(out) < rounds or (clock() - start < min_seconds and len(out) < max_rounds):
            times = interleaved_pass(loops(), column)
            for name, t in times.items():
                if t.rows != expected[name]:
                    raise RuntimeError(f"{name} pass delivered {t.rows} rows, expected "
                                       f"{expected[name]}")
            out.append(times)
            if on_round is not None:
                on_round(len(out), times)
    return out


# ------------------------------------------------------------------------------- tables


def write_delta(path: str | Path, parts: Iterable[pa.Table], *, row_group_rows: int,
                partition_by: Sequence[str] = (), compression: str = "SNAPPY") -> None:
    """Write a fresh local Delta table, one append (one data file per partition) per part.

    A directory already at ``path`` is removed first (an interrupted build, say).
    """
    from deltalake import WriterProperties, write_deltalake

    target = Path(path)
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    props = WriterProperties(max_row_group_size=row_group_rows, write_batch_size=row_group_rows,
                             compression=compression)  # type: ignore[arg-type]
    for part in parts:
        write_deltalake(str(target), part, mode="append", writer_properties=props,
                        partition_by=list(partition_by) or None)
