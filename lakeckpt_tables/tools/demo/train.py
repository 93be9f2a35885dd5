"""The demo's training child: ``python -m lakeckpt_tables.tools.demo.train --table T ...``.

A tiny deterministic model trained from a LakeDataset through a StatefulDataLoader, checkpointed
with the library's :class:`~lakeckpt_tables.checkpoint.CheckpointManager`: model, optimizer, RNG
and reader position committed together through the ledger under ``--root``. Before iterating it
restores the run's latest committed checkpoint, if any. It logs every trained step
(:mod:`.steplog`) and reports progress on stdout, one line per event, for the parent:

    resume <step restored, 0 when fresh>   step <n>   save <n>   checkpoint <n>   done <n>

``save n`` comes before the checkpoint of step ``n`` is started and ``checkpoint n`` once the
ledger has committed it: a child that dies between the two died inside that save. After the
last step it saves a checkpoint tagged ``final`` (unless the last step was just saved), so the
ledger accounts for every row the run trained.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.plan import EpochPlan, PlanPolicy
from lakeckpt_tables.reader import LakeDataset
from lakeckpt_tables.sources import DeltaSource
from lakeckpt_tables.tools import crash
from lakeckpt_tables.tools.demo.steplog import StepLog
from lakeckpt_tables.tools.demo.table import FEATURES

__all__ = ["FINAL_PARAMS", "FINAL_TAG", "TrainConfig", "main", "planned_steps", "train_argv"]

COLUMNS = ("id", "x", "y")
FINAL_PARAMS = "final.pt"
FINAL_TAG = "final"


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides the training run; identical for the reference and crash runs
    except where files go (``run_dir``, ``run_id``) and which ``attempt`` this is."""

    table: str
    run_dir: Path  # this run's step logs and final parameters
    root: Path  # checkpoint root: <root>/<run_id>/step-..., ledger at <root>/_ledger
    run_id: str
    attempt: int
    workers: int
    batch_size: int
    seed: int
    epochs: int
    checkpoint_every: int
    lr: float = 0.05

    @property
    def step_log(self) -> Path:
        return self.run_dir / f"attempt-{self.attempt}.steps"

    def hashed(self) -> dict[str, Any]:
        """What the ledger's config hash covers: what decides the training, not where it goes."""
        return {"table": self.table, "workers": self.workers, "batch_size": self.batch_size,
                "seed": self.seed, "epochs": self.epochs,
                "checkpoint_every": self.checkpoint_every, "lr": self.lr}


def planned_steps(table: str, batch_size: int, workers: int, seed: int, epochs: int) -> int:
    """How many steps the run takes: every worker's batch count, summed over the epochs."""
    slices = max(workers, 1)  # num_workers=0 reads in the main process: one slice
    rows = [u.rows for u in DeltaSource(table).snapshot().units]
    policy = PlanPolicy(batch_size=batch_size, workers=slices, seed=seed)
    return sum(EpochPlan(rows, policy, epoch=e).batch_count(g)
               for e in range(epochs) for g in range(slices))


def make_dataset(cfg: TrainConfig) -> LakeDataset:
    return LakeDataset(DeltaSource(cfg.table), columns=list(COLUMNS), batch_size=cfg.batch_size,
                       seed=cfg.seed, epochs=cfg.epochs)


def make_loader(cfg: TrainConfig, dataset: LakeDataset) -> StatefulDataLoader:
    """The loader draws its worker seeds from its own generator, leaving the global RNG alone,
    so the RNG state restored from a checkpoint continues exactly where the crashed run was."""
    generator = torch.Generator().manual_seed(cfg.seed)
    return StatefulDataLoader(dataset, batch_size=None, num_workers=cfg.workers,
                              generator=generator, worker_init_fn=_release_stdout)


def _release_stdout(worker_id: int) -> None:
    """A DataLoader worker lets go of stdout, the parent's progress pipe.

    The parent reads that pipe until end of file; a worker outlives a SIGKILLed trainer by up
    to torch's watchdog interval (about 5 s) and would hold the pipe open all that time.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer,
               batch: dict[str, torch.Tensor]) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])
    loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()
    return float(loss.item())


def train(cfg: TrainConfig) -> int:
    """Train the run (or its rest, after a restore); returns the last step trained."""
    _make_deterministic(cfg.seed)
    loader = make_loader(cfg, make_dataset(cfg))
    model = nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    manager = CheckpointManager(cfg.root, cfg.run_id, config=cfg.hashed())
    # before iterating: the reader position goes into the dataset, which the workers inherit
    step = manager.restore(model=model, optimizer=optimizer, dataloader=loader) or 0
    _emit("resume", step)
    saved = step
    with StepLog(cfg.step_log) as log:
        for batch in loader:
            step += 1
            loss = train_step(model, optimizer, batch)
            log.write(step, loss, batch["id"].numpy())
            _emit("step", step)
            if step % cfg.checkpoint_every == 0:
                _save(manager, step, model, optimizer, loader)
                saved = step
    if saved != step:
        _save(manager, step, model, optimizer, loader, tags=(FINAL_TAG,))
    _save_final(cfg.run_dir / FINAL_PARAMS, model)
    _emit("done", step)
    return step


def _save(manager: CheckpointManager, step: int, model: nn.Module,
          optimizer: torch.optim.Optimizer, loader: StatefulDataLoader,
          tags: Sequence[str] = ()) -> None:
    _emit("save", step)
    manager.save(step, model=model, optimizer=optimizer, dataloader=loader, tags=tags)
    _emit("checkpoint", step)


def _make_deterministic(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # one thread: same reduction order every run, no oversubscription


def _save_final(path: Path, model: nn.Module) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(model.state_dict(), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _emit(event: str, value: int) -> None:
    print(f"{event} {value}", flush=True)


def parse_args(argv: Sequence[str] | None = None) -> TrainConfig:
    p = argparse.ArgumentParser(prog="python -m lakeckpt_tables.tools.demo.train",
                                description="the lakeckpt demo's training child")
    p.add_argument("--table", required=True)
    p.add_argument("--run-dir", required=True, type=Path)
    p.add_argument("--root", required=True, type=Path)
    p.add_argument("--run-id", required=True)
    p.add_argument("--attempt", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--checkpoint-every", type=int, default=100)
    a = p.parse_args(argv)
    return TrainConfig(a.table, a.run_dir, a.root, a.run_id, a.attempt, a.workers,
                       a.batch_size, a.seed, a.epochs, a.checkpoint_every)


def train_argv(cfg: TrainConfig) -> list[str]:
    """The command line that makes :func:`parse_args` return ``cfg`` (for the parent)."""
    return ["--table", cfg.table, "--run-dir", str(cfg.run_dir), "--root", str(cfg.root),
            "--run-id", cfg.run_id, "--attempt", str(cfg.attempt),
            "--workers", str(cfg.workers), "--batch-size", str(cfg.batch_size),
            "--seed", str(cfg.seed), "--epochs", str(cfg.epochs),
            "--checkpoint-every", str(cfg.checkpoint_every)]


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    crash.install()  # the demo kills attempt 2 inside a save (LAKECKPT_CRASH_AT)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    train(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
