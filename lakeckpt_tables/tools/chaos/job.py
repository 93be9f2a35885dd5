"""The training job ``lakeckpt chaos`` attacks: run it alone or under ``torchrun``.

Each rank appends ``<step> <id,id,...>`` per trained batch to ``<out>/rank<r>.log`` and, on
restore, drops the lines after the restored step (their training died with the crash), so the
logs hold exactly what trained the final model. Each rank writes how it ended to
``<out>/outcome<r>.txt``: ``done <step>``, ``named <ErrorClass> <message>`` (a lakeckpt error),
``peer <message>`` (the job's own collective lost a killed peer) or
``unnamed <ExceptionClass> <message>`` (anything else: what the campaign counts as a defect).
A named error that blames one ledger file (``LedgerCorruptError.file``) also writes that file's
path to ``<out>/damaged<r>.txt``: the campaign moves it aside before repairing the ledger.

Importing torch, torchdata and deltalake costs a fresh interpreter several seconds, most of a
single-process job's time, so the campaign forks single-process jobs from a server that
imported them once (``PRELOAD``, :func:`forked`): each job is still a process of its own that a
real SIGKILL ends. Ranks under ``torchrun`` are launched by torchrun itself, fresh.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from lakeckpt_tables.tools import crash as crash_points

__all__ = ["PRELOAD", "forked", "main"]

# what a forked job would otherwise import itself: no tokio runtime exists before a fork, and
# the only threads started are jemalloc's and OpenBLAS's, which their fork handlers account for
PRELOAD = ("torch", "torch._dynamo", "torch.distributed", "torch.distributed.checkpoint",
           "torchdata.stateful_dataloader", "pyarrow.parquet", "deltalake",
           "lakeckpt_tables.checkpoint", "lakeckpt_tables.reader", "lakeckpt_tables.sources",
           "lakeckpt_tables.ledger", "lakeckpt_tables.tools.chaos.job")


def _truncate(path: str, step: int) -> None:
    if not os.path.exists(path):
        return
    with open(path) as f:
        kept = [line for line in f if line.split(" ", 1)[0].isdigit()
                and int(line.split(" ", 1)[0]) <= step]
    with open(path, "w") as f:
        f.writelines(kept)


class PeerLost(Exception):
    """The job's own collective failed: a peer rank died (expected when the campaign kills)."""


def _collective(op: Any, *args: Any) -> None:
    try:
        op(*args)
    except RuntimeError as exc:  # gloo says "Connection reset by peer"
        raise PeerLost(" ".join(str(exc).split())[:200]) from exc


def _train(a: argparse.Namespace, rank: int, world: int) -> int:
    import torch
    import torch.distributed as dist
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lakeckpt_tables import DeltaSource, LakeDataset
    from lakeckpt_tables.checkpoint import CheckpointManager

    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dataset = LakeDataset(DeltaSource(a.table), columns=["id"], batch_size=a.batch, seed=7,
                          shuffle_window=2)
    loader = StatefulDataLoader(dataset, batch_size=None)
    manager = CheckpointManager(a.root, a.run)
    step = manager.restore(model=model, optimizer=optimizer, dataloader=loader) or 0
    log_path = os.path.join(a.out, f"rank{rank}.log")
    _truncate(log_path, step)
    if rank == 0:
        for name in os.listdir(a.out):
            if name.startswith("rank") and int(name[4:].split(".")[0]) >= world:
                _truncate(os.path.join(a.out, name), step)
    if dist.is_initialized():
        _collective(dist.barrier)
    saved = step
    with open(log_path, "a") as log:
        for batch in loader:
            step += 1
            optimizer.zero_grad()
            model(batch["id"][:, None].float() / 1000).sum().backward()
            if dist.is_initialized():
                for p in model.parameters():
                    assert p.grad is not None
                    _collective(dist.all_reduce, p.grad)
            optimizer.step()
            time.sleep(a.pause)
            log.write(f"{step} {','.join(map(str, batch['id'].tolist()))}\n")
            log.flush()
            if step % a.every == 0:
                manager.save(step, model=model, optimizer=optimizer, dataloader=loader)
                saved = step
    if saved != step:
        manager.save(step, model=model, optimizer=optimizer, dataloader=loader)
    return step


def forked(argv: list[str], crash: str | None, log: str) -> None:
    """Run the job in a process forked from the campaign's pre-imported server.

    Args:
        argv: the job's arguments, as on its command line.
        crash: the ``LAKECKPT_CRASH_AT`` of this job, or None.
        log: the file its stdout and stderr are appended to.
    """
    os.setsid()  # its own process group, which the campaign kills when the job is stuck
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for fd in (1, 2):
        os.dup2(output, fd)
    os.environ.pop(crash_points.ENV, None)
    if crash:
        os.environ[crash_points.ENV] = crash
    sys.exit(main(argv))


def main(argv: list[str] | None = None) -> int:
    """Run the job; the exit code is 0 (done), 3 (named error) or 4 (unnamed error)."""
    p = argparse.ArgumentParser()
    p.add_argument("--table", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--run", default="run")
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--pause", type=float, default=0.0, help="seconds of 'training' per step")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    crash_points.install()
    import torch.distributed as dist

    from lakeckpt_tables.errors import LakeckptError

    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    outcome = os.path.join(a.out, f"outcome{rank}.txt")
    damaged = None
    try:
        step = _train(a, rank, world)
        text, code = f"done {step}", 0
    except LakeckptError as exc:
        text, code = f"named {type(exc).__name__} {' '.join(str(exc).split())}", 3
        damaged = getattr(exc, "file", None)
    except PeerLost as exc:
        text, code = f"peer {exc}", 5
    except BaseException as exc:  # the campaign counts these: every error should be named
        text, code = f"unnamed {type(exc).__name__} {' '.join(str(exc).split())}", 4
    if damaged:
        with open(os.path.join(a.out, f"damaged{rank}.txt"), "w") as f:
            f.write(damaged + "\n")
    with open(outcome, "w") as f:  # last: the campaign reads the damaged file once it is here
        f.write(text + "\n")
    if dist.is_initialized() and code == 0:
        dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
