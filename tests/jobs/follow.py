"""A follow-mode training job for crash tests: run it alone or under ``torchrun``.

It trains from a Delta table while a writer appends to it (``LakeDataset(follow=True)``), from
the pinned ``--version`` up to ``--until``, checkpointing every ``--every`` steps through
:class:`~lakeckpt_tables.checkpoint.CheckpointManager`. Like ``train.py``, each rank appends
``<step> <id,id,...>`` for every batch it trains to ``<out>/rank<r>.log``, and on restore drops
the lines after the restored step (their training died with the crash), so at the end the logs
hold exactly what trained the final model. Rank 0 writes the final parameters to
``<out>/params.pt``.
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


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--table", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--run", default="run")
    p.add_argument("--out", required=True)
    p.add_argument("--ledger", default=None)
    p.add_argument("--version", type=int, default=0, help="the version to pin and follow from")
    p.add_argument("--until", type=int, required=True, help="the last version to read")
    p.add_argument("--poll", type=float, default=0.05, help="poll_interval, seconds")
    p.add_argument("--min-segment-rows", type=int, default=None)
    p.add_argument("--on-change", default="fail", choices=["fail", "skip"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--every", type=int, default=3, help="checkpoint every N steps")
    p.add_argument("--kill-after-step", type=int, default=None,
                   help="SIGKILL rank 0 right after training this step")
    return p.parse_args()


def _truncate_log(path: str, step: int) -> None:
    if not os.path.exists(path):
        return
    with open(path) as f:
        kept = [line for line in f if int(line.split(" ", 1)[0]) <= step]
    with open(path, "w") as f:
        f.writelines(kept)


def main() -> int:
    a = _args()
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dataset = LakeDataset(DeltaSource(a.table), columns=["id", "x", "y"], batch_size=a.batch,
                          seed=7, shuffle_window=2, version=a.version, follow=True,
                          until_version=a.until, poll_interval=a.poll,
                          min_segment_rows=a.min_segment_rows, on_change=a.on_change)
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=a.workers)
    manager = CheckpointManager(a.root, a.run, ledger=a.ledger)
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
            if a.kill_after_step == step and rank == 0:
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
