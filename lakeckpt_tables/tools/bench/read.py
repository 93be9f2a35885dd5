"""``lakeckpt bench read``: the reader's figures, each measured side by side with its reference.

Three figures from DESIGN.md ("Figures we hold ourselves to"):

1. Reader-to-tensor throughput as a ratio to the *raw batch limit*: a plain loop that reads the
   same row groups with pyarrow, slices them into batches of the same size and hands the columns
   to torch zero-copy. Raw and reader loops run interleaved batch by batch and the ratio is
   of the wall-clock time each spends, the median over rounds (NOTE [ interleaving ]), so it
   is fair on a small machine that other work shares. The CPU-time ratio is printed beside.
2. Time to first batch after resuming at 0%, 50% and 90% of a segment: a fresh dataset, a state
   positioned there, then ``next(iter(...))``. Flat in the position means <= 1.5x at 90%.
3. Encoded reader state size for a simulated 10 TB table read by 128 ranks x 8 workers, as
   the run started and after an elastic resume on 64 ranks (``bench/state.py``).

And, each in its own module: shuffle quality and cost on one large row group
(``bench/shuffle.py``), what deletion vectors and partition columns cost
(``bench/tables.py``), and the reader under ``StatefulDataLoader`` at 0 and 2 workers across
batch sizes (``bench/workers.py``).

NOTE [ fairness ]
Both loops read the same units in the same order with ``read_row_group(..., columns=...)``
and end each batch as a dict of tensors. The raw loop keeps its Parquet handles open across
passes and cuts batches within each row group (a row group's last batch may be short); the
reader cuts exact batches across row groups, which is part of the work a reader must do.
Each pass gets a fresh dataset: a dataset keeps the last row groups it decoded
(``reader/_cache.py``, the last two), so its second pass over a small table would decode
less, where the raw loop decodes on every pass. The reader runs without
read-ahead: its threads would decode while another loop is timed and charge that loop's
clock. What read-ahead gains shows in whole passes timed one loop at a time (``bench
peers``, ``bench workers``).
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch

from lakeckpt_tables.reader.dataset import LakeDataset
from lakeckpt_tables.reader.state import ReaderState
from lakeckpt_tables.sources.delta import DeltaSource
from lakeckpt_tables.tools.bench._common import (
    Figure,
    LoopTime,
    Progress,
    figure_lines,
    interleaved_pass,
    interleaved_rounds,
    machine_note,
    passed,
    scratch,
)
from lakeckpt_tables.tools.bench._common import quiet as _quiet
from lakeckpt_tables.tools.bench.data import (
    SyntheticTable,
    ensure_synthetic_table,
    warm_page_cache,
)
from lakeckpt_tables.tools.bench.raw import raw_batches
from lakeckpt_tables.tools.bench.shuffle import (
    OVERLAP_TOLERANCE,
    RHO_TARGET,
    ShuffleResult,
    measure_shuffle,
)
from lakeckpt_tables.tools.bench.shuffle import THROUGHPUT_TARGET as SHUFFLE_TARGET
from lakeckpt_tables.tools.bench.state import (
    REFERENCE_STATE_BYTES,
    STATE_TABLE_BYTES,
    STATE_TARGET_BYTES,
    StateSizeResult,
    measure_state_size,
    simulated_state,
)
from lakeckpt_tables.tools.bench.tables import (
    FeatureCost,
    ensure_feature_tables,
    feature_figures,
    measure_feature_cost,
)
from lakeckpt_tables.tools.bench.workers import WorkersReport, grid_figures, measure_workers

__all__ = [
    "DEFAULT_ROWS",
    "QUICK_ROWS",
    "STATE_TARGET_BYTES",
    "Figure",
    "LoopTime",
    "ReadBenchReport",
    "ResumeResult",
    "StateSizeResult",
    "ThroughputResult",
    "format_report",
    "interleaved_pass",
    "measure_resume",
    "measure_state_size",
    "measure_throughput",
    "reader_pass",
    "run_read_bench",
    "simulated_state",
]

DEFAULT_ROWS = 10_000_000
QUICK_ROWS = 1_000_000
BATCH_SIZE = 8192
COLUMNS = ("id", "x")

THROUGHPUT_TARGET = 0.9
RESUME_TARGET = 1.5
FEATURE_ROWS = 2_000_000
"""Most rows of the tables the deletion-vector and partition-column costs are measured on."""
GRID_ROWS = 500_000
"""Most rows of the table the 0/2-worker loader grid reads."""

# --------------------------------------------------------------------------- throughput


def reader_pass(dataset: LakeDataset, column: str) -> int:
    """One full pass of ``dataset`` in this process. Returns rows delivered."""
    return sum(batch[column].shape[0] for batch in dataset)


@dataclass(frozen=True)
class ThroughputResult:
    """Rows per second of the raw limit and the reader, from interleaved passes.

    Attributes:
        rows: rows per pass (the same for every loop).
        batch_size: rows per batch.
        rounds: interleaved passes of (raw, reader shuffle off, reader shuffle on) run.
        raw: best raw rows per wall-clock second.
        reader: best reader rows per wall-clock second, shuffle off.
        shuffled: best reader rows per wall-clock second, shuffle on.
        raw_cpu: best raw rows per CPU second.
        reader_cpu: best reader rows per CPU second, shuffle off.
        shuffled_cpu: best reader rows per CPU second, shuffle on.
        round_ratios: reader/raw in CPU time with shuffle off, of each round.
        round_shuffled_ratios: reader/raw in CPU time with shuffle on, of each round.
        round_wall_ratios: reader/raw in wall-clock time with shuffle off, of each round.
        round_shuffled_wall_ratios: reader/raw in wall-clock time with shuffle on, of each round.
    """

    rows: int
    batch_size: int
    rounds: int
    raw: float
    reader: float
    shuffled: float
    raw_cpu: float
    reader_cpu: float
    shuffled_cpu: float
    round_ratios: tuple[float, ...]
    round_shuffled_ratios: tuple[float, ...]
    round_wall_ratios: tuple[float, ...]
    round_shuffled_wall_ratios: tuple[float, ...]

    @property
    def ratio(self) -> float:
        """Reader/raw with shuffle off: the median of the rounds' paired wall-clock ratios."""
        return statistics.median(self.round_wall_ratios)

    @property
    def shuffled_ratio(self) -> float:
        """Reader/raw with shuffle on, wall clock (as :attr:`ratio`)."""
        return statistics.median(self.round_shuffled_wall_ratios)

    @property
    def cpu_ratio(self) -> float:
        """Reader/raw with shuffle off: the median of the rounds' CPU-time ratios."""
        return statistics.median(self.round_ratios)


