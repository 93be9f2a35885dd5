"""The Hugging Face Trainer from a Delta table: 2 CPU processes, SIGKILLed, resumed by a seek.

The lines a Trainer user changes are marked ``# <- lakeckpt``: ``LakeTrainer`` instead of
``Trainer``, a ``LakeDataset`` as ``train_dataset``. Everything else is the ordinary Trainer:
``save_steps`` saves ``checkpoint-N``, ``trainer.train(resume_from_checkpoint=True)`` resumes.

The script runs the training twice under ``torchrun`` (2 processes, gloo): the first job is
SIGKILLed after the Trainer wrote a checkpoint and before the ledger committed it (the worst
moment), the second resumes with ``resume_from_checkpoint=True``: from the ledger's newest
committed checkpoint, by a seek of the reader (no ``skip_first_batches`` replay). Then it proves
from the row ids every rank trained that each row trained exactly once, in the order of an
uninterrupted run, and that ``lakeckpt verify`` passes on the ledger.

    pip install "lakeckpt-tables[hf]"
    python examples/hf_resume.py                 # a synthetic table in a temp dir
    python examples/hf_resume.py --work /tmp/hf  # keep the checkpoints and the ledger

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
from typing import Any

import torch
from _common import FEATURES, write_delta  # examples/_common.py
from torch import nn
from transformers import TrainerCallback, TrainingArguments

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.integrations.hf import LakeTrainer  # <- lakeckpt
from lakeckpt_tables.plan.check import check_exactly_once


class Regression(nn.Module):
    def __init__(self, work: Path) -> None:
        super().__init__()
        self.net = nn.Linear(FEATURES, 1)
        self.work = work
        self.step = 0

    def forward(self, id: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
        rank = os.environ.get("RANK", "0")
        with open(self.work / f"ids-rank{rank}.txt", "a") as f:
            f.write(f"{self.step + 1} {','.join(map(str, id.tolist()))}\n")
        return {"loss": nn.functional.mse_loss(self.net(x).squeeze(-1), y)}


class Preempted(TrainerCallback):
    """Counts steps for the id log; SIGKILLs rank 0 once the Trainer wrote checkpoint-N."""

    def __init__(self, model: Regression, kill_at_save: int) -> None:
        self.model, self.kill = model, kill_at_save

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.model.step = state.global_step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.model.step = state.global_step

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.kill and os.environ.get("RANK", "0") == "0":
            os.kill(os.getpid(), signal.SIGKILL)  # the checkpoint is written, not committed


def train(args: argparse.Namespace) -> None:
    """One job (a torchrun worker)."""
    torch.manual_seed(0)
    work = Path(args.work)
    model = Regression(work)
    training = TrainingArguments(
        output_dir=str(work / "checkpoints"), max_steps=args.steps, save_steps=args.every,
        save_total_limit=2, learning_rate=0.01, report_to=[], use_cpu=True,
        ddp_backend="gloo", disable_tqdm=True, logging_steps=10_000)
    _ = training.device  # sets up the process group the LakeDataset reads its rank from
    dataset = LakeDataset(DeltaSource(args.table), columns=["id", "x", "y"],  # <- lakeckpt
                          batch_size=args.batch_size, seed=0)
    trainer = LakeTrainer(model=model, args=training, train_dataset=dataset,  # <- lakeckpt
                          run_id="hf-example", callbacks=[Preempted(model, args.kill_at_save)])
    trainer.train(resume_from_checkpoint=True)


def _trained(work: Path) -> dict[int, list[list[int]]]:
    """Each rank's batches that trained the final model (the resumed job's lines win)."""
    out = {}
    for path in sorted(work.glob("ids-rank*.txt")):
        by_step: dict[int, list[int]] = {}
        for line in path.read_text().splitlines():
            step, ids = line.split(" ", 1)
            by_step[int(step)] = [int(i) for i in ids.split(",")]
        out[int(path.stem[len("ids-rank"):])] = [by_step[s] for s in sorted(by_step)]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default=None, help="directory for the table, checkpoints, ids")
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--every", type=int, default=5, help="save checkpoint-N every N steps")
    p.add_argument("--kill-at-save", type=int, default=10)
    p.add_argument("--train", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--table", default=None, help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.train:
        train(args)
        return 0
    work = Path(args.work or tempfile.mkdtemp(prefix="lakeckpt-hf-"))
    work.mkdir(parents=True, exist_ok=True)
    table = work / "table"
    if not table.exists():
        write_delta(table, [(lo, min(lo + 500, args.rows)) for lo in range(0, args.rows, 500)],
                    group_rows=250)
    steps = args.rows // 2 // args.batch_size  # one pass over the table on each of 2 ranks
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
            "--max-restarts=0", __file__, "--train", "--table", str(table), "--work", str(work),
            "--batch-size", str(args.batch_size), "--every", str(args.every),
            "--steps", str(steps)]
    first = subprocess.run([*base, "--kill-at-save", str(args.kill_at_save)], env=env)
    print(f"job 1: exit {first.returncode} (SIGKILLed once checkpoint-{args.kill_at_save} "
          "was written, before the ledger commit)")
    second = subprocess.run([*base, "--kill-at-save", "-1"], env=env)
    print(f"job 2: exit {second.returncode} (resume_from_checkpoint=True)")
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
