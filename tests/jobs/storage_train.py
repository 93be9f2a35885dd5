"""A training job whose table and checkpoints live on an object store (or per-node roots).

Run alone or under ``torchrun``. Storage options come as JSON in ``LAKECKPT_TEST_OPTIONS``
(none: local). ``LAKECKPT_TEST_ROOT_RANK<r>`` overrides ``--root`` for rank r: a per-node
local directory, as on nodes without a shared disk. ``--hold-after-step N``: after step N
(and its save) the rank writes ``<out>/held`` and waits to be killed, a node lost at a known
point; collectives time out after ``--collective-timeout`` seconds. Each rank appends
``<step> <ids>`` per batch to ``<out>/rank<r>.log`` (lines after the restored step are dropped
on restore); the exit code is 0, or 3 with the error's class name on stderr when the manager
raised.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.errors import LakeckptError


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--table", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--every", type=int, default=3)
    p.add_argument("--kill-after-step", type=int, default=None)
    p.add_argument("--hold-after-step", type=int, default=None)
    p.add_argument("--collective-timeout", type=float, default=1800)
    a = p.parse_args()
    if "RANK" in os.environ:
        dist.init_process_group("gloo", timeout=timedelta(seconds=a.collective_timeout))
    rank = dist.get_rank() if dist.is_initialized() else 0
    options = json.loads(os.environ.get("LAKECKPT_TEST_OPTIONS", "null"))
    root = os.environ.get(f"LAKECKPT_TEST_ROOT_RANK{rank}", a.root)
    torch.manual_seed(0)
    model = nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dataset = LakeDataset(DeltaSource(a.table, storage_options=options), columns=["id", "x"],
                          batch_size=16, seed=7, shuffle_window=2)
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=0)
    try:
        manager = CheckpointManager(root, "run", storage_options=options)
        step = manager.restore(model=model, optimizer=optimizer, dataloader=loader) or 0
        os.makedirs(a.out, exist_ok=True)
        log_path = os.path.join(a.out, f"rank{rank}.log")
        if os.path.exists(log_path):
            with open(log_path) as f:
                kept = [line for line in f if int(line.split(" ", 1)[0]) <= step]
            with open(log_path, "w") as f:
                f.writelines(kept)
        with open(log_path, "a") as log:
            for batch in loader:
                step += 1
                optimizer.zero_grad()
                model(batch["x"].unsqueeze(1)).sum().backward()
                optimizer.step()
                log.write(f"{step} {','.join(map(str, batch['id'].tolist()))}\n")
                log.flush()
                if step % a.every == 0:
                    manager.save(step, model=model, optimizer=optimizer, dataloader=loader)
                if a.kill_after_step == step and rank == 0:
                    os.kill(os.getpid(), signal.SIGKILL)
                if a.hold_after_step == step:
                    open(os.path.join(a.out, "held"), "w").close()
                    time.sleep(3600)
        manager.save(step + 1, model=model, optimizer=optimizer, dataloader=loader,
                     tags=("final",))
    except LakeckptError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 3
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
