"""How far along is each run? Progress and audit queries in SQL, on a Delta or an Iceberg ledger.

``lakeckpt_tables.audit.connect(target)`` gives a DuckDB connection whose views read one
consistent version of the ledger through its table format (never by globbing Parquet files, so
a compacted ledger is not counted twice): ``checkpoints``, ``consumption``, ``progress``,
``events``, ``recoveries``, ``follow_lag`` (columns in catalog/README.md). The same queries run
on the Delta ledger under a checkpoint root and on an Iceberg ledger in a SQL catalog.

    python examples/progress_sql.py                        # a run on a Delta ledger (temp dir)
    python examples/progress_sql.py --backend iceberg      # the same on an Iceberg ledger
    python examples/progress_sql.py --root /path/to/ckpts  # your checkpoint root
    python examples/progress_sql.py --ledger iceberg:ml.ledger --catalog-uri sqlite:///c.db

Without ``--root``/``--ledger`` the script trains a small run first: it stops half way (a
preempted job), then a second job resumes it to the end. It first queries the still empty
ledger (empty views, same columns). The last line says ``PROOF OK`` (exit 0) when the views
agree with the row ids the training saw and ``lakeckpt verify`` proves exactly-once from the
ledger; ``PROOF FAILED`` (exit 1) otherwise.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from lakeckpt_tables.audit import connect, verify

PROGRESS = """
SELECT run_id, segment, epoch, rows_consumed, rows_in_pass, percent,
       round(rows_per_s) AS rows_per_s, round(eta_s, 1) AS eta_s, last_step
FROM progress ORDER BY ALL
"""

RUNS = """
SELECT run_id, count(*) FILTER (WHERE status = 'committed') AS checkpoints,
       max(step) AS last_step, max(world_size) AS ranks,
       CAST(sum(rows) FILTER (WHERE status = 'committed') AS BIGINT) AS rows_trained
FROM checkpoints GROUP BY run_id ORDER BY run_id
"""

PER_CHECKPOINT = """
SELECT run_id, step, status, rows,
       CAST(sum(rows) OVER (PARTITION BY run_id ORDER BY step) AS BIGINT) AS cumulative
FROM checkpoints ORDER BY run_id, step
"""

WHO_READ_FILE = """
SELECT run_id, step, list(DISTINCT row_group ORDER BY row_group) AS row_groups,
       CAST(sum(rows) AS BIGINT) AS rows
