"""Train a tiny model from a Delta table, get preempted, restart, and resume exactly.

The README quickstart, runnable: a ``LakeDataset`` over a Delta table, a torchdata
``StatefulDataLoader`` with worker processes, and a ``CheckpointManager`` that commits model,
optimizer, RNG and reader position together to the ledger (a Delta table under ``--root``).

The run is done as two jobs, like a preempted training job and its restart: the first job
trains until ``--stop-after`` steps, saves, and exits; the second job restores the latest
checkpoint and trains to the end. Then the script proves, from the row ids each step trained
and, independently, from the ledger's consumption records and the Parquet files, that every row
of the table was trained exactly once per epoch, and that the model learned.

    python examples/train_delta.py                      # a synthetic table in a temp dir
    python examples/train_delta.py --table /data/tbl    # your table (columns id, x, y)
    python examples/train_delta.py --root /tmp/ckpt     # keep the checkpoints and the ledger

Your table needs an int64 ``id`` column of unique row ids, ``x`` (lists of 4 floats) and
``y`` (float). The last line says ``PROOF OK`` (exit 0) or ``PROOF FAILED`` (exit 1).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import torch
from _common import FEATURES, Job, prove_training, write_delta  # examples/_common.py
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.ledger import LedgerEvent

COLUMNS = ["id", "x", "y"]


def train(args: argparse.Namespace, stop_after: int | None = None) -> Job:
    """The quickstart: restore if there is a checkpoint, train, checkpoint every N steps.

    With ``stop_after``, stop at the first checkpoint at or after that step, as a job that
    is told to leave (preemption) saves and exits.
    """
    torch.manual_seed(args.seed)
    manager = CheckpointManager(args.root, run_id=args.run_id, keep_last=2)
    # A restarted job must read the version the run pinned: the ledger remembers it.
    committed = manager.checkpoints()
    version = committed[-1].source_version if committed else None
    dataset = LakeDataset(DeltaSource(args.table), columns=COLUMNS, batch_size=args.batch_size,
                          seed=args.seed, epochs=args.epochs, version=version)
    # the dataset makes the batches: batch_size=None
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


def make_table(path: Path, rows: int, files: int, group_rows: int, seed: int) -> None:
    bounds = np.linspace(0, rows, files + 1).astype(int)
    write_delta(path, itertools.pairwise(bounds.tolist()),
                group_rows=group_rows, seed=seed)


def run(args: argparse.Namespace) -> bool:
    if args.table is None:
        args.table = str(Path(args.work) / "table")
        make_table(Path(args.table), args.rows, args.files, args.group_rows, args.seed)
        print(f"table: synthetic Delta table {args.table}: {args.rows:,} rows in {args.files} "
              f"files, row groups of {args.group_rows}")
    snapshot = DeltaSource(args.table).snapshot()
    print(f"table: {snapshot.describe()}, {snapshot.rows:,} rows, {len(snapshot.units)} row "
          f"groups")
    args.root = args.root or str(Path(args.work) / "checkpoints")
    print(f"checkpoints and ledger under {args.root}; run {args.run_id!r}")

    total_steps = args.epochs * -(-snapshot.rows // args.batch_size)  # about; for --stop-after
    stop_after = args.stop_after if args.stop_after is not None else total_steps // 2
    first = train(args, stop_after=stop_after)
    print(f"job 1: started at step {first.restored}, stopped after the checkpoint of step "
          f"{first.last_step} (preempted)")
    second = train(args)
    print(f"job 2: restored step {second.restored}, trained to step {second.last_step}")

    manager = CheckpointManager(args.root, run_id=args.run_id)
    assert manager.ledger is not None  # rank 0 holds the ledger
    return prove_training(first, second, _table_ids(args.table, snapshot.version),
                          args.epochs, manager.ledger, args.run_id)


def _table_ids(uri: str, version: int) -> np.ndarray[Any, Any]:
    from deltalake import DeltaTable

    ids = DeltaTable(uri, version=version).to_pyarrow_table(columns=["id"]).column("id")
    if pc.count_distinct(ids).as_py() != len(ids):
        raise SystemExit(f"{uri}: the id column must hold unique row ids")
    out: np.ndarray[Any, Any] = ids.to_numpy()
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--table", help="Delta table (id, x, y); default: a synthetic one")
    p.add_argument("--root", help="checkpoint root (default: a temporary directory)")
    p.add_argument("--run-id", default="quickstart")
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
    p.add_argument("--work", help="keep the synthetic table (and, without --root, the "
                   "checkpoints) in this directory (default: a temporary one)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.work is not None:
        Path(args.work).mkdir(parents=True, exist_ok=True)
        return 0 if run(args) else 1
    with tempfile.TemporaryDirectory(prefix="lakeckpt-train-delta-") as work:
        args.work = work
        return 0 if run(args) else 1


if __name__ == "__main__":
    sys.exit(main())
