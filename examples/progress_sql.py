"""Progress and audit queries over a checkpoint root's ledger, in plain SQL with DuckDB.

The ledger is a Delta table (``<root>/_ledger``) holding one row per committed checkpoint, per
consumed row range (run, checkpoint, rank, worker, segment, epoch, file, row group, rows) and
per event (follow segments formed, commits skipped). DuckDB reads it through Arrow: no DuckDB
extension is needed (none can be downloaded here), ``DeltaTable(uri).to_pyarrow_dataset()`` is
registered as a view and everything else is SQL.

It prints: the runs; progress per run, segment, epoch and rank; rows consumed per checkpoint;
the follow segments and skipped commits; which checkpoints consumed a given data file (the
audit question "which runs trained on this file?"); and whether consumption was exactly once
per row group, checked against the row group sizes read from the Parquet footers.

    python examples/progress_sql.py --root /path/to/checkpoints [--file DATA_FILE]
    python examples/progress_sql.py          # makes a ledger first: runs follow_delta.py and
                                             # train_delta.py into one checkpoint root

The last line says ``PROOF OK`` (exit 0) when no row group was consumed twice by a run, and
every finished run (a ``run_finished`` event, or a last checkpoint tagged ``final``) consumed
each row group of every segment and epoch it read exactly once; ``PROOF FAILED`` (exit 1)
otherwise.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from lakeckpt_tables.ledger import DeltaLedger

# ------------------------------------------------------------------------------ views

VIEWS = """
CREATE VIEW checkpoints AS
    SELECT run_id, step, checkpoint_id, parent_id, committed_at, model_location,
           source_format, source_location, source_version, world_size, tags, wall_time_s
    FROM ledger WHERE record = 'checkpoint';

CREATE VIEW consumption AS
    SELECT run_id, step, checkpoint_id, committed_at, rank, worker, segment, epoch, file,
           row_group, row_start, row_end, rows
    FROM ledger WHERE record = 'consumption';

CREATE VIEW events AS
    SELECT run_id, step, checkpoint_id, committed_at, event, detail
    FROM ledger WHERE record = 'event';
"""

# ---------------------------------------------------------------------------- queries

RUNS = """
SELECT run_id,
       count(*)                                   AS checkpoints,
       max(step)                                  AS last_step,
       max(committed_at)                          AS last_commit,
       max(world_size)                            AS ranks,
       run_id IN (SELECT run_id FROM events WHERE event = 'run_finished')
           OR list_contains(arg_max(tags, step), 'final') AS finished
FROM checkpoints
GROUP BY run_id
ORDER BY run_id
"""

PROGRESS = """
SELECT run_id, segment, epoch, rank,
       count(DISTINCT worker)                 AS workers,
       sum(rows)                              AS rows,
       count(DISTINCT file)                   AS files,
       count(DISTINCT (file, row_group))      AS row_groups,
       max(step)                              AS last_step
FROM consumption
GROUP BY ALL
ORDER BY ALL
"""

PER_CHECKPOINT = """
SELECT run_id, step,
       sum(rows)                                                        AS rows,
       sum(sum(rows)) OVER (PARTITION BY run_id ORDER BY step)          AS cumulative,
       count(*)                                                         AS records
FROM consumption
GROUP BY run_id, step
ORDER BY run_id, step
"""

SEGMENTS = """
SELECT run_id, step AS at_step, event,
       CAST(detail ->> '$.segment' AS INTEGER)                          AS segment,
       CASE WHEN event = 'segment'
            THEN '(' || (detail ->> '$.from_version') || ', ' || (detail ->> '$.to_version')
                 || ']'
            ELSE detail ->> '$.version' END                             AS versions,
       CAST(detail ->> '$.rows' AS BIGINT)                              AS rows,
       CAST(detail ->> '$.files' AS BIGINT)                             AS files,
       regexp_extract(coalesce(detail ->> '$.reason', ''), '^[^:]*')    AS skipped_because
FROM events
WHERE event IN ('segment', 'skipped_commit')
ORDER BY run_id, segment, event
"""

WHO_CONSUMED_FILE = """
SELECT run_id, step, checkpoint_id, committed_at,
       list(DISTINCT row_group ORDER BY row_group) AS row_groups,
       sum(rows)                                   AS rows
FROM consumption
WHERE file = $file
GROUP BY run_id, step, checkpoint_id, committed_at
ORDER BY run_id, step
"""

WHAT_TRAINED = """
SELECT regexp_extract(file, '[^/]*$') AS file, row_group, segment, epoch, rank, worker,
       row_start, row_end, rows
