"""A real training job for crash tests: run it alone or under ``torchrun``.

Each rank appends ``<step> <id,id,...>`` for every batch it trains to ``<out>/rank<r>.log``. On
restore, lines after the restored step are dropped (their training died with the crash), so at
the end the logs hold exactly what trained the final model. Rank 0 writes the final parameters
to ``<out>/params.pt``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.tools import crash


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--table", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--run", default="run")
    p.add_argument("--out", required=True)
    p.add_argument("--ledger", default=None)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    p.add_argument("--kill-after-step", type=int, default=None,
                   help="SIGKILL rank 0 right after training this step")
    p.add_argument("--async-save", action="store_true")
    p.add_argument("--once", default=None, metavar="MARKER",
                   help="--kill-after-step kills only once: while MARKER does not exist (an "
                        "elastic agent restarts the job in place, which must not die again)")
    p.add_argument("--leave-after-step", type=int, default=None,
                   help="the rank on the node whose agent has LAKECKPT_TEST_LEAVER=1 SIGKILLs "
                        "its agent and itself after this step: the node leaves for good")
    return p.parse_args(argv)


def _truncate_log(path: str, step: int) -> None:
    if not os.path.exists(path):
        return
    with open(path) as f:
        kept = [line for line in f if int(line.split(" ", 1)[0]) <= step]
    with open(path, "w") as f:
        f.writelines(kept)


def _first_time(marker: str | None) -> bool:
    """True unless ``marker`` exists; creates it (None: always True)."""
    if marker is None:
        return True
    if os.path.exists(marker):
        return False
    open(marker, "w").close()
    return True


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    crash.install()  # LAKECKPT_CRASH_AT kills this job at a crash point
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dataset = LakeDataset(DeltaSource(a.table), columns=["id", "x", "y"], batch_size=a.batch,
                          seed=7, epochs=a.epochs, shuffle_window=2)
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=a.workers)
    manager = CheckpointManager(a.root, a.run, ledger=a.ledger, async_save=a.async_save)
    step = manager.restore(model=model, optimizer=optimizer, dataloader=loader) or 0
    os.makedirs(a.out, exist_ok=True)
    log_path = os.path.join(a.out, f"rank{rank}.log")
    _truncate_log(log_path, step)
    if rank == 0:
        for name in os.listdir(a.out):
            if name.startswith("rank") and int(name[4:].split(".")[0]) >= world:
                _truncate_log(os.path.join(a.out, name), step)
    if dist.is_initialized():
        dist.barrier()
    saved = step
    with open(log_path, "a") as log:
        for batch in loader:
            step += 1
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])
            loss.backward()
            if dist.is_initialized():
                for p in model.parameters():
                    assert p.grad is not None
                    dist.all_reduce(p.grad)
                    p.grad /= world
            optimizer.step()
            log.write(f"{step} {','.join(map(str, batch['id'].tolist()))}\n")
            log.flush()
            if step % a.every == 0:
                manager.save(step, model=model, optimizer=optimizer, dataloader=loader)
                saved = step
            if a.kill_after_step == step and rank == 0 and _first_time(a.once):
                os.kill(os.getpid(), signal.SIGKILL)
            if a.leave_after_step == step and os.environ.get("LAKECKPT_TEST_LEAVER") == "1":
                os.kill(os.getppid(), signal.SIGKILL)  # the torchrun agent of this node
                os.kill(os.getpid(), signal.SIGKILL)
    if saved != step:
        manager.save(step, model=model, optimizer=optimizer, dataloader=loader, tags=("final",))
    manager.wait()
    if rank == 0:
        torch.save({k: v.clone() for k, v in model.state_dict().items()},
                   os.path.join(a.out, "params.pt"))
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