def measure_throughput(
    uri: str,
    *,
    batch_size: int = BATCH_SIZE,
    rounds: int = 5,
    min_seconds: float = 3.0,
    max_rounds: int = 50,
    columns: Sequence[str] = COLUMNS,
    progress: Progress = _quiet,
) -> ThroughputResult:
    """Raw limit vs reader (shuffle off and on), interleaved batch by batch.

    At least ``rounds`` rounds, more (up to ``max_rounds``) until ``min_seconds`` have been
    spent, so a small table still gives enough batches for a stable median.

    Raises:
        RuntimeError: the loops delivered different row counts (a reader bug).
    """
    cols = list(columns)
    source = DeltaSource(uri)

    def reader(shuffle: bool) -> LakeDataset:
        # A fresh dataset per pass: a dataset keeps decoded row groups (reader/_cache.py)
        # and a second pass over it would not decode. read_ahead=0: NOTE [ fairness ].
        return LakeDataset(source, columns=cols, batch_size=batch_size, shuffle=shuffle,
                           read_ahead=0)

    plain = reader(False)
    units = [(u.path, u.row_group) for u in plain.snapshot.units]
    handles = {p: pq.ParquetFile(p) for p in dict.fromkeys(p for p, _ in units)}
    warm_page_cache(list(handles))
    expected = plain.snapshot.rows

    def report(n: int, times: dict[str, LoopTime]) -> None:
        if n <= rounds:
            raw, ours = times["raw"], times["reader"]
            progress(f"throughput round {n}: wall Mrows/s raw {raw.wall_rate / 1e6:.1f}, "
                     f"reader {ours.wall_rate / 1e6:.1f}, shuffled "
                     f"{times['shuffled'].wall_rate / 1e6:.1f}; reader/raw CPU "
                     f"{raw.cpu_s / ours.cpu_s:.3f}, wall {raw.wall_s / ours.wall_s:.3f}")

    results = interleaved_rounds(
        lambda: {"raw": raw_batches(units, cols, batch_size, handles=handles),
                 "reader": reader(False), "shuffled": reader(True)},
        cols[0], dict.fromkeys(("raw", "reader", "shuffled"), expected), rounds=rounds,
        min_seconds=min_seconds, max_rounds=max_rounds, on_round=report)
    best = {name: max(r[name].wall_rate for r in results) for name in results[0]}
    best_cpu = {name: max(r[name].cpu_rate for r in results) for name in results[0]}
    ratios = [r["raw"].cpu_s / r["reader"].cpu_s for r in results]
    shuffled_ratios = [r["raw"].cpu_s / r["shuffled"].cpu_s for r in results]
    wall_ratios = [r["raw"].wall_s / r["reader"].wall_s for r in results]
    shuffled_wall = [r["raw"].wall_s / r["shuffled"].wall_s for r in results]
    progress(f"throughput: {len(ratios)} rounds, median reader/raw wall "
             f"{statistics.median(wall_ratios):.3f}, CPU {statistics.median(ratios):.3f}")
    return ThroughputResult(expected, batch_size, len(ratios), best["raw"], best["reader"],
                            best["shuffled"], best_cpu["raw"], best_cpu["reader"],
                            best_cpu["shuffled"], tuple(ratios), tuple(shuffled_ratios),
                            tuple(wall_ratios), tuple(shuffled_wall))


