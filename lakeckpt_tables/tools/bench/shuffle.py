"""Shuffle quality and cost on a table of ONE large row group (issue 8 item 9).

A plan over whole row groups gives each of 2 ranks a fixed half of a one-row-group table every
epoch; bounded plan units (NOTE [ bounded units ] in ``reader/rounds.py``) must mix it:
- overlap: the share of a rank's epoch-1 rows it sees again in epoch 2 (target 1/world +- 5%);
- |rho|: Spearman rank correlation between row id and delivery position (target <= 0.05);
- throughput: shuffle on against the raw pyarrow -> torch read of the same row group
  (target >= 0.8x): the two loops interleaved batch by batch, the median over rounds of the
  paired wall-clock ratios (NOTE [ interleaving ] in ``_common.py``), as ``bench read`` measures
  its own; each round reads with a fresh dataset (its row group cache empty) built outside
  the timed calls, as the raw loop's file is opened outside them;
- beside it, the ceiling of any per-row shuffle: the raw read plus one gather of the row group
  by a random permutation computed before the clock starts (a permutation for free), in the
  same rounds. Only a shuffle that does not gather row by row can pass it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.reader.rounds import DEFAULT_UNIT_ROWS
from lakeckpt_tables.tools.bench._common import interleaved_rounds, write_delta
from lakeckpt_tables.tools.bench.raw import raw_batches, table_batches

__all__ = ["ShuffleResult", "measure_shuffle"]

OVERLAP_TOLERANCE = 0.05
RHO_TARGET = 0.05
THROUGHPUT_TARGET = 0.8


@dataclass(frozen=True)
class ShuffleResult:
    """What :func:`measure_shuffle` measured (see the module docstring)."""

    rows: int
    world_size: int
    overlap: float
    rho: float
    raw_rows_per_s: float
    shuffled_rows_per_s: float
    round_ratios: tuple[float, ...] = ()
    ceiling_ratios: tuple[float, ...] = ()

    @property
    def ceiling(self) -> float:
        """Raw read + free-permutation gather / raw: the median of the rounds' ratios."""
        return statistics.median(self.ceiling_ratios) if self.ceiling_ratios else float("nan")

    @property
    def ratio(self) -> float:
        """Shuffle on / raw: the median of the rounds' paired wall-clock ratios."""
        if self.round_ratios:
            return statistics.median(self.round_ratios)
        return self.shuffled_rows_per_s / self.raw_rows_per_s


def one_row_group_table(root: str | Path, rows: int) -> str:
    """A Delta table of ``rows`` rows (``id``, ``x``) in one Parquet row group (reused)."""
    from deltalake import DeltaTable

    uri = str(Path(root) / f"one-row-group-{rows}")
    try:
        if DeltaTable(uri).count() == rows:
            return uri
    except Exception:  # absent or half-written: build it
        pass
    ids = np.arange(rows, dtype=np.int64)
    write_delta(uri, [pa.table({"id": ids, "x": (ids % 1000).astype(np.float32)})],
                row_group_rows=rows)
    return uri


def _spearman(ids: np.ndarray) -> float:
    position = np.arange(len(ids), dtype=np.float64)
    ranks = np.empty(len(ids), dtype=np.float64)
    ranks[np.argsort(ids, kind="stable")] = position
    return float(np.corrcoef(ranks, position)[0, 1])


def _rank_epochs(uri: str, rank: int, world: int, batch_size: int,
                 unit_rows: int) -> list[np.ndarray]:
    dataset = LakeDataset(DeltaSource(uri), columns=["id"], batch_size=batch_size, seed=1,
                          epochs=2, rank=rank, world_size=world, unit_rows=unit_rows)
    batches = [b["id"].numpy() for b in dataset]
    half = len(batches) // 2  # lockstep: the same batch count in both epochs
    return [np.concatenate(batches[:half]), np.concatenate(batches[half:])]


def measure_shuffle(root: str | Path, *, rows: int = 500_000, world_size: int = 2,
                    batch_size: int = 8192, rounds: int = 5, min_seconds: float = 1.0,
                    unit_rows: int = DEFAULT_UNIT_ROWS) -> ShuffleResult:
    """Measure overlap, rank correlation and throughput on a one-row-group table.

    Args:
        root: directory that keeps the table for later runs.
        rows: rows of the table's single row group.
        world_size: simulated ranks.
        batch_size: rows per batch.
        rounds: least throughput rounds (the median ratio is kept).
        min_seconds: add rounds (up to 50) until this much time is spent.
        unit_rows: the reader's plan unit size.
    """
    uri = one_row_group_table(root, rows)
    overlaps, rhos = [], []
    for rank in range(world_size):
        first, second = _rank_epochs(uri, rank, world_size, batch_size, unit_rows)
        overlaps.append(len(np.intersect1d(first, second)) / len(first))
        rhos.append(abs(_spearman(first)))
    path = DeltaSource(uri).snapshot().units[0].path
    handles = {path: pq.ParquetFile(path)}
    index = np.random.default_rng(0).permutation(rows)

    def gathered() -> Iterator[dict[str, torch.Tensor]]:
        # the raw read gathered by a free permutation, read when iterated (inside the clock)
        table = handles[path].read_row_group(0, columns=["id", "x"]).take(index)
        yield from table_batches(table, ["id", "x"], batch_size)

    def loops() -> dict[str, Iterable[Mapping[str, torch.Tensor]]]:
        # read_ahead=0: its threads would decode while the raw loop is timed
        shuffled = LakeDataset(DeltaSource(uri), columns=["id", "x"], batch_size=batch_size,
                               seed=1, unit_rows=unit_rows, read_ahead=0)
        return {"raw": raw_batches([(path, 0)], ["id", "x"], batch_size, handles=handles),
                "shuffled": shuffled,
                "gathered": gathered()}

    runs = interleaved_rounds(loops, "id", {"raw": rows, "shuffled": rows, "gathered": rows},
                              rounds=rounds, min_seconds=min_seconds)
    return ShuffleResult(rows, world_size, float(np.mean(overlaps)), float(max(rhos)),
                         max(r["raw"].wall_rate for r in runs),
                         max(r["shuffled"].wall_rate for r in runs),
                         tuple(r["raw"].wall_s / max(r["shuffled"].wall_s, 1e-9) for r in runs),
                         tuple(r["raw"].wall_s / max(r["gathered"].wall_s, 1e-9) for r in runs))
