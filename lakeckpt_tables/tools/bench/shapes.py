"""The table shapes users train on, as local Delta tables for ``bench peers`` and ``workers``.

- ``narrow``: ``id`` int64 and three float32 features ``x``, ``y``, ``z``: decoding is cheap, so
  the per-batch work around it (bookkeeping, hand-offs, cutting batches) decides the speed;
- ``tokens``: ``id`` int64, ``x`` float32 and ``tokens`` list<int32> of 8-64 tokens: decoding
  the list column dominates.

Both default to 4M rows in 8 files of 8 row groups each (64 row groups of 62,500 rows), the
shape of the figures in issue 20; smaller with ``rows``, ``files`` and ``row_groups``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lakeckpt_tables.tools.bench._common import write_delta

__all__ = ["DEFAULT_FILES", "DEFAULT_ROWS", "DEFAULT_ROW_GROUPS", "SHAPES", "ShapeTable",
           "ensure_shape_table"]

DEFAULT_ROWS = 4_000_000
DEFAULT_FILES = 8
DEFAULT_ROW_GROUPS = 64

SHAPES = {
    "narrow": ("id", "x", "y", "z"),
    "tokens": ("id", "x", "tokens"),
}
_TYPES = {"narrow": "id int64, x/y/z float32", "tokens": "id int64, x float32, tokens "
          "list<int32> of 8-64"}


@dataclass(frozen=True)
class ShapeTable:
    """A built table of one shape.

    Attributes:
        shape: ``"narrow"`` or ``"tokens"``.
        uri: the Delta table (a local path).
        files: its data files, in order.
        rows: rows in all.
        row_groups: row groups in all.
    """

    shape: str
    uri: str
    files: tuple[str, ...]
    rows: int
    row_groups: int

    @property
    def columns(self) -> tuple[str, ...]:
        return SHAPES[self.shape]

    def describe(self) -> str:
        """The shape as every figure names it."""
        return (f"{self.shape} table ({_TYPES[self.shape]}): {self.rows:,} rows, "
                f"{len(self.files)} files, {self.row_groups} row groups")


def ensure_shape_table(root: str | Path, shape: str, rows: int = DEFAULT_ROWS, *,
                       files: int = DEFAULT_FILES,
                       row_groups: int = DEFAULT_ROW_GROUPS) -> ShapeTable:
    """The ``shape`` table of ``rows`` rows under ``root``, built unless a run built it there.

    Raises:
        ValueError: an unknown shape, or fewer rows than files or row groups.
    """
    if shape not in SHAPES:
        raise ValueError(f"unknown table shape {shape!r}; choose among {', '.join(SHAPES)}")
    if not 0 < files <= row_groups <= rows:
        raise ValueError(f"need 0 < files ({files}) <= row groups ({row_groups}) <= rows "
                         f"({rows})")
    path = Path(root) / f"{shape}-{rows}-{files}-{row_groups}"
    table = _existing(path, shape, rows)
    if table is not None:
        return table
    write_delta(path, _parts(shape, rows, files), row_group_rows=math.ceil(rows / row_groups))
    table = _existing(path, shape, rows)
    assert table is not None, path
    return table


def _existing(path: Path, shape: str, rows: int) -> ShapeTable | None:
    if not (path / "_delta_log").is_dir():
        return None
    from deltalake import DeltaTable

    found = tuple(sorted(DeltaTable(str(path)).file_uris()))
    metas = [pq.ParquetFile(f).metadata for f in found]
    if sum(m.num_rows for m in metas) != rows:
        return None
    return ShapeTable(shape, str(path), found, rows, sum(m.num_row_groups for m in metas))


def _parts(shape: str, rows: int, files: int) -> Iterator[pa.Table]:
    """One part (one data file) at a time: a 4M-row token table is ~600 MB in memory."""
    rng = np.random.default_rng(0)
    for k in range(files):
        lo, hi = rows * k // files, rows * (k + 1) // files
        n = hi - lo
        columns: dict[str, pa.Array] = {"id": pa.array(np.arange(lo, hi, dtype=np.int64))}
        columns["x"] = pa.array(rng.standard_normal(n, dtype=np.float32))
        if shape == "narrow":
            columns["y"] = pa.array(rng.standard_normal(n, dtype=np.float32))
            columns["z"] = pa.array(rng.standard_normal(n, dtype=np.float32))
        else:
            lengths = rng.integers(8, 65, n)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            values = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
            columns["tokens"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        yield pa.table(columns)
