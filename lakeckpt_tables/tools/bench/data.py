"""Synthetic Delta tables for the benchmarks: numeric columns, several files, many row groups."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from lakeckpt_tables.tools.bench._common import write_delta

__all__ = ["ROW_GROUP_ROWS", "SyntheticTable", "ensure_synthetic_table", "file_count",
           "synthetic_parts", "warm_page_cache"]

ROW_GROUP_ROWS = 131_072
"""Rows per Parquet row group: the ~128k of a typical writer's default."""

_MAX_FILES = 8
_ROWS_PER_FILE = 500_000
_SCHEMA = pa.schema([("id", pa.int64()), ("x", pa.float32())])


@dataclass(frozen=True)
class SyntheticTable:
    """A local Delta table of ``rows`` rows: ``id`` (int64, 0..rows-1) and ``x`` (float32).

    Attributes:
        uri: table root (a local path).
        rows: total rows.
        files: data files.
        reused: True when an existing table under the same path was taken as is.
    """

    uri: str
    rows: int
    files: int
    reused: bool

    def describe(self) -> str:
        """The shape as the figures name it."""
        return (f"narrow table (id int64, x float32): {self.rows:,} rows, {self.files} files, "
                f"row groups of {ROW_GROUP_ROWS:,} rows")


def file_count(rows: int) -> int:
    """Several files even for a tiny table, up to 8 of ~1.25M rows for the default 10M."""
    return 1 if rows < 2 else min(_MAX_FILES, max(2, rows // _ROWS_PER_FILE))


def ensure_synthetic_table(root: str | Path, rows: int, *, seed: int = 0) -> SyntheticTable:
    """Build a synthetic table under ``root``, or reuse the one a previous run built there.

    The table lives in ``root/read-<rows>``; a directory there that is not a Delta table of
    exactly ``rows`` rows with the expected schema (an interrupted build, say) is rebuilt.

    Args:
        root: directory for benchmark tables (created if missing).
        rows: total rows; split into up to 8 files of row groups of :data:`ROW_GROUP_ROWS`.
        seed: seed of the ``x`` values.
    """
    if rows < 1:
        raise ValueError(f"rows must be positive, got {rows}")
    path = Path(root) / f"read-{rows}"
    files = file_count(rows)
    if _is_complete(path, rows):
        return SyntheticTable(str(path), rows, files, reused=True)
    _write(path, rows, files, seed)
    return SyntheticTable(str(path), rows, files, reused=False)


def synthetic_parts(rows: int, files: int, seed: int = 0) -> Iterator[pa.Table]:
    """The synthetic table's rows, one Arrow table per data file."""
    rng = np.random.default_rng(seed)
    bounds = [rows * i // files for i in range(files + 1)]
    for lo, hi in itertools.pairwise(bounds):
        yield pa.table({"id": np.arange(lo, hi, dtype=np.int64),
                        "x": rng.random(hi - lo, dtype=np.float32)}, schema=_SCHEMA)


def _write(path: Path, rows: int, files: int, seed: int) -> None:
    write_delta(path, synthetic_parts(rows, files, seed), row_group_rows=ROW_GROUP_ROWS)


def _is_complete(path: Path, rows: int) -> bool:
    if not (path / "_delta_log").is_dir():
        return False
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    try:
        dt = DeltaTable(str(path))
        adds = pa.table(dt.get_add_actions(flatten=True))
        schema = pa.schema(dt.schema().to_arrow())
    except (DeltaError, OSError):
        return False
    if schema.names != _SCHEMA.names:
        return False
    counts = adds.column("num_records").to_pylist() if "num_records" in adds.column_names else []
    return len(counts) == len(adds) and sum(counts) == rows


def warm_page_cache(paths: list[str]) -> int:
    """Read every file once, so the measurements that follow see a warm page cache.

    Returns:
        Bytes read.
    """
    total = 0
    for p in sorted(set(paths)):
        with open(p, "rb") as f:
            while chunk := f.read(1 << 24):
                total += len(chunk)
    return total