# ------------------------------------------------------------------------------- resume


@dataclass(frozen=True)
class ResumeResult:
    """Time to first batch after resuming at each fraction of a segment (medians).

    Attributes:
        shuffle: the reader's shuffle setting.
        fractions: positions as fractions of the segment.
        positions: positions in rows (batch-aligned).
        total_s: construct dataset + load state + first batch, seconds.
        first_batch_s: load state + first batch (construction excluded), seconds.
        verified: every resumed first batch equals the batch at that position of a full pass.
    """

    shuffle: bool
    fractions: tuple[float, ...]
    positions: tuple[int, ...]
    total_s: tuple[float, ...]
    first_batch_s: tuple[float, ...]
    verified: bool

    @property
    def ratio(self) -> float:
        """Total time at the last fraction over the first."""
        return self.total_s[-1] / self.total_s[0]

    @property
    def first_batch_ratio(self) -> float:
        return self.first_batch_s[-1] / self.first_batch_s[0]


def _state_at(dataset: LakeDataset, position: int) -> dict[str, Any]:
    """A one-slice reader state ``position`` rows into epoch 0, built from the state schema."""
    snap = dataset.snapshot
    state = ReaderState(snap.identity, snap.version, dataset.config,
                        (dataset.world_size, 1, dataset.batch_size), {}, ((0, position),))
    return state.to_dict()


