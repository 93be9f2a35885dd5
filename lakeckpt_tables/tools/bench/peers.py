"""``lakeckpt bench peers``: the library beside the loops users would otherwise write.

Two table shapes (:mod:`.shapes`: a narrow numeric table and a token table) are each read, in
one run, by:

- ``raw``: a plain pyarrow loop in this process, no DataLoader (:mod:`.raw`): the decode limit;
- ``plain``: torchdata's ``StatefulDataLoader`` over a plain ``IterableDataset`` doing that same
  read: the ceiling for any dataset under that loader (per-batch hand-off included);
- ``library``: the same loader over :class:`~lakeckpt_tables.LakeDataset` (shuffle off, so the
  rows read are the same; read-ahead at its default);
- ``inline``: the same with ``read_ahead=0`` (0 workers only): what read-ahead gains or costs
  (``read-ahead / read_ahead=0``; issue 20 wants it never below 1x);
- ``shuffled``: the same with shuffle on (what shuffling costs: ``library shuffle on / off``);
- ``deleted``: the same (shuffle off) over a copy of the table whose every file has a deletion
  vector deleting 1% of its rows (``bench tables``' ``add_deletion_vectors``): what deletion
  vectors cost, in rows delivered per second (``deletion vectors / none``);
- ``chunked``: :class:`~lakeckpt_tables.ChunkedLoader` over the same dataset, at each worker
  count above 0;
- ``hf``: Hugging Face ``datasets`` streaming the same Parquet files under the same loader,
  batched in Arrow (``with_format("arrow").batch(batch_size)``: the fastest of its documented
  ways that resumes; row by row with a collate function was 10-70x slower here). Installed
  through the ``bench`` extra; reported as skipped when absent.

Every figure is wall-clock time of whole passes (the main process's CPU time beside it: with
several torch threads it includes their spinning, so read it as an upper bound); a
ratio is the median over rounds of the ratio within each round (NOTE [ fair rounds ]). Resume:
time to the first batch after resuming at 0, 50 and 90% of a pass, for the library (a seek), a
naive skip-ahead resume (read and drop the rows already delivered) and ``hf``.

NOTE [ fair rounds ]
The loops run one after the other in rounds, the order rotating between rounds, and a ratio
pairs the two loops' passes of one round, so a burst of load from elsewhere on a shared machine
lands in one round of one loop, and the median over rounds sets it aside.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from torch.utils.data import IterableDataset, get_worker_info

from lakeckpt_tables.tools.bench._common import (
    LoopTime,
    Progress,
    machine_note,
    no_loader_warnings,
    quiet,
    timed_pass,
    warm_up,
)
from lakeckpt_tables.tools.bench.data import warm_page_cache
from lakeckpt_tables.tools.bench.raw import Batch, raw_batches, table_batches, units_of
from lakeckpt_tables.tools.bench.shapes import (
    DEFAULT_FILES,
    DEFAULT_ROW_GROUPS,
    DEFAULT_ROWS,
    SHAPES,
    ShapeTable,
    ensure_shape_table,
)

__all__ = [
    "DEFAULT_ROWS",
    "QUICK_ROWS",
    "PeersReport",
    "PlainParquetDataset",
    "ShapeResult",
    "format_peers",
    "hf_available",
    "run_peers_bench",
]

QUICK_ROWS = 200_000
BATCH_SIZE = 1024
RESUME_FRACTIONS = (0.0, 0.5, 0.9)


# ------------------------------------------------------------------------------ peers


class PlainParquetDataset(IterableDataset[Batch]):
    """A plain ``IterableDataset`` over row groups: each worker takes every n-th row group.

    Its state is the rows it delivered; a resume reads and drops them (naive skip-ahead).
    """

    def __init__(self, files: Sequence[str], columns: Sequence[str], batch_size: int) -> None:
        self.units = units_of(files)
        self.columns = tuple(columns)
        self.batch_size = batch_size
        self.skip = 0
        self.delivered = 0

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        units = self.units if info is None else self.units[info.id::info.num_workers]
        self.delivered = self.skip
        for batch in raw_batches(units, self.columns, self.batch_size, skip=self.skip):
            self.delivered += len(batch["id"])
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"delivered": self.delivered}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.skip = int(state["delivered"])


def hf_available() -> bool:
    return importlib.util.find_spec("datasets") is not None


def _hf_batch(table: pa.Table) -> Batch:
    """One HF batch (Arrow format: a one-row table of list columns) as the same tensors the
    other loops produce (list columns as values + offsets)."""
    flat = pa.table({c: table.column(c).combine_chunks().flatten() for c in table.column_names})
    return next(table_batches(flat, flat.column_names, flat.num_rows))


def _loader(dataset: Any, workers: int, **kwargs: Any) -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(dataset, num_workers=workers,
                              multiprocessing_context="fork" if workers else None, **kwargs)


def _library(table: ShapeTable, batch_size: int, *, shuffle: bool = False,
             uri: str | None = None, **options: Any) -> Any:
    from lakeckpt_tables import DeltaSource, LakeDataset

    return LakeDataset(DeltaSource(uri or table.uri), columns=list(table.columns),
                       batch_size=batch_size, shuffle=shuffle, **options)


def _plain_loader(table: ShapeTable, batch: int, workers: int) -> Any:
    return _loader(PlainParquetDataset(table.files, table.columns, batch), workers,
                   batch_size=None)


def _library_loader(table: ShapeTable, batch: int, workers: int, *, shuffle: bool = False,
                    uri: str | None = None, **options: Any) -> Any:
    return _loader(_library(table, batch, shuffle=shuffle, uri=uri, **options), workers,
                   batch_size=None)


def deleted_copy(table: ShapeTable) -> tuple[str, int]:
    """A copy of ``table`` with a deletion vector on every file (built once beside it) and
    the rows it still holds."""
    import shutil

    from lakeckpt_tables import DeltaSource
    from lakeckpt_tables.tools.bench.tables import add_deletion_vectors

    path = Path(table.uri).with_name(Path(table.uri).name + "-deleted")
    if not (path / "_delta_log").is_dir():
        shutil.rmtree(path, ignore_errors=True)
        shutil.copytree(table.uri, path)
        add_deletion_vectors(str(path))
    return str(path), DeltaSource(str(path)).snapshot().rows


def _chunked_loader(table: ShapeTable, batch: int, workers: int) -> Any:
    from lakeckpt_tables import ChunkedLoader

    return ChunkedLoader(_library(table, batch), num_workers=workers)


def _hf_loader(table: ShapeTable, batch: int, workers: int) -> Any:
    from datasets import load_dataset

    data = load_dataset("parquet", data_files=list(table.files), streaming=True,
                        split="train").with_format("arrow").batch(batch)
    return _loader(data, workers, batch_size=None, collate_fn=_hf_batch)


# ------------------------------------------------------------------------------ timing


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass
class ShapeResult:
    """The passes of every loop on one table shape, and its resume times."""

    table: ShapeTable
    passes: dict[str, list[LoopTime]] = field(default_factory=dict)
    resume_s: dict[str, float] = field(default_factory=dict)

    def rate(self, loop: str) -> float:
        """Median rows per wall-clock second."""
        return _median([p.rows / p.wall_s for p in self.passes[loop]])

    def cpu_rate(self, loop: str) -> float:
        """Median rows per CPU second of the main process."""
        return _median([p.rows / max(p.cpu_s, 1e-9) for p in self.passes[loop]])

    def ratio(self, a: str, b: str, *, cpu: bool = False) -> float | None:
        """``a`` over ``b`` in rows/s: the median of the rounds' paired ratios."""
        if a not in self.passes or b not in self.passes:
            return None
        time_of = "cpu_s" if cpu else "wall_s"
        return _median([pa_.rows * getattr(pb, time_of)
                        / max(pb.rows * getattr(pa_, time_of), 1e-9)
                        for pa_, pb in zip(self.passes[a], self.passes[b], strict=True)])

    def ratio_names(self, workers: Sequence[int]) -> dict[str, tuple[str, str]]:
        """Printed name -> (loop, reference loop) of every ratio figure."""
        out = {}
        for w in workers:
            out[f"library / plain loader, {w} workers"] = (f"library@{w}", f"plain@{w}")
            out[f"library / raw read, {w} workers"] = (f"library@{w}", "raw")
            out[f"library / HF datasets, {w} workers"] = (f"library@{w}", f"hf@{w}")
            if not w:
                out["read-ahead / read_ahead=0, 0 workers"] = ("library@0", "inline@0")
            out[f"library shuffle on / off, {w} workers"] = (f"shuffled@{w}", f"library@{w}")
            out[f"deletion vectors / none, {w} workers"] = (f"deleted@{w}", f"library@{w}")
            if w and 0 in workers:
                out[f"chunked {w} workers / library 0 workers"] = (f"chunked@{w}", "library@0")
        return out


