"""What deletion-vector masks and partition constants cost at the reading layer, and how long
pinning a Delta table of many files takes (issue 9 item 8; not yet part of `lakeckpt bench`).

    .venv/bin/python scripts/cost_reading_layer.py [--files 10000] [--dir /tmp/lakeckpt-cost]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lakeckpt_tables import DeltaSource
from lakeckpt_tables.sources._deletes import Deletes
from lakeckpt_tables.sources.base import DataFile, RowGroupReader, units_from_files
from lakeckpt_tables.sources.delta import DeltaRowGroupReader
from lakeckpt_tables.sources.nulls import check_nulls
from lakeckpt_tables.types import TableIdentity


def _rows_per_second(reader: RowGroupReader, units: tuple, columns: list[str]) -> float:
    best = float("inf")
    rows = 0
    for _ in range(5):
        t0 = time.perf_counter()
        rows = sum(reader.read(u, columns).num_rows for u in units)
        best = min(best, time.perf_counter() - t0)
    return rows / best


def masks_and_constants(root: Path) -> None:
    path = str(root / "big.parquet")
    n = 2_000_000
    rng = np.random.default_rng(0)
    pq.write_table(pa.table({"id": np.arange(n, dtype=np.int64), "x": rng.random(n),
                             "y": rng.random(n).astype(np.float32)}), path,
                   row_group_size=65536)
    ident = TableIdentity("delta", str(root), "cost")
    schema = pa.schema([("id", pa.int64()), ("x", pa.float64()), ("y", pa.float32()),
                        ("part", pa.string())])
    plain, _ = units_from_files(ident, 0, [DataFile(path, None, n)])
    deletes = Deletes.from_positions(rng.choice(n, n // 100, replace=False))
    masked, _ = units_from_files(ident, 0, [DataFile(path, None, n, deletes,
                                                     (("part", "2024-01-01"),))])
    base = _rows_per_second(RowGroupReader(ident, 0), plain, ["id", "x", "y"])
    mask = _rows_per_second(RowGroupReader(ident, 0), masked, ["id", "x", "y"])
    parted = _rows_per_second(DeltaRowGroupReader(ident, 0, schema, ["part"], None), masked,
                              ["id", "x", "y", "part"])
    print(f"read: plain {base / 1e6:.1f} Mrows/s; 1% deleted {mask / base:.3f}x; "
          f"1% deleted + string partition column {parted / base:.3f}x")


def planning(root: Path, files: int) -> None:
    from deltalake import write_deltalake

    table = root / "many"
    write_deltalake(str(table), pa.table({"id": pa.array([0], pa.int64())}))
    now = int(time.time() * 1000)
    lines = [json.dumps({"commitInfo": {"operation": "WRITE", "timestamp": now}})]
    for i in range(1, files):
        name = f"part-{i:05d}-{uuid.uuid4()}.parquet"
        pq.write_table(pa.table({"id": pa.array(range(i * 10, i * 10 + 10), pa.int64())}),
                       table / name)
        stats = {"numRecords": 10, "nullCount": {"id": 0}}
        lines.append(json.dumps({"add": {
            "path": name, "size": (table / name).stat().st_size, "partitionValues": {},
            "modificationTime": now, "dataChange": True, "stats": json.dumps(stats)}}))
    (table / "_delta_log" / f"{1:020d}.json").write_text("\n".join(lines) + "\n")
    t0 = time.perf_counter()
    snap = DeltaSource(str(table)).snapshot()
    t1 = time.perf_counter()
    check_nulls(snap, ["id"], "refuse")
    t2 = time.perf_counter()
    print(f"planning: {files} files pinned in {t1 - t0:.2f} s, null check {t2 - t1:.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--dir", default="/tmp/lakeckpt-cost")
    args = parser.parse_args()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    masks_and_constants(root)
    planning(root, args.files)


if __name__ == "__main__":
    main()
