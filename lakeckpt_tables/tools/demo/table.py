"""The demo's synthetic Delta table: unique row ids, a feature vector and a learnable label.

Written in several appends with small row groups so that the reader really has to plan over
several files and several units per file, as it would on a real table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, WriterProperties, write_deltalake

__all__ = ["FEATURES", "TableInfo", "build_table"]

FEATURES = 8
_TRUE_WEIGHTS = np.linspace(-1.0, 1.0, FEATURES, dtype=np.float32)


@dataclass(frozen=True)
class TableInfo:
    """What was written: where, how many rows, and in how many pieces."""

    path: Path
    rows: int
    version: int
    files: int
    row_groups: int


def build_table(path: Path, rows: int, *, appends: int = 5, seed: int = 0) -> TableInfo:
    """Write ``rows`` rows with ids ``0..rows-1`` to a new Delta table in ``appends`` commits."""
    if rows < 1:
        raise ValueError(f"rows must be positive, got {rows}")
    appends = max(1, min(appends, rows))
    group_rows = max(1, -(-rows // (appends * 8)))  # about 8 row groups per file
    props = WriterProperties(max_row_group_size=group_rows)
    rng = np.random.default_rng(seed)
    for ids in np.array_split(np.arange(rows, dtype=np.int64), appends):
        write_deltalake(str(path), _rows(ids, rng), mode="append", writer_properties=props)
    return _describe(path, DeltaTable(str(path)))


def _rows(ids: np.ndarray[Any, Any], rng: np.random.Generator) -> pa.Table:
    """One append: features ``x`` (list<float32> of FEATURES) and a noisy linear label ``y``."""
    x = rng.standard_normal((len(ids), FEATURES), dtype=np.float32)
    noise = rng.standard_normal(len(ids), dtype=np.float32)
    y = (x @ _TRUE_WEIGHTS + np.float32(0.1) * noise).astype(np.float32)
    offsets = pa.array(np.arange(0, (len(ids) + 1) * FEATURES, FEATURES, dtype=np.int32))
    vectors = pa.ListArray.from_arrays(offsets, pa.array(x.ravel()))
    return pa.table({"id": ids, "x": vectors, "y": y})


def _describe(path: Path, table: DeltaTable) -> TableInfo:
    adds = pa.table(table.get_add_actions(flatten=True))
    files = [path / str(p) for p in adds.column("path").to_pylist()]
    groups = sum(pq.ParquetFile(f).metadata.num_row_groups for f in files)
    rows = int(pc.sum(adds.column("num_records")).as_py())
    return TableInfo(path, rows, int(table.version()), len(files), groups)