@dataclass
class PeersReport:
    """Everything ``bench peers`` measured, per table shape."""

    batch_size: int
    rounds: int
    workers: tuple[int, ...]
    shapes: dict[str, ShapeResult] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    machine: str = ""

    def ratios(self) -> dict[str, float | None]:
        """Every ratio, higher is better, named ``<shape>: <ratio>`` (``bench compare``)."""
        return {f"{shape}: {name}": result.ratio(a, b)
                for shape, result in self.shapes.items()
                for name, (a, b) in result.ratio_names(self.workers).items()}

    def to_json(self) -> dict[str, Any]:
        shapes = {}
        for shape, r in self.shapes.items():
            shapes[shape] = {
                "table": r.table.describe(), "rows": r.table.rows,
                "files": len(r.table.files), "row_groups": r.table.row_groups,
                "rows_per_s": {loop: r.rate(loop) for loop in r.passes},
                "rows_per_cpu_s": {loop: r.cpu_rate(loop) for loop in r.passes},
                "cpu_ratios": {name: r.ratio(a, b, cpu=True)
                               for name, (a, b) in r.ratio_names(self.workers).items()},
                "passes": {loop: [[p.rows, p.wall_s, p.cpu_s] for p in passes]
                           for loop, passes in r.passes.items()},
                "resume_s": r.resume_s,
            }
        return {"bench": "peers", "shape": "; ".join(r.table.describe()
                                                     for r in self.shapes.values()),
                "batch_size": self.batch_size, "rounds": self.rounds,
                "workers": list(self.workers), "machine": self.machine, "shapes": shapes,
                "skipped": self.skipped, "ratios": self.ratios(), "passed": True}


