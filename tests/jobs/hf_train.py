"""A Hugging Face Trainer job for the integration tests: alone, or under ``torchrun`` (DDP, gloo).

Each rank appends ``<step> <id,id,...>`` for every batch it trains to ``<out>/rank<r>.log``
(lines after the resumed step are dropped on a resume). ``--kill-at-save N`` SIGKILLs rank 0 in
``on_save`` of step N: after the Trainer wrote ``checkpoint-N``, before the ledger commit.
``--refused-ckpt P`` first asks ``train(resume_from_checkpoint=P)``, which must be refused as
never committed (the message goes to ``<out>/refused.txt``); ``--resume`` then resumes with
``resume_from_checkpoint=True``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch
from torch import nn
from transformers import TrainerCallback, TrainingArguments

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.errors import UncommittedCheckpointError
from lakeckpt_tables.integrations.hf import LakeTrainer


class Regression(nn.Module):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.out = out
        self.step = 0

    def forward(self, id: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> dict[str, object]:
        rank = int(os.environ.get("RANK", "0"))
        with open(os.path.join(self.out, f"rank{rank}.log"), "a") as f:
            f.write(f"{self.step + 1} {','.join(str(int(i)) for i in id)}\n")
        return {"loss": nn.functional.mse_loss(self.net(x).squeeze(-1), y)}


class _Steps(TrainerCallback):
    """Keeps the model's step number (for its log), trims the log on a resume, and SIGKILLs
    rank 0 in on_save of step N (before LakeTrainerCallback, which comes last)."""

    def __init__(self, model: Regression, kill_at_save: int | None) -> None:
        self.model = model
        self.kill = kill_at_save

    def on_train_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.model.step = state.global_step
        path = os.path.join(self.model.out, f"rank{os.environ.get('RANK', '0')}.log")
        if os.path.exists(path):
            with open(path) as f:
                kept = [ln for ln in f if int(ln.split(" ", 1)[0]) <= state.global_step]
            with open(path, "w") as f:
                f.writelines(kept)

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.model.step = state.global_step

    def on_save(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if state.global_step == self.kill and os.environ.get("RANK", "0") == "0":
            os.kill(os.getpid(), signal.SIGKILL)


def _trainer(a: argparse.Namespace) -> LakeTrainer:
    torch.manual_seed(0)
    model = Regression(a.out)
    args = TrainingArguments(
        output_dir=a.root, max_steps=a.steps, save_strategy="steps", save_steps=a.every,
        save_total_limit=2, learning_rate=0.01, logging_steps=10_000, report_to=[],
        use_cpu=True, ddp_backend="gloo", seed=0, dataloader_num_workers=a.workers,
        disable_tqdm=True)
    _ = args.device  # sets up the process group, which the LakeDataset reads its rank from
    dataset = LakeDataset(DeltaSource(a.table), columns=["id", "x", "y"], batch_size=a.batch,
                          seed=7, shuffle_window=2)
    return LakeTrainer(model=model, args=args, train_dataset=dataset, run_id="run",
                       callbacks=[_Steps(model, a.kill_at_save)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    for name in ("--table", "--root", "--out"):
        p.add_argument(name, required=True)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--kill-at-save", type=int, default=None)
    p.add_argument("--refused-ckpt", default=None)
    p.add_argument("--resume", action="store_true")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    if a.refused_ckpt is not None:
        try:
            _trainer(a).train(resume_from_checkpoint=a.refused_ckpt)
        except UncommittedCheckpointError as exc:
            if os.environ.get("RANK", "0") == "0":
                with open(os.path.join(a.out, "refused.txt"), "w") as f:
                    f.write(str(exc))
        else:
            raise SystemExit(f"train(resume_from_checkpoint={a.refused_ckpt!r}) was not refused")
    _trainer(a).train(resume_from_checkpoint=True if a.resume else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