def measure_resume(
    uri: str,
    *,
    shuffle: bool,
    fractions: Sequence[float] = (0.0, 0.5, 0.9),
    batch_size: int = BATCH_SIZE,
    rounds: int = 5,
    columns: Sequence[str] = COLUMNS,
    progress: Progress = _quiet,
) -> ResumeResult:
    """Construct, load a state at each fraction, take one batch; rounds interleave fractions.

    A full uninterrupted pass gives the reference batches the resumed ones are checked against.
    """
    cols = list(columns)

    def make() -> LakeDataset:
        return LakeDataset(DeltaSource(uri), columns=cols, batch_size=batch_size,
                           shuffle=shuffle)

    probe = make()
    rows = probe.snapshot.rows
    positions = [min(int(f * rows) // batch_size * batch_size,
                     (rows - 1) // batch_size * batch_size) for f in fractions]
    states = [_state_at(probe, p) for p in positions]
    wanted = {p // batch_size: p for p in positions}
    reference: dict[int, torch.Tensor] = {}
    for j, batch in enumerate(probe):
        if j in wanted:
            reference[wanted[j]] = batch[cols[0]].clone()
    totals: list[list[float]] = [[] for _ in fractions]
    firsts: list[list[float]] = [[] for _ in fractions]
    verified = True
    for r in range(rounds + 1):  # round 0 warms caches and is not counted
        for i, state in enumerate(states):
            gc.collect()
            t0 = time.perf_counter()
            dataset = make()
            t1 = time.perf_counter()
            dataset.load_state_dict(state)
            batch = next(iter(dataset))
            t2 = time.perf_counter()
            verified = verified and torch.equal(batch[cols[0]], reference[positions[i]])
            if r:
                totals[i].append(t2 - t0)
                firsts[i].append(t2 - t1)
        if r:
            progress(f"resume (shuffle {'on' if shuffle else 'off'}) round {r}/{rounds}: "
                     + ", ".join(f"{f:.0%} {totals[i][-1] * 1e3:.1f} ms"
                                 for i, f in enumerate(fractions)))
    return ResumeResult(shuffle, tuple(fractions), tuple(positions),
                        tuple(statistics.median(t) for t in totals),
                        tuple(statistics.median(t) for t in firsts), verified)


# ------------------------------------------------------------------------------ report


@dataclass
class ReadBenchReport:
    """Everything ``lakeckpt bench read`` measured."""

    table: SyntheticTable
    throughput: ThroughputResult
    resume: list[ResumeResult]
    state: list[StateSizeResult]
    shuffle: ShuffleResult | None = None
    features: FeatureCost | None = None
    loaders: WorkersReport | None = None
    figures: list[Figure] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types only (lists, not tuples), as ``--json`` prints it."""
        t = self.throughput
        out: dict[str, Any] = json.loads(json.dumps({
            "table": asdict(self.table),
            "bench": "read",
            "shape": self.table.describe(),
            "machine": machine_note(),
            "throughput": {**asdict(t), "ratio": t.ratio, "shuffled_ratio": t.shuffled_ratio,
                           "cpu_ratio": t.cpu_ratio},
            "resume": [{**asdict(r), "ratio": r.ratio, "first_batch_ratio": r.first_batch_ratio}
                       for r in self.resume],
            "state_size": [asdict(s) for s in self.state],
            "shuffle": None if self.shuffle is None else {**asdict(self.shuffle),
                                                          "ratio": self.shuffle.ratio,
                                                          "ceiling": self.shuffle.ceiling},
            "table_features": None if self.features is None else self.features.to_json(),
            "loaders": None if self.loaders is None else self.loaders.to_json(),
            "figures": [f.to_json() for f in self.figures],
            "ratios": self.ratios(),
            "passed": passed(self.figures),
        }))
        return out

    def ratios(self) -> dict[str, float]:
        """The higher-is-better ratios ``bench compare`` guards (wall clock)."""
        t = self.throughput
        out = {"reader / raw, shuffle off": t.ratio, "reader / raw, shuffle on": t.shuffled_ratio}
        if self.shuffle is not None:
            out["shuffle on / raw read, one row group"] = self.shuffle.ratio
        if self.features is not None:
            out.update(self.features.ratios())
        if self.loaders is not None:
            out.update({k: v for k, v in self.loaders.ratios().items() if v is not None})
        return out


def _figures(table: SyntheticTable, t: ThroughputResult, resume: list[ResumeResult],
             states: list[StateSizeResult]) -> list[Figure]:
    out = [
        Figure("raw batch limit (pyarrow -> torch)", t.raw / 1e6, "Mrows/s", "", None,
               f"{t.raw_cpu / 1e6:.1f} Mrows/CPU-s; batch {t.batch_size}, best of {t.rounds} "
               f"interleaved rounds; {table.describe()}"),
        Figure("reader, shuffle off", t.reader / 1e6, "Mrows/s", "", None,
               f"{t.reader_cpu / 1e6:.1f} Mrows/CPU-s"),
        Figure("reader, shuffle on", t.shuffled / 1e6, "Mrows/s", "", None,
               f"{t.shuffled_cpu / 1e6:.1f} Mrows/CPU-s"),
        Figure("reader / raw, shuffle off", t.ratio, "x", f">= {THROUGHPUT_TARGET}x",
               t.ratio >= THROUGHPUT_TARGET,
               f"wall clock, median of {t.rounds} paired rounds ({min(t.round_wall_ratios):.2f}"
               f"-{max(t.round_wall_ratios):.2f}); CPU time {t.cpu_ratio:.2f}x"),
        Figure("reader / raw, shuffle on", t.shuffled_ratio, "x", "", None,
               "window shuffle: numeric columns gathered per window, lists per batch; CPU time "
               f"{statistics.median(t.round_shuffled_ratios):.2f}x"),
    ]
    for r in resume:
        mode = "on" if r.shuffle else "off"
        for f, total in zip(r.fractions, r.total_s, strict=True):
            out.append(Figure(f"resume at {f:.0%} -> first batch, shuffle {mode}", total * 1e3,
                              "ms", "", None))
        out.append(Figure(f"resume {r.fractions[-1]:.0%} / {r.fractions[0]:.0%}, shuffle {mode}",
                          r.ratio, "x", f"<= {RESUME_TARGET}x",
                          r.ratio <= RESUME_TARGET and r.verified,
                          f"load+first batch only {r.first_batch_ratio:.2f}x; batches "
                          + ("match a full pass" if r.verified else "DIFFER from a full pass")))
    lo, hi = REFERENCE_STATE_BYTES
    for s in states:
        out.append(Figure(
            f"reader state, {s.table_bytes / 1e12:g} TB, {s.case}", s.encoded_bytes / 1024, "KB",
            f"<= {STATE_TARGET_BYTES // 1024} KB", s.encoded_bytes <= STATE_TARGET_BYTES,
            f"{s.ranks}x{s.workers} slices, {s.layout_pieces} layout pieces, JSON "
            f"{s.json_bytes / 1024:,.1f} KB; reference design {lo / 1e6:.0f}-{hi / 1e6:.0f} MB "
            f"({lo / s.encoded_bytes:,.0f}x larger)"))
    return out


def run_read_bench(
    *,
    rows: int = DEFAULT_ROWS,
    root: str | Path | None = None,
    rounds: int = 5,
    min_seconds: float = 3.0,
    resume_rounds: int = 5,
    batch_size: int = BATCH_SIZE,
    state_bytes: int = STATE_TABLE_BYTES,
    loader_rounds: int = 3,
    progress: Progress = _quiet,
) -> ReadBenchReport:
    """Build (or reuse under ``root``) the synthetic table and measure all three figures.

    Args:
        rows: rows of the synthetic table.
        root: directory that keeps the table for later runs; a temporary one when None.
        rounds: least alternated throughput rounds (best of each loop is kept).
        min_seconds: keep adding throughput rounds (up to 100) until this much time is spent.
        resume_rounds: resume measurements per position (the median is kept).
        batch_size: rows per batch.
        state_bytes: size of the simulated table of the state-size figures.
        loader_rounds: rounds of the 0/2-worker loader grid (medians kept).
        progress: called with a line of text as measurements come in.
    """
    with scratch(root, "lakeckpt-bench-") as path:
        return _run(rows, path, rounds, min_seconds, resume_rounds, batch_size, state_bytes,
                    loader_rounds, progress)


def _run(rows: int, root: Path, rounds: int, min_seconds: float, resume_rounds: int,
         batch_size: int, state_bytes: int, loader_rounds: int,
         progress: Progress) -> ReadBenchReport:
    t0 = time.perf_counter()
    table = ensure_synthetic_table(root, rows)
    progress(f"table {table.uri}: {rows:,} rows in {table.files} files "
             f"({'reused' if table.reused else f'built in {time.perf_counter() - t0:.1f} s'})")
    throughput = measure_throughput(table.uri, batch_size=batch_size, rounds=rounds,
                                    min_seconds=min_seconds,
                                    progress=progress)
    resume = [measure_resume(table.uri, shuffle=s, batch_size=batch_size, rounds=resume_rounds,
                             progress=progress) for s in (False, True)]
    states = [measure_state_size(table_bytes=state_bytes),
              measure_state_size(table_bytes=state_bytes, elastic_ranks=64)]
    progress("shuffle quality on a one-row-group table, 2 ranks")
    shuffle = measure_shuffle(root, rows=min(rows, 500_000), batch_size=batch_size)
    features = measure_feature_cost(ensure_feature_tables(root, min(rows, FEATURE_ROWS)),
                                    batch_size=batch_size, rounds=rounds,
                                    min_seconds=min_seconds, progress=progress)
    grid_table = ensure_synthetic_table(root, min(rows, GRID_ROWS))
    loaders = measure_workers(grid_table.uri, table=grid_table.describe(), workers=(0, 2),
                              rounds=loader_rounds, chunked=False, progress=progress)
    report = ReadBenchReport(table, throughput, resume, states, shuffle, features, loaders)
    report.figures = [*_figures(table, throughput, resume, states), *_shuffle_figures(shuffle),
                      *feature_figures(features), *grid_figures(loaders)]
    return report


def _shuffle_figures(r: ShuffleResult) -> list[Figure]:
    """Issue 8 item 9: does shuffle mix a single large row group across ranks and epochs?"""
    share = 1 / r.world_size
    where = f"one row group of {r.rows:,} rows, {r.world_size} ranks"
    return [
        Figure("rank's rows seen again next epoch", r.overlap, "", f"{share:g} +- 0.05",
               abs(r.overlap - share) <= OVERLAP_TOLERANCE, where),
        Figure("|rank corr.| row id vs delivery position", r.rho, "", f"<= {RHO_TARGET}",
               r.rho <= RHO_TARGET, where),
        Figure("shuffle on / raw read, one row group", r.ratio, "x", f">= {SHUFFLE_TARGET}x",
               r.ratio >= SHUFFLE_TARGET,
               f"wall clock, median of {len(r.round_ratios)} paired rounds; {where}"),
        Figure("  ceiling of a per-row shuffle: raw + gather / raw", r.ceiling, "x", "", None,
               "the same rounds; a random permutation for free, one take of the row group"),
    ]


def format_report(report: ReadBenchReport) -> str:
    """The figures as a plain-text table."""
    lines = figure_lines(report.figures)
    t = report.table
    verdict = "all targets met" if report.to_json()["passed"] else "some targets MISSED"
    lines.append("")
    lines.append(f"table: {t.uri} ({t.rows:,} rows, {t.files} files); {verdict}")
    return "\n".join(lines)
