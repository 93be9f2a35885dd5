"""Hugging Face ``transformers.Trainer`` with ``LakeTrainer``: DDP on 2 CPU processes (gloo,
torchrun), a real SIGKILL between the Trainer's write of ``checkpoint-8`` and the ledger commit,
a resume refused from that directory and exact, by a seek, from the committed ``checkpoint-4``
(``resume_from_checkpoint=True``); and the mistakes named, in process.

One campaign of two torchrun launches (module fixture); the job is ``jobs/hf_train.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from crash_jobs import logs, write_table
from torch import nn
from transformers import Trainer, TrainingArguments

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.audit.exactly_once import verify
from lakeckpt_tables.errors import (
    CheckpointError,
    CheckpointRestoreError,
    LoaderStateLostError,
)
from lakeckpt_tables.integrations.hf import LakeTrainer, LakeTrainerCallback
from lakeckpt_tables.ledger import DeltaLedger
from lakeckpt_tables.plan.check import check_exactly_once

JOB = str(Path(__file__).parent / "jobs" / "hf_train.py")
ROWS, BATCH, EVERY, STEPS = 300, 10, 4, 15


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
    work = tmp_path_factory.mktemp("hf")
    root, out = work / "ck", work / "out"
    common = ["--table", str(table), "--root", str(root), "--out", str(out),
              "--batch", str(BATCH), "--every", str(EVERY), "--steps", str(STEPS)]
    killed = _torchrun(*common, "--kill-at-save", "8")
    dirs_after_kill = sorted(p.name for p in root.glob("checkpoint-*"))
    heads = [r.step for r in DeltaLedger(str(root / "_ledger")).checkpoints("run")]
    resumed = _torchrun(*common, "--refused-ckpt", str(root / "checkpoint-8"), "--resume")
    return {"root": root, "out": out, "killed": killed, "resumed": resumed,
            "dirs_after_kill": dirs_after_kill, "heads_after_kill": heads}


def _expected(table: Path) -> dict[int, list[list[int]]]:
    """Each rank's batches of an uninterrupted run: the pure plan, read in this process."""
    out = {}
    for rank in (0, 1):
        dataset = LakeDataset(DeltaSource(str(table)), columns=["id"], batch_size=BATCH, seed=7,
                              shuffle_window=2, rank=rank, world_size=2)
        out[rank] = [[int(i) for i in b["id"]] for b in dataset]
    return out


@pytest.mark.timeout(400)
def test_a_trainer_killed_between_the_write_and_the_commit_resumes_by_a_seek(
        table: Path, campaign: dict[str, object]) -> None:
    killed, resumed = campaign["killed"], campaign["resumed"]
    assert isinstance(killed, subprocess.CompletedProcess)
    assert isinstance(resumed, subprocess.CompletedProcess)
    assert killed.returncode != 0 and "SIGKILL" in killed.stderr, killed.stderr[-2000:]
    assert campaign["dirs_after_kill"] == ["checkpoint-4", "checkpoint-8"]
    assert campaign["heads_after_kill"] == [4]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out, root = Path(str(campaign["out"])), Path(str(campaign["root"]))
    refused = (out / "refused.txt").read_text()
    assert "checkpoint-8) was never committed" in refused and "step 4 at" in refused
    assert "['checkpoint-8']" in resumed.stderr and "UncommittedCheckpointWarning" \
        in resumed.stderr
    # a replay (skip_first_batches) on top of the seek would skip rows: each rank's batches
    # are those of an uninterrupted run, row for row
    trained = logs(out)
    assert trained == _expected(table)
    every_id = [i for batches in trained.values() for batch in batches for i in batch]
    assert check_exactly_once(every_id, range(ROWS))
    records = list(DeltaLedger(str(root / "_ledger")).checkpoints("run"))
    assert [r.step for r in records] == [4, 8, 12, 15]
    assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors"} <= set(
        records[-1].manifest)  # every process's files are in the checkpoint it commits
    (verdict,) = verify(str(root), run="run")
    assert verdict.ok and verdict.rows == ROWS, verdict.violations[:3]


class _Regression(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": nn.functional.mse_loss(self.net(x).squeeze(-1), y)}


def _args(root: Path, **kw: object) -> TrainingArguments:
    return TrainingArguments(output_dir=str(root), max_steps=2, save_steps=2, report_to=[],
                             use_cpu=True, disable_tqdm=True, **kw)  # type: ignore[arg-type]


@pytest.mark.timeout(120)
def test_the_mistakes_are_named_before_a_row_trains(
        table: Path, campaign: dict[str, object], tmp_path: Path) -> None:
    dataset = LakeDataset(DeltaSource(str(table)), columns=["x", "y"], batch_size=BATCH)
    # the Trainer's own DataLoader (prepared by Accelerate) over a LakeDataset loses its state
    plain = Trainer(model=_Regression(), args=_args(tmp_path / "plain"), train_dataset=dataset,
                    callbacks=[LakeTrainerCallback("run")])
    with pytest.raises(LoaderStateLostError, match="LakeTrainer"):
        plain.train()
    # save_total_limit=1 deletes the ledger's newest committed checkpoint before the commit
    with pytest.raises(CheckpointError, match="save_total_limit=1"):
        LakeTrainer(model=_Regression(), args=_args(tmp_path / "one", save_total_limit=1),
                    train_dataset=dataset, run_id="run")
    # a run with committed checkpoints trained again from scratch would train rows again
    again = LakeTrainer(model=_Regression(), args=_args(Path(str(campaign["root"]))),
                        train_dataset=dataset, run_id="run")
    with pytest.raises(CheckpointRestoreError,
                       match=r"step 15 at .*checkpoint-15.*not asked to resume"):
        again.train()
