"""A writer process for follow-mode tests: appends batches of new ids to a Delta table.

Append ``i`` (from 0) writes the ids ``[lo, hi)`` that :func:`appends` gives, as one commit, then
the writer sleeps ``--interval`` seconds. With ``--optimize-after k`` an OPTIMIZE (compaction:
a ``dataChange=false`` commit) follows the ``k``-th append. ``--go`` and ``--hold-after`` /
``--release`` gate the writer on files, so that a test decides when appends happen relative to a
follower. Every commit is printed, flushed, as ``append <version> <lo> <hi>`` or
``optimize <version>``; the last line is ``final <version>``. The table is created by the first
append if it does not exist.

Run it as a script (``python writer.py --table ...``); tests import :func:`batch` and
:func:`appends` for the rows they write themselves.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import pyarrow as pa

ROW_GROUP_ROWS = 5
"""Rows per Parquet row group: several row groups per appended file."""


def batch(lo: int, hi: int) -> pa.Table:
    """Rows with ids ``[lo, hi)``: ``x`` a 4-vector and ``y`` a noisy linear target of it."""
    ids = np.arange(lo, hi, dtype=np.int64)
    x = np.random.default_rng(lo).standard_normal((len(ids), 4), dtype=np.float32)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 4),
        "y": pa.array(x.sum(axis=1) * 0.5, pa.float32()),
    })


def appends(first_id: int, count: int, rows: int) -> list[tuple[int, int]]:
    """The id ranges of ``count`` appends of about ``rows`` rows each (uneven on purpose)."""
    out, lo = [], first_id
    for i in range(count):
        n = rows + (i * 7) % 5 - 2
        out.append((lo, lo + max(n, 1)))
        lo += max(n, 1)
    return out


def append(table: str, lo: int, hi: int) -> int:
    """Append ids ``[lo, hi)`` as one commit; the new version."""
    from deltalake import DeltaTable, WriterProperties, write_deltalake

    props = WriterProperties(max_row_group_size=ROW_GROUP_ROWS, write_batch_size=ROW_GROUP_ROWS)
    write_deltalake(table, batch(lo, hi), mode="append", writer_properties=props)
    return int(DeltaTable(table).version())


def optimize(table: str) -> int:
    """Compact the table's small files (OPTIMIZE); the new version."""
    from deltalake import DeltaTable

    dt = DeltaTable(table)
    before = dt.version()
    dt.optimize.compact()
    dt = DeltaTable(table)
    if dt.version() == before:
        raise RuntimeError(f"OPTIMIZE of {table} committed nothing: too few files to compact")
    return int(dt.version())


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--table", required=True)
    p.add_argument("--first-id", type=int, required=True)
    p.add_argument("--appends", type=int, required=True)
    p.add_argument("--rows", type=int, default=8, help="about this many rows per append")
    p.add_argument("--interval", type=float, default=0.2, help="seconds between commits")
    p.add_argument("--optimize-after", type=int, default=None,
                   help="run OPTIMIZE right after this many appends")
    p.add_argument("--go", default=None, help="wait until this file exists, then write")
    p.add_argument("--hold-after", type=int, default=None,
                   help="after this many appends, wait until the --release file exists")
    p.add_argument("--release", default=None)
    return p.parse_args()


def _wait_for(path: str | None) -> None:
    while path is not None and not os.path.exists(path):
        time.sleep(0.02)


def main() -> int:
    a = _args()
    _wait_for(a.go)
    version = -1
    for i, (lo, hi) in enumerate(appends(a.first_id, a.appends, a.rows)):
        if a.hold_after == i:
            print(f"hold {version}", flush=True)
            _wait_for(a.release)
        version = append(a.table, lo, hi)
        print(f"append {version} {lo} {hi}", flush=True)
        if a.optimize_after == i + 1:
            time.sleep(a.interval)
            version = optimize(a.table)
            print(f"optimize {version}", flush=True)
        time.sleep(a.interval)
    print(f"final {version}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
