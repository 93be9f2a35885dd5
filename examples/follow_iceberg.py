"""Follow an Iceberg table while another process appends to it; SIGKILL the trainer; resume.

``follow_delta.py`` with an Iceberg table in a pyiceberg SQL catalog (SQLite in a temporary
directory). Three processes:

- a **writer** (a child process) appends small snapshots of new rows every ``--interval``
  seconds and, half-way, DELETEs the rows of its first append (a commit that removes rows:
  pyiceberg cannot write a ``replace``/compaction snapshot, so this is the commit follow mode
  must skip here; the trainer runs with ``on_change="skip"``);
- a **trainer** (a child process) trains with ``LakeDataset(follow=True, on_change="skip",
  max_idle=...)``, checkpointing with ``CheckpointManager`` into an Iceberg ledger in the same
  catalog;
- this script, the **parent**, which SIGKILLs the trainer once it trains appended rows,
  restarts it, and checks the result.

Iceberg snapshot ids are random, so the last snapshot cannot be named up front as
``until_version``; the trainer ends its pass after ``--max-idle`` seconds without a new
snapshot instead (allowed with one rank). A segment is never cut short (see
``lakeckpt_tables/reader/rounds.py``, NOTE [ segment boundaries ]): rows appended after the
last complete segment would wait for the next run, so ``--commits`` x ``--commit-rows`` must
be a multiple of ``--min-segment-rows``, checked below.

The proof: every row, pinned and appended (the deleted ones included: they were appended, and
a follower cannot un-train), trained exactly once, from the ids and from the ledger; the steps
lost with the crash trained again identically; the ledger's ``segment`` events tile the
snapshots after the pinned one, and the DELETE is a ``skipped_commit``.

    python examples/follow_iceberg.py

The last line says ``PROOF OK`` (exit 0) or ``PROOF FAILED`` (exit 1).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import FEATURES, StepLog, release_stdout, sql_catalog, synthetic_rows
from _follow import FollowSetup, run_follow
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import IcebergSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.ledger import IcebergLedger, LedgerEvent

COLUMNS = ["id", "x", "y"]
RUN_ID = "follow"
TABLE = "examples.follow"
LEDGER = "examples.follow_ledger"


def catalog_of(args: argparse.Namespace) -> Any:
    return sql_catalog(None, Path(args.warehouse))


# ------------------------------------------------------------------------------ writer


def writer(args: argparse.Namespace) -> int:
    """Append ``--commits`` snapshots; after ``--delete-after`` of them, delete the first."""
    table = catalog_of(args).load_table(TABLE)
    first = (args.first_id, args.first_id + args.commit_rows)
    print("ready", flush=True)
    for k in range(args.commits):
        time.sleep(args.interval)
        lo = args.first_id + k * args.commit_rows
        table.append(synthetic_rows(lo, lo + args.commit_rows, seed=args.seed))
        print(f"append {table.current_snapshot().snapshot_id} {lo} {lo + args.commit_rows}",
              flush=True)
        if k + 1 == args.delete_after:
            time.sleep(args.interval)
            # the rows of the first append file, the whole file: an Iceberg "delete" snapshot
            table.delete(f"id >= {first[0]} AND id < {first[1]}")
            print(f"nonappend {table.current_snapshot().snapshot_id} delete", flush=True)
    print(f"done {table.current_snapshot().snapshot_id}", flush=True)
    return 0


# ----------------------------------------------------------------------------- trainer


def trainer(args: argparse.Namespace) -> int:
    """Follow the table from the pinned snapshot until it stays idle, checkpointing."""
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    catalog = catalog_of(args)
    dataset = LakeDataset(
        IcebergSource(TABLE, catalog=catalog), columns=COLUMNS, batch_size=args.batch_size,
        seed=args.seed, version=args.version,  # the pinned snapshot: the same in every attempt
        follow=True, on_change="skip", poll_interval=args.poll_interval,
        min_segment_rows=args.min_segment_rows, max_idle=args.max_idle)
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=args.workers,
                                worker_init_fn=release_stdout)
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    manager = CheckpointManager(args.root, run_id=RUN_ID, keep_last=2,
                                ledger=IcebergLedger(LEDGER, catalog=catalog))

    step = manager.restore(model=model, optimizer=optimizer, dataloader=loader) or 0
    print(f"resume {step}", flush=True)
    log = StepLog(Path(args.step_log))
    saved = step
    for batch in loader:
        step += 1
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        log.write(step, batch["id"].tolist())
        print(f"step {step} {int(batch['id'].max())}", flush=True)
        if step % args.checkpoint_every == 0:
            print(f"save {step}", flush=True)
            manager.save(step, model=model, optimizer=optimizer, dataloader=loader)
            saved = step
            print(f"checkpoint {step}", flush=True)
    if saved != step:
        print(f"save {step}", flush=True)
        manager.save(step, model=model, optimizer=optimizer, dataloader=loader, tags=["final"])
        print(f"checkpoint {step}", flush=True)
    # the pass is over: say so in the ledger (progress queries tell finished runs by it)
    assert manager.ledger is not None  # rank 0 holds the ledger
    manager.ledger.record_events(RUN_ID, [LedgerEvent("run_finished", {"step": step})])
    log.close()
    print(f"done {step}", flush=True)
    return 0


# ------------------------------------------------------------------------------ parent


def parent(args: argparse.Namespace, work: Path) -> bool:
    appended = args.commits * args.commit_rows
    if appended % args.min_segment_rows or args.min_segment_rows % args.commit_rows:
        print(f"--commits x --commit-rows ({appended}) must be a multiple of "
              f"--min-segment-rows ({args.min_segment_rows}), itself a multiple of "
              "--commit-rows: a segment is never cut short, so a tail would wait for more rows")
        return False
    args.warehouse = str(work / "warehouse")
    catalog = catalog_of(args)
    catalog.create_namespace_if_not_exists("examples")
    table = catalog.create_table(TABLE, schema=synthetic_rows(0, 1).schema, properties={
        "write.parquet.row-group-limit": str(args.group_rows)})
    bounds = np.linspace(0, args.initial_rows, args.initial_files + 1).astype(int).tolist()
    for lo, hi in itertools.pairwise(bounds):
        table.append(synthetic_rows(lo, hi, seed=args.seed))
    pinned = int(table.current_snapshot().snapshot_id)
    print(f"table {TABLE} in SQLite catalog {args.warehouse}/catalog.db: {args.initial_rows} "
          f"rows at snapshot {pinned} (pinned); the writer appends {args.commits} snapshots of "
          f"{args.commit_rows} rows every {args.interval} s and deletes the rows of its first "
          f"append after append {args.delete_after}; the trainer stops {args.max_idle} s "
          "after the last snapshot")
    common = ["--warehouse", args.warehouse, "--seed", str(args.seed)]
    me = [sys.executable, str(Path(__file__).resolve())]
    writer_cmd = [*me, "--role", "writer", *common, "--first-id", str(args.initial_rows),
                  "--commits", str(args.commits), "--commit-rows", str(args.commit_rows),
                  "--interval", str(args.interval), "--delete-after", str(args.delete_after)]
    trainer_cmd = [*me, "--role", "trainer", *common, "--version", str(pinned),
                   "--root", str(work / "checkpoints"), "--batch-size", str(args.batch_size),
                   "--workers", str(args.workers), "--checkpoint-every",
                   str(args.checkpoint_every), "--min-segment-rows",
                   str(args.min_segment_rows), "--poll-interval", str(args.poll_interval),
                   "--max-idle", str(args.max_idle)]
    setup = FollowSetup(work=work, run_id=RUN_ID, initial_rows=args.initial_rows,
                        appended_rows=appended, pinned=pinned,
                        open_ledger=lambda: IcebergLedger(LEDGER, catalog=catalog_of(args)),
                        skip_text="delete", checkpoint_every=args.checkpoint_every)
    return run_follow(setup, writer_cmd, trainer_cmd)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--role", choices=["parent", "writer", "trainer"], default="parent",
                   help=argparse.SUPPRESS)
    p.add_argument("--initial-rows", type=int, default=400, help="rows before following")
    p.add_argument("--initial-files", type=int, default=2)
    p.add_argument("--commits", type=int, default=30, help="appends by the writer")
    p.add_argument("--commit-rows", type=int, default=40, help="rows per append")
    p.add_argument("--interval", type=float, default=0.25, help="seconds between appends")
    p.add_argument("--delete-after", type=int, default=None,
                   help="DELETE the first append's rows after this append (default: half-way)")
    p.add_argument("--group-rows", type=int, default=32, help="rows per row group")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--checkpoint-every", type=int, default=4, help="steps between saves")
    p.add_argument("--min-segment-rows", type=int, default=80,
                   help="appended rows a follow segment waits for")
    p.add_argument("--poll-interval", type=float, default=0.1)
    p.add_argument("--max-idle", type=float, default=3.0,
                   help="the trainer ends its pass after this long without a new snapshot")
    p.add_argument("--seed", type=int, default=0)
    # children only
    p.add_argument("--warehouse", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--version", type=int, help=argparse.SUPPRESS)
    p.add_argument("--first-id", type=int, help=argparse.SUPPRESS)
    p.add_argument("--step-log", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.delete_after is None:
        args.delete_after = max(args.commits // 2, 1)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "writer":
        return writer(args)
    if args.role == "trainer":
        return trainer(args)
    with tempfile.TemporaryDirectory(prefix="lakeckpt-follow-iceberg-") as work:
        return 0 if parent(args, Path(work)) else 1


if __name__ == "__main__":
    sys.exit(main())