FROM consumption WHERE file = $file AND status = 'committed'
GROUP BY ALL ORDER BY ALL
"""


def show(con: Any, title: str, sql: str, params: dict[str, Any] | None = None) -> None:
    print(f"\n-- {title}", flush=True)
    con.sql(sql, params=params).show(max_width=160)


def report(target: Any, *, catalog: Any = None) -> Any:
    """Print the queries; returns the connection for further checks."""
    con = connect(target, catalog=catalog)
    (where, version), = con.sql("SELECT ledger, version FROM ledgers").fetchall()
    print(f"ledger {where} at version {version}")
    show(con, "runs", RUNS)
    show(con, "progress per run and pass", PROGRESS)
    show(con, "rows per checkpoint", PER_CHECKPOINT)
    show(con, "restores", "SELECT * FROM recoveries")
    files = con.sql("SELECT DISTINCT file FROM consumption ORDER BY file LIMIT 1").fetchall()
    if files:
        show(con, f"which checkpoints read {Path(files[0][0]).name}", WHO_READ_FILE,
             {"file": files[0][0]})
    return con


# ------------------------------------------------------------------ a run to look at


def make_table(path: Path, rows: int) -> None:
    from deltalake import WriterProperties, write_deltalake

    ids = np.arange(rows, dtype=np.int64)
    props = WriterProperties(max_row_group_size=250)
    for part in np.array_split(ids, 4):
        write_deltalake(str(path), pa.table({"id": part, "x": part.astype(np.float32)}),
                        mode="append", writer_properties=props)


def train(table: Path, root: Path, ledger: Any, *, stop_after: int | None) -> list[int]:
    """One job: restore if there is a checkpoint, train, checkpoint every 5 steps."""
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lakeckpt_tables import DeltaSource, LakeDataset
    from lakeckpt_tables.checkpoint import CheckpointManager

    manager = CheckpointManager(root, "example", ledger=ledger)
    loader = StatefulDataLoader(LakeDataset(DeltaSource(str(table)), columns=["id"],
                                            batch_size=64, seed=7, epochs=2), batch_size=None)
    model = torch.nn.Linear(1, 1)
    step = manager.restore(model=model, dataloader=loader) or 0
    seen: list[int] = []
    for batch in loader:
        step += 1
        seen.extend(int(i) for i in batch["id"])
        if step % 5 == 0:
            manager.save(step, model=model, dataloader=loader)
            if stop_after is not None and step >= stop_after:
                return seen  # preempted: what came after the save was never trained
    manager.save(step + 1, model=model, dataloader=loader, tags=("final",))
    return seen


def demo(backend: str, work: Path, rows: int) -> bool:
    table, root = work / "table", work / "checkpoints"
    make_table(table, rows)
    catalog = None
    if backend == "iceberg":
        from pyiceberg.catalog.sql import SqlCatalog

        from lakeckpt_tables.ledger import IcebergLedger

        catalog = SqlCatalog("lakeckpt", uri=f"sqlite:///{work}/catalog.db",
                             warehouse=f"file://{work}/warehouse")
        ledger: Any = IcebergLedger("ml.ledger", catalog=catalog)
        target: Any = "iceberg:ml.ledger"
    else:
        from lakeckpt_tables.ledger import DeltaLedger

        ledger = DeltaLedger(str(root / "_ledger"))
        target = str(root)
    print("== an empty ledger: empty views, same columns")
    empty = report(target, catalog=catalog)
    print(f"progress columns: {empty.sql('SELECT * FROM progress').columns}")

    seen = train(table, root, ledger, stop_after=rows // 64 // 2)
    print(f"\n== job 1 was preempted after {len(seen)} rows")
    report(target, catalog=catalog)
    seen += train(table, root, ledger, stop_after=None)
    print("\n== job 2 resumed it to the end")
    con = report(target, catalog=catalog)

    progress = con.sql("SELECT epoch, rows_consumed, rows_in_pass FROM progress").fetchall()
    trained = np.bincount(np.array(seen), minlength=rows)
    twice = bool((trained == 2).all())
    ok = progress == [(0, rows, rows), (1, rows, rows)] and twice
    print(f"\nprogress: {progress}; ids trained twice each (2 epochs): {twice}")
    verdicts = verify(target, catalog=catalog)
    for v in verdicts:
        print(f"verify run {v.run_id} up to step {v.step}: "
              f"{'OK' if v.ok else v.violations[0]}")
    return ok and all(v.ok for v in verdicts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--root", help="a checkpoint root to query (default: make a run first)")
    p.add_argument("--ledger", help="an Iceberg ledger to query: iceberg:<namespace.table>")
    p.add_argument("--catalog-uri", help="SQLAlchemy URI of the ledger's pyiceberg SQL catalog")
    p.add_argument("--backend", choices=("delta", "iceberg"), default="delta",
                   help="ledger of the run made when no --root/--ledger is given")
    p.add_argument("--rows", type=int, default=2000, help="rows of the synthetic table")
    args = p.parse_args(argv)
    if args.root or args.ledger:
        catalog = None
        if args.catalog_uri:
            from pyiceberg.catalog.sql import SqlCatalog

            catalog = SqlCatalog("lakeckpt", uri=args.catalog_uri)
        report(args.root or args.ledger, catalog=catalog)
        verdicts = verify(args.root or args.ledger, catalog=catalog)
        ok = all(v.ok for v in verdicts)
    else:
        with tempfile.TemporaryDirectory(prefix="lakeckpt-progress-sql-") as work:
            ok = demo(args.backend, Path(work), args.rows)
    print("PROOF OK: the views agree with the ids trained, and exactly-once verifies" if ok
          else "PROOF FAILED: see above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