# ------------------------------------------------------------------------------ running


def _makers(table: ShapeTable, batch: int, workers: Sequence[int], hf: bool,
            deleted: str) -> dict[str, Callable[[], Any]]:
    handles: dict[str, Any] = {}
    makers: dict[str, Callable[[], Any]] = {
        "raw": functools.partial(raw_batches, units_of(table.files), table.columns, batch,
                                 handles=handles)}
    for w in workers:
        makers[f"plain@{w}"] = functools.partial(_plain_loader, table, batch, w)
        makers[f"library@{w}"] = functools.partial(_library_loader, table, batch, w)
        if not w:
            makers["inline@0"] = functools.partial(_library_loader, table, batch, 0,
                                                   read_ahead=0)
        makers[f"shuffled@{w}"] = functools.partial(_library_loader, table, batch, w,
                                                    shuffle=True)
        makers[f"deleted@{w}"] = functools.partial(_library_loader, table, batch, w,
                                                   uri=deleted)
        if w:
            makers[f"chunked@{w}"] = functools.partial(_chunked_loader, table, batch, w)
        if hf:
            makers[f"hf@{w}"] = functools.partial(_hf_loader, table, batch, w)
    return makers


def measure_shape(table: ShapeTable, *, batch_size: int, rounds: int, workers: Sequence[int],
                  hf: bool, resume: bool, progress: Progress) -> ShapeResult:
    """Every loop on ``table`` in rotating rounds (NOTE [ fair rounds ]), then resume."""
    warm_page_cache(list(table.files))
    deleted, live = deleted_copy(table)
    makers = _makers(table, batch_size, workers, hf, deleted)
    result = ShapeResult(table, {name: [] for name in makers})
    names = list(makers)
    with no_loader_warnings():
        warm_up(makers)
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                rows = live if name.startswith("deleted@") else table.rows
                result.passes[name].append(timed_pass(name, makers[name], rows))
            progress(f"{table.shape} round {r + 1}/{rounds}: " + ", ".join(
                f"{n} {result.passes[n][-1].rows / result.passes[n][-1].wall_s / 1e6:.2f}"
                for n in names) + " Mrows/s")
        if resume:
            _measure_resume(result, batch_size, hf, progress)
    return result


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


