"""PyTorch Lightning from a Delta table: DDP on 2 CPU processes, SIGKILLed, resumed exactly.

The lines a Lightning user adds are marked ``# <- lakeckpt``: a ``LakeDataset`` under torchdata's
``StatefulDataLoader`` as the train dataloader, and ``LakeLedger(run_id)`` beside
``ModelCheckpoint``. Everything else is ordinary Lightning: ``ModelCheckpoint(
every_n_train_steps=...)`` saves, ``Trainer.fit(model, ckpt_path="last")`` resumes.

The script runs the training twice under ``torchrun`` (2 processes, gloo): the first job is
SIGKILLed mid-epoch (``--kill-after-step``), the second resumes with ``ckpt_path="last"``. Then it
proves from the row ids every rank trained that each row of the table trained exactly once, in
the order of an uninterrupted run, and that ``lakeckpt verify`` passes on the ledger.

    pip install "lakeckpt-tables[lightning]"
    python examples/lightning_resume.py                 # a synthetic table in a temp dir
    python examples/lightning_resume.py --work /tmp/lt  # keep the checkpoints and the ledger

The last line says ``PROOF OK`` (exit 0) or ``PROOF FAILED`` (exit 1).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import torch
from _common import FEATURES, write_delta  # examples/_common.py
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.integrations.lightning import LakeLedger  # <- lakeckpt
from lakeckpt_tables.plan.check import check_exactly_once


class Regression(pl.LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.net = nn.Linear(FEATURES, 1)

    def train_dataloader(self) -> StatefulDataLoader:
        dataset = LakeDataset(DeltaSource(self.args.table), columns=["id", "x", "y"],  # <- lakeckpt
                              batch_size=self.args.batch_size, seed=0)
        return StatefulDataLoader(dataset, batch_size=None, num_workers=1)  # <- lakeckpt

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        with open(Path(self.args.work) / f"ids-rank{self.global_rank}.txt", "a") as f:
            f.write(f"{self.global_step + 1} {','.join(map(str, batch['id'].tolist()))}\n")
        return nn.functional.mse_loss(self.net(batch["x"]).squeeze(-1), batch["y"])

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        if self.global_step == self.args.kill_after_step and self.global_rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)  # preempted, with no warning

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=0.01)


def train(args: argparse.Namespace) -> None:
    """One job (a torchrun worker): resume from the ledger's checkpoint if there is one."""
    pl.seed_everything(0, verbose=False)
    checkpoints = Path(args.work) / "checkpoints"
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        callbacks=[ModelCheckpoint(dirpath=checkpoints, every_n_train_steps=args.every,
                                   save_last=True),
                   LakeLedger(run_id="lightning-example")])  # <- lakeckpt
    resume = "last" if (checkpoints / "last.ckpt").exists() else None
    trainer.fit(Regression(args), ckpt_path=resume)


def _trained(work: Path) -> dict[int, list[list[int]]]:
    """Each rank's batches that trained the final model: lines after the step a resume went
    back to were lost with the crash, and the resumed job wrote those steps again."""
    out = {}
    for path in sorted(work.glob("ids-rank*.txt")):
        by_step: dict[int, list[int]] = {}
        for line in path.read_text().splitlines():
            step, ids = line.split(" ", 1)
            by_step[int(step)] = [int(i) for i in ids.split(",")]  # the resumed job's wins
        out[int(path.stem[len("ids-rank"):])] = [by_step[s] for s in sorted(by_step)]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default=None, help="directory for the table, checkpoints, ids")
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    p.add_argument("--kill-after-step", type=int, default=13)
    p.add_argument("--train", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--table", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.train:
        train(args)
        return 0
    work = Path(args.work or tempfile.mkdtemp(prefix="lakeckpt-lightning-"))
    work.mkdir(parents=True, exist_ok=True)
    table = work / "table"
    if not table.exists():
        write_delta(table, [(lo, min(lo + 500, args.rows)) for lo in range(0, args.rows, 500)],
                    group_rows=250)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
            "--max-restarts=0", __file__, "--train", "--table", str(table), "--work", str(work),
            "--batch-size", str(args.batch_size), "--every", str(args.every)]
    first = subprocess.run([*base, "--kill-after-step", str(args.kill_after_step)], env=env)
    print(f"job 1: exit {first.returncode} (SIGKILLed after step {args.kill_after_step})")
    second = subprocess.run([*base, "--kill-after-step", "-1"], env=env)
    print(f"job 2: exit {second.returncode} (resumed with ckpt_path='last')")
    trained = _trained(work)
    every_id = [i for batches in trained.values() for b in batches for i in b]
    verdict = check_exactly_once(every_id, range(args.rows))
    print(f"ids: {len(every_id)} trained of {args.rows} rows: {verdict}")
    expected = {rank: [[int(i) for i in b["id"]] for b in LakeDataset(
        DeltaSource(str(table)), columns=["id"], batch_size=args.batch_size, seed=0, rank=rank,
        world_size=2)] for rank in (0, 1)}
    same = trained == expected
    print(f"each rank's batches equal an uninterrupted run's: {same}")
    verify = subprocess.run([sys.executable, "-m", "lakeckpt_tables.cli", "verify",
                             str(work / "checkpoints")], env=env)
    ok = first.returncode != 0 and second.returncode == 0 and bool(verdict) and same \
        and verify.returncode == 0
    print("PROOF OK" if ok else "PROOF FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