FROM consumption
WHERE checkpoint_id = $checkpoint
ORDER BY file, row_group, row_start
"""

# Per (run, segment, epoch, row group): the rows consumed must add up to the row group's size,
# and exact ranges (rows = row_end - row_start) must not overlap. A record where a checkpoint
# fell inside a shuffled window gives the range and the count consumed from it; the next
# checkpoint records the rest, so the counts still add up. Per (run, segment, epoch), the rows
# must be those of the segment: the pinned snapshot's (segment 0; runs pinned to one version),
# or what the ledger's "segment" event says was appended.
EXACTLY_ONCE = """
WITH per_group AS (
    SELECT run_id, segment, epoch, file, row_group, sum(rows) AS consumed
    FROM consumption
    GROUP BY ALL
),
exact AS (
    SELECT run_id, segment, epoch, file, row_group, row_start,
           max(row_end) OVER (PARTITION BY run_id, segment, epoch, file, row_group
                              ORDER BY row_start, row_end
                              ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
    FROM consumption
    WHERE rows = row_end - row_start
),
overlapping AS (
    SELECT DISTINCT run_id, segment, epoch, file, row_group
    FROM exact WHERE row_start < reach
),
checked AS (
    SELECT p.*, u.rows AS size, o.run_id IS NOT NULL AS overlapped
    FROM per_group p
    JOIN units u USING (file, row_group)
    LEFT JOIN overlapping o USING (run_id, segment, epoch, file, row_group)
),
pinned AS (  -- the one version each run pinned (runs that re-pinned epochs are left out)
    SELECT run_id, any_value(source_location) AS location, any_value(source_version) AS version
    FROM checkpoints
    WHERE source_location IS NOT NULL
    GROUP BY run_id
    HAVING count(DISTINCT source_version) = 1
),
segment_rows AS (
    SELECT p.run_id, 0 AS segment, sum(u.rows) AS expected
    FROM pinned p JOIN pinned_units u ON u.location = p.location AND u.version = p.version
    GROUP BY ALL
    UNION ALL
    SELECT run_id, CAST(detail ->> '$.segment' AS BIGINT), CAST(detail ->> '$.rows' AS BIGINT)
    FROM events WHERE event = 'segment'
),
untouched AS (  -- row groups of the pinned snapshot never consumed in an epoch the run read
    SELECT e.run_id, 0 AS segment, e.epoch, count(*) AS untouched
    FROM (SELECT DISTINCT run_id, epoch FROM consumption WHERE segment = 0) e
    JOIN pinned p USING (run_id)
    JOIN pinned_units u ON u.location = p.location AND u.version = p.version
    WHERE NOT EXISTS (SELECT 1 FROM consumption x
                      WHERE x.run_id = e.run_id AND x.segment = 0 AND x.epoch = e.epoch
                        AND x.file = u.file AND x.row_group = u.row_group)
    GROUP BY ALL
)
SELECT k.run_id, k.segment, k.epoch,
       count(*)                                                      AS row_groups,
       count(*) FILTER (WHERE consumed = size AND NOT overlapped)    AS exactly_once,
       count(*) FILTER (WHERE consumed < size AND NOT overlapped)    AS partial,
       count(*) FILTER (WHERE consumed > size OR overlapped)         AS twice,
       coalesce(any_value(t.untouched), 0)                           AS untouched,
       sum(consumed)                                                 AS rows,
       any_value(s.expected)                                         AS segment_rows
FROM checked k
LEFT JOIN untouched t USING (run_id, segment, epoch)
LEFT JOIN segment_rows s USING (run_id, segment)
GROUP BY ALL
ORDER BY ALL
"""

VERDICT = """
SELECT q.run_id, r.finished,
       sum(q.twice)                                                            AS twice,
       sum(q.partial) + sum(q.untouched)
           + count(*) FILTER (WHERE q.rows IS DISTINCT FROM q.segment_rows)    AS incomplete
FROM exactly_once q JOIN runs r USING (run_id)
GROUP BY ALL
ORDER BY run_id
"""


def connect(root: Path) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the ledger under ``root`` and the row group sizes registered.

    The ledger is registered as the Arrow table ``DeltaLedger.to_arrow()`` reads (a ledger
    row is ~100 bytes, so a million are ~100 MB). Registering ``DeltaTable(uri)
    .to_pyarrow_dataset()`` instead would keep it lazy, but with deltalake 1.6 the dataset
    drops every file on a filter over a column the ledger writes no min/max statistics for
    (``file``, ``event``, ...): such queries would silently come back empty.
    """
    uri = str(root / "_ledger")
    if not DeltaTable.is_deltatable(uri):
        raise SystemExit(f"no ledger at {uri}: give the checkpoint root (--root)")
    con = duckdb.connect()
    con.register("ledger", DeltaLedger(uri).to_arrow())
    con.execute(VIEWS)
    pinned, units = _units(con)
    con.register("pinned_units", pinned)
    con.register("units", units)
    return con


def _units(con: duckdb.DuckDBPyConnection) -> tuple[pa.Table, pa.Table]:
    """Row group sizes, from the Parquet footers: of every pinned snapshot a checkpoint names
    (to see what was not consumed), and of every file the ledger names."""
    from lakeckpt_tables import DeltaSource

    pinned: dict[str, list[Any]] = {"location": [], "version": [], "file": [], "row_group": [],
                                    "rows": []}
    sizes: dict[tuple[str, int], int] = {}
    for fmt, location, version in con.sql(
            "SELECT DISTINCT source_format, source_location, source_version FROM checkpoints "
            "WHERE source_location IS NOT NULL").fetchall():
        if fmt != "delta":
            continue  # an Iceberg source needs its catalog: pass it in your own code
        for unit in DeltaSource(location).snapshot(version).units:
            for key, value in zip(pinned, (location, version, unit.path, unit.row_group,
                                           unit.rows), strict=True):
                pinned[key].append(value)
            sizes[(unit.path, unit.row_group)] = unit.rows
    for (path,) in con.sql("SELECT DISTINCT file FROM consumption").fetchall():
        meta = pq.ParquetFile(path).metadata
        for group in range(meta.num_row_groups):
            sizes[(path, group)] = meta.row_group(group).num_rows
    units = pa.table({"file": [f for f, _ in sizes], "row_group": [g for _, g in sizes],
                      "rows": list(sizes.values())})
    return pa.table(pinned), units


def report(con: duckdb.DuckDBPyConnection, file: str | None) -> bool:
    def show(title: str, sql: str, params: dict[str, Any] | None = None) -> None:
        print(f"\n-- {title}", flush=True)
        (con.sql(sql, params=params) if params else con.sql(sql)).show(max_width=200)

    con.execute(f"CREATE VIEW runs AS {RUNS}")
    show("runs", "SELECT * FROM runs")
    show("progress per run, segment, epoch and rank", PROGRESS)
    show("rows consumed per checkpoint", PER_CHECKPOINT)
    show("follow segments formed and commits skipped (ledger events)", SEGMENTS)
    if file is None:
        row = con.sql("SELECT file FROM consumption ORDER BY committed_at, file LIMIT 1")
        file = str(row.fetchall()[0][0])
    show(f"audit: which checkpoints consumed {file}", WHO_CONSUMED_FILE, {"file": file})
    run_id, step, checkpoint = con.sql("SELECT run_id, step, checkpoint_id FROM checkpoints "
                                       "ORDER BY run_id, step DESC LIMIT 1").fetchall()[0]
    show(f"audit: the rows that trained checkpoint {checkpoint} (run {run_id}, step {step}) "
         "since its parent", WHAT_TRAINED, {"checkpoint": checkpoint})
    con.execute(f"CREATE VIEW exactly_once AS {EXACTLY_ONCE}")
    show("exactly once per row group (vs Parquet footers)", "SELECT * FROM exactly_once")
    verdicts = con.sql(VERDICT).fetchall()
    ok = bool(verdicts)
    print()
    for run_id, finished, twice, incomplete in verdicts:
        good = twice == 0 and (incomplete == 0 or not finished)
        ok = ok and good
        state = "finished" if finished else "in progress"
        print(f"run {run_id} ({state}): {twice} row group(s) consumed more than once, "
              f"{incomplete} not (yet) consumed in full: {'OK' if good else 'FAILED'}")
    if ok:
        print(f"PROOF OK: {len(verdicts)} run(s); no row group consumed twice, every finished "
              "run consumed each row group exactly once per segment and epoch")
    else:
        print("PROOF FAILED: see the lines above")
    return ok


def make_ledger(work: Path) -> Path:
    """Fill a checkpoint root with two runs: a follow run with a crash, and a train run."""
    here = Path(__file__).resolve().parent
    root = work / "follow" / "checkpoints"
    steps = [
        [sys.executable, str(here / "follow_delta.py"), "--work", str(work / "follow"),
         "--commits", "12", "--interval", "0.2"],
        [sys.executable, str(here / "train_delta.py"), "--work", str(work / "train"), "--root",
         str(root), "--rows", "6000", "--group-rows", "500", "--batch-size", "128",
         "--checkpoint-every", "10"],
    ]
    for cmd in steps:
        print(f"$ {' '.join(Path(c).name if c.endswith('.py') else c for c in cmd[1:])}")
        done = subprocess.run(cmd, capture_output=True, text=True)
        last = done.stdout.strip().splitlines()[-1:] or [done.stderr[-2000:]]
        print(f"  {last[0]}")
        if done.returncode != 0:
            raise SystemExit(f"{cmd[1]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return root


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--root", type=Path, help="checkpoint root whose _ledger to query "
                   "(default: make one in a temporary directory)")
    p.add_argument("--file", help="data file for the audit query (default: the first one "
                   "the ledger names)")
    args = p.parse_args(argv)
    if args.root is not None:
        return 0 if report(connect(args.root), args.file) else 1
    with tempfile.TemporaryDirectory(prefix="lakeckpt-progress-sql-") as work:
        root = make_ledger(Path(work))
        return 0 if report(connect(root), args.file) else 1


if __name__ == "__main__":
    sys.exit(main())
