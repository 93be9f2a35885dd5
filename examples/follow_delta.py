"""Follow a Delta table while another process appends to it; SIGKILL the trainer; resume.

Three processes:

- a **writer** (a child process) appends small commits of new rows to a Delta table every
  ``--interval`` seconds, and runs an OPTIMIZE half-way (a commit that only rearranges rows);
- a **trainer** (a child process) trains from the table with ``LakeDataset(follow=True,
  until_version=END)``: first the rows of the pinned version, then, segment by segment, the
  rows appended since, checkpointing with ``CheckpointManager`` every few steps;
- this script, the **parent**: it starts both, SIGKILLs the trainer once it is training
  appended rows (a real crash, between two checkpoints), restarts it (it restores the latest
  checkpoint and follows on), and checks what happened.

The proof: every row (the pinned ones and every appended one) was trained exactly once, from
the ids each step trained and, independently, from the ledger's consumption records and the
Parquet files; the steps lost with the crash were trained again identically; and the ledger's
``segment`` events tile the versions after the pinned one, with the OPTIMIZE recorded as a
``skipped_commit``.

    python examples/follow_delta.py
    python examples/follow_delta.py --commits 40 --interval 0.2 --workers 2

The last line says ``PROOF OK`` (exit 0) or ``PROOF FAILED`` (exit 1).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import FEATURES, StepLog, release_stdout, synthetic_rows, write_delta
from _follow import FollowSetup, run_follow
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.ledger import LedgerEvent, open_ledger

COLUMNS = ["id", "x", "y"]
RUN_ID = "follow"


# ------------------------------------------------------------------------------ writer


def writer(args: argparse.Namespace) -> int:
    """Append ``--commits`` commits of ``--commit-rows`` new rows, OPTIMIZE after one of them."""
    from deltalake import DeltaTable, WriterProperties, write_deltalake

    props = WriterProperties(max_row_group_size=args.group_rows)
    version = args.version
    print("ready", flush=True)
    for k in range(args.commits):
        time.sleep(args.interval)
        lo = args.first_id + k * args.commit_rows
        write_deltalake(args.table, synthetic_rows(lo, lo + args.commit_rows, seed=args.seed),
                        mode="append", writer_properties=props)
        version += 1
        print(f"append {version} {lo} {lo + args.commit_rows}", flush=True)
        if k + 1 == args.optimize_after:
            time.sleep(args.interval)
            DeltaTable(args.table).optimize.compact()  # dataChange=false: no row changes
            version += 1
            print(f"nonappend {version} OPTIMIZE", flush=True)
    latest = DeltaTable(args.table).version()
    if latest != version:
        print(f"error: expected the table at version {version}, it is at {latest} (another "
              "writer?)", file=sys.stderr)
        return 1
    print(f"done {version}", flush=True)
    return 0


# ----------------------------------------------------------------------------- trainer


def trainer(args: argparse.Namespace) -> int:
    """Follow the table from the pinned version to ``--until-version``, checkpointing."""
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    dataset = LakeDataset(
        DeltaSource(args.table), columns=COLUMNS, batch_size=args.batch_size, seed=args.seed,
        version=args.version,  # the pinned version: the same in every attempt
        follow=True, until_version=args.until_version, poll_interval=args.poll_interval,
        min_segment_rows=args.min_segment_rows,
        max_idle=args.max_idle)  # a safety net: end if the writer died
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=args.workers,
                                worker_init_fn=release_stdout)
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    manager = CheckpointManager(args.root, run_id=RUN_ID, keep_last=2)

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
    table = work / "table"
    bounds = np.linspace(0, args.initial_rows, args.initial_files + 1).astype(int).tolist()
    write_delta(table, itertools.pairwise(bounds), group_rows=args.group_rows,
                seed=args.seed)
    pinned = DeltaSource(str(table)).latest_version()
    end = pinned + args.commits + (1 if args.optimize_after else 0)
    appended = args.commits * args.commit_rows
    print(f"table {table}: {args.initial_rows} rows at version {pinned} (pinned); the writer "
          f"appends {args.commits} commits of {args.commit_rows} rows every {args.interval} s "
          f"and runs OPTIMIZE after append {args.optimize_after}: the followed history ends "
          f"at version {end}")
    common = ["--table", str(table), "--seed", str(args.seed), "--version", str(pinned),
              "--group-rows", str(args.group_rows)]
    me = [sys.executable, str(Path(__file__).resolve())]
    writer_cmd = [*me, "--role", "writer", *common, "--first-id", str(args.initial_rows),
                  "--commits", str(args.commits), "--commit-rows", str(args.commit_rows),
                  "--interval", str(args.interval), "--optimize-after",
                  str(args.optimize_after)]
    trainer_cmd = [*me, "--role", "trainer", *common, "--root", str(work / "checkpoints"),
                   "--until-version", str(end), "--batch-size", str(args.batch_size),
                   "--workers", str(args.workers), "--checkpoint-every",
                   str(args.checkpoint_every), "--min-segment-rows",
                   str(args.min_segment_rows), "--poll-interval", str(args.poll_interval),
                   "--max-idle", str(args.max_idle)]
    setup = FollowSetup(work=work, run_id=RUN_ID, initial_rows=args.initial_rows,
                        appended_rows=appended, pinned=pinned,
                        open_ledger=lambda: open_ledger(None, root=str(work / "checkpoints")),
                        skip_text="OPTIMIZE", checkpoint_every=args.checkpoint_every)
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
    p.add_argument("--optimize-after", type=int, default=None,
                   help="OPTIMIZE after this append (default: half-way; 0: none)")
    p.add_argument("--group-rows", type=int, default=32, help="rows per row group")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    p.add_argument("--checkpoint-every", type=int, default=4, help="steps between saves")
    p.add_argument("--min-segment-rows", type=int, default=64,
                   help="appended rows a follow segment waits for")
    p.add_argument("--poll-interval", type=float, default=0.1)
    p.add_argument("--max-idle", type=float, default=30.0,
                   help="the trainer gives up after this long without a commit")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", help="keep the table, checkpoints and logs in this new directory "
                   "(default: a temporary one)")
    # children only
    p.add_argument("--table", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    p.add_argument("--version", type=int, help=argparse.SUPPRESS)
    p.add_argument("--until-version", type=int, help=argparse.SUPPRESS)
    p.add_argument("--first-id", type=int, help=argparse.SUPPRESS)
    p.add_argument("--step-log", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.optimize_after is None:
        args.optimize_after = args.commits // 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "writer":
        return writer(args)
    if args.role == "trainer":
        return trainer(args)
    if args.work is not None:
        work = Path(args.work)
        if work.exists() and any(work.iterdir()):
            print(f"--work {work} is not empty")
            return 1
        work.mkdir(parents=True, exist_ok=True)
        return 0 if parent(args, work) else 1
    with tempfile.TemporaryDirectory(prefix="lakeckpt-follow-delta-") as tmp:
        return 0 if parent(args, Path(tmp)) else 1


if __name__ == "__main__":
    sys.exit(main())
