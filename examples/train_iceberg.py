"""Train a tiny model from an Iceberg table, get preempted, restart, and resume exactly.

The same as ``train_delta.py`` with an Iceberg table in a pyiceberg SQL catalog: SQLite in a
temporary directory by default, or any SQLAlchemy URL with ``--catalog-uri`` (for instance
``postgresql+psycopg://user:password@host:5432/db``). The ledger is an Iceberg table in the
same catalog, so the catalog holds both the data and the record of which rows trained which
checkpoint.

The first job trains until ``--stop-after`` steps, saves and exits (a preemption); the second
restores and finishes. The script then proves, from the ids each step trained and from the
ledger's consumption records and the Parquet files, that every row was trained exactly once
per epoch.

    python examples/train_iceberg.py
    python examples/train_iceberg.py --catalog-uri postgresql+psycopg://u:pw@127.0.0.1/db
    python examples/train_iceberg.py --catalog-uri ... --warehouse /shared/wh --table ns.tbl

Without ``--table`` a synthetic table is created (and dropped at the end when the warehouse
is temporary). The last line says ``PROOF OK`` (exit 0) or ``PROOF FAILED`` (exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import FEATURES, Job, prove_training, sql_catalog, synthetic_rows
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import IcebergSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.ledger import IcebergLedger, LedgerEvent

COLUMNS = ["id", "x", "y"]


def train(args: argparse.Namespace, catalog: Any, stop_after: int | None = None) -> Job:
    """The quickstart on Iceberg: restore if there is a checkpoint, train, checkpoint."""
    torch.manual_seed(args.seed)
    ledger = IcebergLedger(args.ledger, catalog=catalog)
    manager = CheckpointManager(args.root, run_id=args.run_id, ledger=ledger, keep_last=2)
    committed = manager.checkpoints()  # a restart reads the snapshot the run pinned
    version = committed[-1].source_version if committed else None
    dataset = LakeDataset(IcebergSource(args.table, catalog=catalog), columns=COLUMNS,
                          batch_size=args.batch_size, seed=args.seed, epochs=args.epochs,
                          version=version)
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=args.workers)
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    step = manager.restore(model=model, optimizer=optimizer, dataloader=loader) or 0
    job = Job(step, step, [], [])
    saved = step
    for batch in loader:
        step += 1
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        job.ids.extend(batch["id"].tolist())
        job.losses.append(loss.item())
        if step % args.checkpoint_every == 0:
            manager.save(step, model=model, optimizer=optimizer, dataloader=loader)
            saved = step
            if stop_after is not None and step >= stop_after:
                break
    else:  # the end of the run
        if saved != step:  # checkpoint the last steps too
            manager.save(step, model=model, optimizer=optimizer, dataloader=loader,
                         tags=["final"])
        # say so in the ledger (examples/progress_sql.py tells finished runs by it)
        assert manager.ledger is not None  # rank 0 holds the ledger
        manager.ledger.record_events(args.run_id, [LedgerEvent("run_finished", {"step": step})])
    job.last_step = step
    return job


def make_table(catalog: Any, identifier: str, rows: int, files: int, group_rows: int,
               seed: int) -> None:
    """A new Iceberg table of ``rows`` rows written in ``files`` appends (one file each)."""
    catalog.create_namespace_if_not_exists(identifier.rsplit(".", 1)[0])
    table = catalog.create_table(identifier, schema=synthetic_rows(0, 1).schema,
                                 properties={"write.parquet.row-group-limit": str(group_rows)})
    bounds = np.linspace(0, rows, files + 1).astype(int).tolist()
    for lo, hi in itertools.pairwise(bounds):
        table.append(synthetic_rows(lo, hi, seed=seed))


def run(args: argparse.Namespace, work: Path) -> bool:
    temporary = args.warehouse is None
    warehouse = Path(args.warehouse) if args.warehouse else work / "warehouse"
    catalog = sql_catalog(args.catalog_uri, warehouse)
    suffix = uuid.uuid4().hex[:8]
    created = []
    if args.table is None:
        args.table = f"examples.quickstart_{suffix}"
        make_table(catalog, args.table, args.rows, args.files, args.group_rows, args.seed)
        created.append(args.table)
        print(f"table: synthetic Iceberg table {args.table}: {args.rows:,} rows in "
              f"{args.files} files, row groups of {args.group_rows}")
    if args.ledger is None:
        args.ledger = f"examples.ledger_{suffix}"
        created.append(args.ledger)
    args.run_id = args.run_id or f"quickstart-{suffix}"
    args.root = args.root or str(work / "checkpoints")
    try:
        snapshot = IcebergSource(args.table, catalog=catalog).snapshot()
        print(f"table: {snapshot.describe()}, {snapshot.rows:,} rows, {len(snapshot.units)} "
              f"row groups; catalog {catalog.properties['uri'].split('@')[-1]}")
        print(f"model files under {args.root}; ledger iceberg:{args.ledger}; run "
              f"{args.run_id!r}")
        total_steps = args.epochs * -(-snapshot.rows // args.batch_size)
        stop_after = args.stop_after if args.stop_after is not None else total_steps // 2
        first = train(args, catalog, stop_after=stop_after)
        print(f"job 1: started at step {first.restored}, stopped after the checkpoint of step "
              f"{first.last_step} (preempted)")
        second = train(args, catalog)
        print(f"job 2: restored step {second.restored}, trained to step {second.last_step}")
        table = catalog.load_table(args.table)
        ids = table.scan(snapshot_id=snapshot.version, selected_fields=("id",)).to_arrow()
        return prove_training(first, second, ids.column("id").to_numpy(), args.epochs,
                              IcebergLedger(args.ledger, catalog=catalog), args.run_id)
    finally:
        if temporary and args.catalog_uri is not None:
            # the files go with the temporary warehouse: leave no dangling catalog entries
            for identifier in created:
                with contextlib.suppress(Exception):
                    catalog.drop_table(identifier)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--catalog-uri", help="SQLAlchemy URL of the pyiceberg SQL catalog "
                   "(default: SQLite in the warehouse directory)")
    p.add_argument("--warehouse", help="warehouse directory (default: a temporary one)")
    p.add_argument("--table", help="namespace.table (id, x, y); default: a synthetic one")
    p.add_argument("--ledger", help="namespace.table of the Iceberg ledger (default: a new one)")
    p.add_argument("--root", help="where model files go (default: a temporary directory)")
    p.add_argument("--run-id", default=None, help="default: a new run id")
    p.add_argument("--rows", type=int, default=40_000, help="rows of the synthetic table")
    p.add_argument("--files", type=int, default=4, help="files of the synthetic table")
    p.add_argument("--group-rows", type=int, default=2048, help="rows per row group")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--checkpoint-every", type=int, default=40, help="steps between saves")
    p.add_argument("--stop-after", type=int, default=None,
                   help="job 1 stops at its first checkpoint at or after this step "
                   "(default: half-way)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lakeckpt-train-iceberg-") as work:
        return 0 if run(args, Path(work)) else 1


if __name__ == "__main__":
    sys.exit(main())