def _measure_resume(result: ShapeResult, batch: int, hf: bool, progress: Progress) -> None:
    def load_dataset_state(loader: Any, state: Any) -> None:
        loader.dataset.load_state_dict(state)

    def load_loader_state(loader: Any, state: Any) -> None:
        loader.load_state_dict(state)

    table = result.table
    peers: list[tuple[str, Callable[[], Any], Callable[[Any, Any], None], bool]] = [
        ("library", functools.partial(_library_loader, table, batch, 0), load_loader_state,
         False),
        ("naive-skip", functools.partial(_plain_loader, table, batch, 0), load_dataset_state,
         True),
    ]
    if hf:
        peers.append(("hf", functools.partial(_hf_loader, table, batch, 0), load_loader_state,
                      False))
    for fraction in RESUME_FRACTIONS:
        at = int(table.rows // batch * fraction)
        for name, make, load, naive in peers:
            progress(f"{table.shape}: resume {name} at {fraction:.0%}")
            state = {"delivered": at * batch} if naive else _state_at(make, at)
            result.resume_s[f"{name}@{fraction:.0%}"] = min(
                _first_batch_s(make, state, load) for _ in range(2))


def run_peers_bench(root: str | Path, *, shapes: Sequence[str] = tuple(SHAPES),
                    rows: int = DEFAULT_ROWS, files: int = DEFAULT_FILES,
                    row_groups: int = DEFAULT_ROW_GROUPS, batch_size: int = BATCH_SIZE,
                    rounds: int = 3, workers: Sequence[int] = (0,), resume: bool = True,
                    progress: Progress = quiet) -> PeersReport:
    """Build (or reuse under ``root``) a table of each shape and measure every peer on it."""
    report = PeersReport(batch_size, rounds, tuple(workers))
    hf = hf_available()
    if not hf:
        report.skipped["hf"] = ("Hugging Face datasets is not installed (pip install "
                                "'lakeckpt-tables[bench]'): no HF figures")
    for shape in shapes:
        started = time.perf_counter()
        table = ensure_shape_table(root, shape, rows, files=files, row_groups=row_groups)
        progress(f"{table.describe()} ready in {time.perf_counter() - started:.1f} s")
        report.shapes[shape] = measure_shape(table, batch_size=batch_size, rounds=rounds,
                                             workers=workers, hf=hf, resume=resume,
                                             progress=progress)
    report.machine = machine_note()
    return report


# ------------------------------------------------------------------------------ output


def format_peers(report: PeersReport) -> str:
    """The report as markdown, one section per table shape."""
    lines: list[str] = []
    for shape in report.shapes.values():
        lines += [f"{shape.table.describe()}; batch {report.batch_size}; wall clock, median "
                  f"of {report.rounds} rounds", "",
                  "| loader | workers | Mrows/s | Mrows/CPU-s (main process) |",
                  "|---|---|---|---|"]
        for name in shape.passes:
            loop, _, w = name.partition("@")
            lines.append(f"| {loop} | {w or '-'} | {shape.rate(name) / 1e6:.2f} | "
                         f"{shape.cpu_rate(name) / 1e6:.2f} |")
        lines += ["", "| ratio | wall clock | CPU (main process) |", "|---|---|---|"]
        for name, (a, b) in shape.ratio_names(report.workers).items():
            lines.append(f"| {name} | {_x(shape.ratio(a, b))} | {_x(shape.ratio(a, b, cpu=True))}"
                         " |")
        if shape.resume_s:
            lines += ["", "| resume: first batch after | seconds |", "|---|---|"]
            lines += [f"| {name} | {s:.3f} |" for name, s in shape.resume_s.items()]
        lines.append("")
    lines += [f"skipped {peer}: {why}" for peer, why in report.skipped.items()]
    lines.append(report.machine)
    return "\n".join(lines)


def _x(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def write_json(report: PeersReport, path: str | Path) -> None:
    Path(path).write_text(json.dumps(report.to_json(), indent=2) + "\n")
