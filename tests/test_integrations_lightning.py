"""PyTorch Lightning 2.x with ``LakeLedger``: DDP on 2 CPU processes (gloo, torchrun), a real
SIGKILL between Lightning's write and the ledger commit, a resume that is refused from the file
the ledger never committed and exact from the committed one; and the mistakes named, in process.

One campaign of two torchrun launches (module fixture); the job is ``jobs/lightning_train.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from crash_jobs import logs, write_table
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.audit.exactly_once import verify
from lakeckpt_tables.errors import (
    CheckpointRestoreError,
    LoaderStateLostError,
    UncommittedCheckpointError,
)
from lakeckpt_tables.integrations.lightning import LakeLedger
from lakeckpt_tables.ledger import DeltaLedger
from lakeckpt_tables.plan.check import check_exactly_once

JOB = str(Path(__file__).parent / "jobs" / "lightning_train.py")
ROWS, BATCH, EVERY = 300, 10, 4


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("src") / "t"
    write_table(path, ROWS)
    return path


def _torchrun(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--max-restarts=0", JOB, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=200)


@pytest.fixture(scope="module")
def campaign(table: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Launch 1 is SIGKILLed right after Lightning wrote step 8's checkpoint (before the ledger
    commit); launch 2 first asks Trainer.fit for ckpt_path="last" (step 8's copy: refused),
    then resumes from the committed step 4, which save_top_k=1 would have deleted."""
    work = tmp_path_factory.mktemp("lightning")
    root, out = work / "ck", work / "out"
    common = ["--table", str(table), "--root", str(root), "--out", str(out),
              "--batch", str(BATCH), "--every", str(EVERY)]
    killed = _torchrun(*common, "--kill-after-step", "8", "--kill-at", "commit")
    files_after_kill = sorted(p.name for p in root.glob("*.ckpt"))
    heads = [r.step for r in DeltaLedger(str(root / "_ledger")).checkpoints("run")]
    resumed = _torchrun(*common, "--refused-ckpt", "last",
                        "--ckpt", str(root / "epoch=0-step=4.ckpt"))
    return {"root": root, "out": out, "killed": killed, "resumed": resumed,
            "files_after_kill": files_after_kill, "heads_after_kill": heads}


def _expected(table: Path) -> dict[int, list[list[int]]]:
    """Each rank's batches of an uninterrupted run: the pure plan, read in this process."""
    out = {}
    for rank in (0, 1):
        dataset = LakeDataset(DeltaSource(str(table)), columns=["id"], batch_size=BATCH, seed=7,
                              shuffle_window=2, rank=rank, world_size=2)
        out[rank] = [[int(i) for i in b["id"]] for b in dataset]
    return out


@pytest.mark.timeout(400)
def test_a_ddp_job_killed_between_the_write_and_the_commit_resumes_exactly_once(
        table: Path, campaign: dict[str, object]) -> None:
    killed = campaign["killed"]
    resumed = campaign["resumed"]
    assert isinstance(killed, subprocess.CompletedProcess)
    assert isinstance(resumed, subprocess.CompletedProcess)
    assert killed.returncode != 0 and "SIGKILL" in killed.stderr, killed.stderr[-2000:]
    # Lightning wrote step 8; the ledger committed 4 only, and kept 4's file from save_top_k=1
    assert campaign["files_after_kill"] == ["epoch=0-step=4.ckpt", "epoch=0-step=8.ckpt",
                                            "last.ckpt"]
    assert campaign["heads_after_kill"] == [4]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out, root = Path(str(campaign["out"])), Path(str(campaign["root"]))
    refused = (out / "refused.txt").read_text()
    assert "never committed" in refused and "step 4 at" in refused
    assert "epoch=0-step=8.ckpt" in resumed.stderr  # reported as never committed
    trained = logs(out)
    assert trained == _expected(table)  # row for row, each rank, as if never killed
    every_id = [i for batches in trained.values() for batch in batches for i in batch]
    assert check_exactly_once(every_id, range(ROWS))
    steps = [r.step for r in DeltaLedger(str(root / "_ledger")).checkpoints("run")]
    assert steps == [4, 8, 12]
    (verdict,) = verify(str(root), run="run")
    assert verdict.ok and verdict.rows == 2 * 12 * BATCH, verdict.violations[:3]


class _Tiny(pl.LightningModule):
    def __init__(self, loader: object) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.loader = loader

    def train_dataloader(self) -> object:
        return self.loader

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return nn.functional.mse_loss(self.net(batch["x"]).squeeze(-1), batch["y"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(root: Path, loader: object, *, ckpt: str | None = None, steps: int = 3,
         callback: bool = True) -> pl.Trainer:
    callbacks: list[pl.Callback] = [ModelCheckpoint(dirpath=root, every_n_train_steps=2)]
    callbacks += [LakeLedger("run")] if callback else []
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=callbacks, num_sanity_val_steps=0)
    trainer.fit(_Tiny(loader), ckpt_path=ckpt)
    return trainer


def _dataset(table: Path) -> LakeDataset:
    return LakeDataset(DeltaSource(str(table)), columns=["x", "y"], batch_size=BATCH, seed=7)


@pytest.mark.timeout(120)
def test_the_mistakes_are_named_before_a_row_trains(table: Path, tmp_path: Path) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    # a plain DataLoader: Lightning keeps no state of it, a resume would restart the data
    with pytest.raises(LoaderStateLostError, match="StatefulDataLoader"):
        _fit(tmp_path / "plain", torch.utils.data.DataLoader(_dataset(table), batch_size=None))
    # a run with committed checkpoints fitted again without ckpt_path would train rows again
    _fit(tmp_path / "ck", StatefulDataLoader(_dataset(table), batch_size=None))
    with pytest.raises(CheckpointRestoreError, match=r"no ckpt_path.*epoch=0-step=2.ckpt"):
        _fit(tmp_path / "ck", StatefulDataLoader(_dataset(table), batch_size=None))
    # a checkpoint saved without the callback: the ledger has no reader state for it
    _fit(tmp_path / "bare", StatefulDataLoader(_dataset(table), batch_size=None),
         callback=False)
    with pytest.raises(UncommittedCheckpointError, match="not saved by LakeLedger"):
        _fit(tmp_path / "bare", StatefulDataLoader(_dataset(table), batch_size=None),
             ckpt=str(tmp_path / "bare" / "epoch=0-step=2.ckpt"), steps=5)
