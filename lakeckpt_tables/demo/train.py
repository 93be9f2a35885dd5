"""The demo's training child: ``python -m lakeckpt_tables.demo.train --table T --run-dir R ...``.

A tiny deterministic model trained from a LakeDataset through a StatefulDataLoader. It resumes
from the newest checkpoint under ``R/checkpoints`` when there is one, logs every trained step
(:mod:`.steplog`) and reports progress on stdout, one line per event, for the parent:

    resume <step restored, 0 when fresh>   step <n>   checkpoint <n>   done <n>

The checkpoint format is deliberately plain and sits behind :func:`save_checkpoint` and
:func:`restore_checkpoint`, so the library's CheckpointManager can replace it in one place.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables.demo.steplog import StepLog
from lakeckpt_tables.demo.table import FEATURES
from lakeckpt_tables.plan import EpochPlan, PlanPolicy
from lakeckpt_tables.reader import LakeDataset, merge_states, states_from_loader
from lakeckpt_tables.sources import DeltaSource

__all__ = [
    "FINAL_PARAMS",
    "TrainConfig",
    "main",
    "planned_steps",
    "restore_checkpoint",
    "save_checkpoint",
    "train_argv",
]

COLUMNS = ("id", "x", "y")
_CKPT_NAME = re.compile(r"^step-(\d+)$")
_TRAINER_FILE = "trainer.pt"
_READER_FILE = "reader.json"
FINAL_PARAMS = "final.pt"


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides the training run; identical for the reference and crash runs."""

    table: str
    run_dir: Path
    attempt: int
    workers: int
    batch_size: int
    seed: int
    checkpoint_every: int
    lr: float = 0.05

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def step_log(self) -> Path:
        return self.run_dir / f"attempt-{self.attempt}.steps"


# ---------------------------------------------------------------------------- checkpoints


def save_checkpoint(directory: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    loader: StatefulDataLoader) -> Path:
    """Write checkpoint ``step`` under ``directory``: complete, or (after a crash) absent.

    Files go to a temporary directory that is renamed into place once they are on disk, so
    :func:`restore_checkpoint` never sees a partial checkpoint. The reader state is the merged
    state of all DataLoader workers, taken for exactly the batches yielded so far.
    """
    reader_state = merge_states(states_from_loader(loader.state_dict())).to_dict()
    final = directory / f"step-{step:09d}"
    tmp = directory / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    trainer = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
               "torch_rng": torch.get_rng_state()}
    _write_synced(tmp / _TRAINER_FILE, lambda f: torch.save(trainer, f))
    _write_synced(tmp / _READER_FILE, lambda f: f.write(json.dumps(reader_state).encode()))
    os.rename(tmp, final)
    _fsync_dir(directory)
    return final


def restore_checkpoint(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                       dataset: LakeDataset) -> int | None:
    """Load the newest complete checkpoint into model, optimizer, RNG and dataset.

    Call it before the DataLoader's iterator is created: the dataset's resume position is
    handed to the workers when they start. Returns the restored step, or None without one.
    """
    latest = _latest_checkpoint(directory)
    if latest is None:
        return None
    trainer = torch.load(latest / _TRAINER_FILE, weights_only=True)
    model.load_state_dict(trainer["model"])
    optimizer.load_state_dict(trainer["optimizer"])
    torch.set_rng_state(trainer["torch_rng"])
    dataset.load_state_dict(json.loads((latest / _READER_FILE).read_text()))
    return int(trainer["step"])


def _latest_checkpoint(directory: Path) -> Path | None:
    """The newest ``step-N`` directory; temporaries of interrupted saves are ignored."""
    if not directory.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in directory.iterdir()
             if (m := _CKPT_NAME.match(p.name)) is not None]
    return max(found)[1] if found else None


def _write_synced(path: Path, write: Callable[[BinaryIO], object]) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------- training


def planned_steps(table: str, batch_size: int, workers: int, seed: int) -> int:
    """How many steps one pass over ``table`` takes: the sum of every worker's batch count."""
    slices = max(workers, 1)  # num_workers=0 reads in the main process: one slice
    units = DeltaSource(table).snapshot().units
    plan = EpochPlan([u.rows for u in units],
                     PlanPolicy(batch_size=batch_size, workers=slices, seed=seed))
    return sum(plan.batch_count(g) for g in range(slices))


def make_dataset(cfg: TrainConfig) -> LakeDataset:
    return LakeDataset(DeltaSource(cfg.table), columns=list(COLUMNS), batch_size=cfg.batch_size,
                       seed=cfg.seed)


def make_loader(cfg: TrainConfig, dataset: LakeDataset) -> StatefulDataLoader:
    """The loader draws its worker seeds from its own generator, leaving the global RNG alone,
    so the RNG state restored from a checkpoint continues exactly where the crashed run was."""
    generator = torch.Generator().manual_seed(cfg.seed)
    return StatefulDataLoader(dataset, batch_size=None, num_workers=cfg.workers,
                              generator=generator)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer,
               batch: dict[str, torch.Tensor]) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])
    loss.backward()  # type: ignore[no-untyped-call]
    optimizer.step()
    return float(loss.item())


def train(cfg: TrainConfig) -> int:
    """Train one pass (or its rest, after a restore); returns the last step trained."""
    _make_deterministic(cfg.seed)
    dataset = make_dataset(cfg)
    model = nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    step = restore_checkpoint(cfg.checkpoints, model, optimizer, dataset) or 0
    _emit("resume", step)
    loader = make_loader(cfg, dataset)
    with StepLog(cfg.step_log) as log:
        for batch in loader:
            step += 1
            loss = train_step(model, optimizer, batch)
            log.write(step, loss, batch["id"].numpy())
            _emit("step", step)
            if step % cfg.checkpoint_every == 0:
                save_checkpoint(cfg.checkpoints, step, model, optimizer, loader)
                _emit("checkpoint", step)
    _save_final(cfg.run_dir / FINAL_PARAMS, model)
    _emit("done", step)
    return step


def _make_deterministic(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # one thread: same reduction order every run, no oversubscription


def _save_final(path: Path, model: nn.Module) -> None:
    tmp = path.with_name(path.name + ".tmp")
    _write_synced(tmp, lambda f: torch.save(model.state_dict(), f))
    os.replace(tmp, path)


def _emit(event: str, value: int) -> None:
    print(f"{event} {value}", flush=True)


def parse_args(argv: Sequence[str] | None = None) -> TrainConfig:
    p = argparse.ArgumentParser(prog="python -m lakeckpt_tables.demo.train",
                                description="the lakeckpt demo's training child")
    p.add_argument("--table", required=True)
    p.add_argument("--run-dir", required=True, type=Path)
    p.add_argument("--attempt", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=100)
    a = p.parse_args(argv)
    return TrainConfig(a.table, a.run_dir, a.attempt, a.workers, a.batch_size, a.seed,
                       a.checkpoint_every)


def train_argv(cfg: TrainConfig) -> list[str]:
    """The command line that makes :func:`parse_args` return ``cfg`` (for the parent)."""
    return ["--table", cfg.table, "--run-dir", str(cfg.run_dir), "--attempt", str(cfg.attempt),
            "--workers", str(cfg.workers), "--batch-size", str(cfg.batch_size),
            "--seed", str(cfg.seed), "--checkpoint-every", str(cfg.checkpoint_every)]


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    train(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
