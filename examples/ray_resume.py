"""Ray Train from a Delta table: 2 workers, one SIGKILLed mid-epoch, Ray restarts, exactly once.

A local Ray cluster on 127.0.0.1 runs a ``TorchTrainer`` with ``FailureConfig(max_failures=2)``
over 2 CPU workers. The lines a Ray Train user adds are marked ``# <- lakeckpt``: a
``LakeDataset`` under torchdata's ``StatefulDataLoader``, and ``RayTrainLedger``, whose
``report`` is ``ray.train.report(checkpoint=...)`` plus the ledger commit and whose ``resume``
is the ledger's newest committed checkpoint (Ray registers reported checkpoints late: the ledger
decides). One worker SIGKILLs itself mid-epoch, once; Ray restarts the worker group, which
resumes from the ledger. Then the script proves from the row ids each rank trained that every
row trained exactly once, in the order of an uninterrupted run, and that ``lakeckpt verify``
passes on the ledger.

    pip install "lakeckpt-tables[ray]"
    python examples/ray_resume.py                  # a synthetic table in a temp dir
    python examples/ray_resume.py --work /tmp/ray  # keep the checkpoints and the ledger

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
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.plan.check import check_exactly_once

RUN = "ray-example"


def train_loop(config: dict[str, Any]) -> None:
    """``train_loop_per_worker``: runs on each Ray worker, again after every restart."""
    import ray.train

    from lakeckpt_tables.integrations.ray_train import RayTrainLedger  # <- lakeckpt

    rank = ray.train.get_context().get_world_rank()
    work = Path(config["work"])
    torch.manual_seed(0)
    model = nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    dataset = LakeDataset(DeltaSource(config["table"]), columns=["id", "x", "y"],  # <- lakeckpt
                          batch_size=config["batch_size"], seed=0)
    loader = StatefulDataLoader(dataset, batch_size=None)  # <- lakeckpt
    ledger = RayTrainLedger(config["root"], RUN)  # <- lakeckpt
    checkpoint = ledger.resume(loader)  # <- lakeckpt: the ledger's newest committed checkpoint
    step = 0
    if checkpoint is not None:
        state = torch.load(os.path.join(checkpoint.path, "model.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    log = work / f"ids-rank{rank}.txt"
    for batch in loader:
        step += 1
        optimizer.zero_grad()
        nn.functional.mse_loss(model(batch["x"]).squeeze(-1), batch["y"]).backward()
        for p in model.parameters():  # data parallel by hand: the model is tiny
            assert p.grad is not None
            torch.distributed.all_reduce(p.grad)
            p.grad /= 2
        optimizer.step()
        with open(log, "a") as f:
            f.write(f"{step} {','.join(map(str, batch['id'].tolist()))}\n")
        if step % config["every"] == 0:
            with tempfile.TemporaryDirectory() as tmp:
                if rank == 0:
                    torch.save({"model": model.state_dict(), "step": step,
                                "optimizer": optimizer.state_dict()}, os.path.join(tmp, "model.pt"))
                ledger.report({"step": step}, step=step, dataloader=loader,  # <- lakeckpt
                              checkpoint_dir=tmp if rank == 0 else None)
        marker = work / "killed-once"
        if step == config["kill_after_step"] and rank == 1 and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)  # a worker lost mid-epoch


def _trained(work: Path) -> dict[int, list[list[int]]]:
    """Each rank's batches that trained the final model (the restarted group's lines win)."""
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
    p.add_argument("--every", type=int, default=5, help="report a checkpoint every N steps")
    p.add_argument("--kill-after-step", type=int, default=13)
    args = p.parse_args()
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    work = Path(args.work or tempfile.mkdtemp(prefix="lakeckpt-ray-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    table = work / "table"
    if not table.exists():
        write_delta(table, [(lo, min(lo + 500, args.rows)) for lo in range(0, args.rows, 500)],
                    group_rows=250)
    storage = work / "storage"
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1",
                                       "PYTHONPATH": str(Path(__file__).parent)}})
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"work": str(work), "table": str(table), "every": args.every,
                           "root": str(storage / RUN), "batch_size": args.batch_size,
                           "kill_after_step": args.kill_after_step},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(name=RUN, storage_path=str(storage),
                             failure_config=FailureConfig(max_failures=2)))
    result = trainer.fit()
    ray.shutdown()
    print(f"Ray Train finished: error {result.error!r}; a worker was SIGKILLed: "
          f"{(work / 'killed-once').exists()}")
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
                             str(storage / RUN)])
    ok = result.error is None and (work / "killed-once").exists() and bool(verdict) and same \
        and verify.returncode == 0
    print("PROOF OK" if ok else "PROOF FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
