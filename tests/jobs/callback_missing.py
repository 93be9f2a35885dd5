"""Two ranks of a job whose trainer has the ledger's callback on rank 0 only.

``callback_missing.py DIR RANK TIMEOUT``: the ranks meet through files in DIR (no port to
pick). Both start the check of run ``both`` (rank 0 prints ``both none <s>``). Then rank 0
alone runs ``Trainer.fit`` with ``LakeLedger("lonely", peer_timeout=TIMEOUT)`` (a one-device
Trainer: only its callback sees the world of two), and checks ``both`` again (its keys of the
first start must not stand in for rank 1), printing ``<run> <ErrorClass> <seconds> <message>``
for each; rank 1, like a trainer without the callback, waits in a collective of the default
group (as DDP's all-reduce would) until it is killed.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from lakeckpt_tables.integrations._every_rank import require_every_rank

CALLBACK = "LakeLedger(run_id=...) to the Trainer's callbacks"


def start(run_id: str, timeout: float) -> None:
    outcome(run_id, lambda: require_every_rank(CALLBACK, run_id, timeout))


def fit(where: Path, timeout: float) -> None:
    """Rank 0's Lightning fit with the callback (rank 1 runs none): its ``setup`` must fail."""
    import lightning.pytorch as pl
    import torch

    from lakeckpt_tables.integrations.lightning import LakeLedger

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(1, 1)

        def training_step(self, batch: object, batch_idx: int) -> torch.Tensor:
            raise AssertionError("setup must fail before a step trains")

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self) -> object:
            raise AssertionError("setup must fail before the loader is asked for")

    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[LakeLedger("lonely", root=where / "ck",
                                               peer_timeout=timeout)])
    outcome("lonely", lambda: trainer.fit(Model()))


def outcome(run_id: str, call: Callable[[], object]) -> None:
    began = time.monotonic()
    outcome, message = "none", ""
    try:
        call()
    except Exception as exc:  # its class is the outcome
        outcome, message = type(exc).__name__, " ".join(str(exc).split())
    print(run_id, outcome, round(time.monotonic() - began, 2), message, flush=True)


def main() -> None:
    where, rank, timeout = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    (where / f"ready{rank}").touch()  # imports done
    while not (where / f"ready{1 - rank}").exists():
        time.sleep(0.01)
    dist.init_process_group("gloo", init_method=f"file://{where / 'store'}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=60))
    if rank == 0:
        start("both", 30)
        fit(where, timeout)
        start("both", timeout)
    else:
        require_every_rank(CALLBACK, "both", 30)
        dist.barrier()  # the trainer's own collectives, which rank 0 never joins


if __name__ == "__main__":
    main()
