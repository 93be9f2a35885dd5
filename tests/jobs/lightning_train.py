"""A Lightning job for the integration tests: alone, or under ``torchrun`` as DDP on CPU (gloo).

Each rank appends ``<step> <id,id,...>`` for every batch it trains to ``<out>/rank<r>.log``; on a
resume, lines after the resumed step are dropped (their training died with the crash), so at the
end the logs hold exactly what trained the final model. ``--kill-after-step N`` SIGKILLs rank 0
right after training step N (``--kill-at commit`` instead: after Lightning wrote step N's
checkpoint, before the ledger commit). Rank 0 writes the final parameters to ``params.pt``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.errors import UncommittedCheckpointError
from lakeckpt_tables.integrations.lightning import LakeLedger


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--table", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--run", default="run")
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--every", type=int, default=4)
    p.add_argument("--ckpt", default=None, help="Trainer.fit(ckpt_path=...)")
    p.add_argument("--refused-ckpt", default=None,
                   help="first try Trainer.fit(ckpt_path=this), which must be refused as never "
                        "committed (the message goes to <out>/refused.txt)")
    p.add_argument("--kill-after-step", type=int, default=None)
    p.add_argument("--kill-at", choices=["step", "commit"], default="step")
    p.add_argument("--plain-loader", action="store_true", help="a torch DataLoader (mistake)")
    return p.parse_args(argv)


class Model(pl.LightningModule):
    def __init__(self, a: argparse.Namespace) -> None:
        super().__init__()
        self.a = a
        self.net = nn.Linear(4, 1)
        self.log_file: object = None

    def train_dataloader(self) -> object:
        dataset = LakeDataset(DeltaSource(self.a.table), columns=["id", "x", "y"],
                              batch_size=self.a.batch, seed=7, shuffle_window=2)
        if self.a.plain_loader:
            return torch.utils.data.DataLoader(dataset, batch_size=None)
        return StatefulDataLoader(dataset, batch_size=None, num_workers=self.a.workers)

    def on_train_start(self) -> None:
        os.makedirs(self.a.out, exist_ok=True)
        path = os.path.join(self.a.out, f"rank{self.global_rank}.log")
        if os.path.exists(path):  # what the crash lost is not part of the final model
            with open(path) as f:
                kept = [ln for ln in f if int(ln.split(" ", 1)[0]) <= self.global_step]
            with open(path, "w") as f:
                f.writelines(kept)
        self.log_file = open(path, "a")  # noqa: SIM115

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = nn.functional.mse_loss(self.net(batch["x"]).squeeze(-1), batch["y"])
        ids = ",".join(str(int(i)) for i in batch["id"])
        self.log_file.write(f"{self.global_step + 1} {ids}\n")  # type: ignore[attr-defined]
        self.log_file.flush()  # type: ignore[attr-defined]
        return loss

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        a = self.a
        if a.kill_at == "step" and a.kill_after_step == self.global_step \
                and self.global_rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


class _KillAfterWrite(Checkpoint):
    """SIGKILL once Lightning wrote step N's checkpoint, before LakeLedger commits it (a
    ``Checkpoint``, so Lightning orders it after ModelCheckpoint; LakeLedger moves itself
    last)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step == self.step and trainer.global_rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)


def _fit(a: argparse.Namespace, ckpt: str | None) -> tuple[pl.Trainer, Model]:
    torch.manual_seed(0)
    callbacks: list[pl.Callback] = [
        ModelCheckpoint(dirpath=a.root, every_n_train_steps=a.every, save_top_k=1,
                        save_last=True),
        LakeLedger(a.run)]
    if a.kill_at == "commit" and a.kill_after_step is not None:
        callbacks.append(_KillAfterWrite(a.kill_after_step))
    distributed = "RANK" in os.environ
    trainer = pl.Trainer(
        accelerator="cpu", devices=int(os.environ.get("WORLD_SIZE", "1")),
        strategy="ddp" if distributed else "auto", max_epochs=1, logger=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
        num_sanity_val_steps=0, deterministic=True)
    model = Model(a)
    trainer.fit(model, ckpt_path=ckpt)
    return trainer, model


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    torch.use_deterministic_algorithms(True)
    if a.refused_ckpt is not None:
        try:
            _fit(a, a.refused_ckpt)
        except UncommittedCheckpointError as exc:
            if int(os.environ.get("RANK", "0")) == 0:
                os.makedirs(a.out, exist_ok=True)
                with open(os.path.join(a.out, "refused.txt"), "w") as f:
                    f.write(str(exc))
        else:
            raise SystemExit(f"Trainer.fit(ckpt_path={a.refused_ckpt!r}) was not refused")
    trainer, model = _fit(a, a.ckpt)
    if trainer.global_rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.net.state_dict().items()},
                   os.path.join(a.out, "params.pt"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
