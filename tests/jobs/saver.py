"""A job that saves checkpoints of one run with reader consumption, for concurrency tests.

``saver.py TABLE ROOT RUN STEPS COMPACT_EVERY [--restore] [--pause S]``: reads the table
through a LakeDataset and saves a checkpoint after every batch, compacting the ledger every
COMPACT_EVERY commits. Prints ``saved <step>`` per commit, or ``error <ErrorClass> <message>``
and exits 3 on a lakeckpt error.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.errors import LakeckptError


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("table")
    p.add_argument("root")
    p.add_argument("run")
    p.add_argument("steps", type=int)
    p.add_argument("compact_every", type=int)
    p.add_argument("--restore", action="store_true")
    p.add_argument("--pause", type=float, default=0.0)
    a = p.parse_args()
    dataset = LakeDataset(DeltaSource(a.table), batch_size=4, seed=2)
    loader = StatefulDataLoader(dataset, batch_size=None)
    model = torch.nn.Linear(1, 1)
    manager = CheckpointManager(a.root, a.run, compact_every=a.compact_every)
    try:
        step = (manager.restore(model=model, dataloader=loader) or 0) if a.restore else 0
        print(f"restored {step}", flush=True)
        for batch, _ in zip(loader, range(a.steps), strict=False):
            step += 1
            model(batch["id"][:1, None].float()).sum().backward()
            manager.save(step, model=model, dataloader=loader)
            print(f"saved {step}", flush=True)
            time.sleep(a.pause)
    except LakeckptError as exc:
        print(f"error {type(exc).__name__} {exc}", flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
