"""Campaign: short processes that read a Delta table and save checkpoints must all exit cleanly.

With ``--job train`` (the default) each process reads a Delta source through LakeDataset,
restores and saves through CheckpointManager (so it reads and writes the Delta ledger), and
exits; with ``--job ledger`` it commits a checkpoint to the Delta ledger and reads the ledger
back (no torch: ~10x faster, and the ledger is where the abort came from). Any exit other than 0
(SIGABRT "terminate called without an active exception" from a filesystem thread alive at
interpreter shutdown was the failure this guards against) is counted and its stderr tail shown.

    python scripts/exit_campaign.py --processes 200 --parallel 2
    python scripts/exit_campaign.py --job ledger --processes 200
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_JOB = """
import sys, torch
from torchdata.stateful_dataloader import StatefulDataLoader
from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager
table, root, run = sys.argv[1:4]
loader = StatefulDataLoader(LakeDataset(DeltaSource(table), batch_size=16, seed=1),
                            batch_size=None)
model = torch.nn.Linear(1, 1)
manager = CheckpointManager(root, run)
step = manager.restore(model=model, dataloader=loader) or 0
for _, _ in zip(loader, range(2)):
    step += 1
manager.save(step + 1, model=model, dataloader=loader)
print(len(manager.checkpoints()))
"""

_LEDGER_JOB = """
import sys
from lakeckpt_tables.ledger import CheckpointRecord, DeltaLedger
ledger = DeltaLedger(sys.argv[1])
ledger.commit(CheckpointRecord(
    run_id=f"run-{sys.argv[2]}", checkpoint_id=f"c-{sys.argv[2]}", step=1, parent_id=None,
    model_location="m", manifest={}, reader_state="", source=None, source_version=None,
    world_size=1, tags=(), config_hash="h", wall_time_s=0.0))
for _ in range(3):
    ledger.checkpoints()
    ledger.consumption()
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--processes", type=int, default=200)
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--runs", type=int, default=8, help="distinct run ids sharing the ledger")
    p.add_argument("--job", choices=("train", "ledger"), default="train")
    a = p.parse_args()
    import numpy as np
    import pyarrow as pa
    from deltalake import write_deltalake

    work = Path(tempfile.mkdtemp(prefix="lakeckpt-exit-"))
    table = work / "table"
    write_deltalake(str(table), pa.table({"id": np.arange(4000, dtype=np.int64)}))

    def one(k: int) -> tuple[int, str]:
        if a.job == "train":
            cmd = ["-c", _JOB, str(table), str(work / "ckpt"), f"run-{k % a.runs}"]
        else:
            cmd = ["-c", _LEDGER_JOB, str(work / "ledger"), str(k)]
        done = subprocess.run([sys.executable, *cmd], capture_output=True, text=True,
                              timeout=300)
        return done.returncode, done.stderr[-300:]

    t0 = time.monotonic()
    with ThreadPoolExecutor(a.parallel) as pool:
        results = list(pool.map(one, range(a.processes)))
    abnormal = [(k, rc, err) for k, (rc, err) in enumerate(results) if rc != 0]
    for k, rc, err in abnormal[:10]:
        print(f"process {k}: exit {rc}: {err.strip().splitlines()[-1] if err.strip() else ''}")
    print(f"processes: {a.processes}  abnormal exits: {len(abnormal)}  "
          f"({time.monotonic() - t0:.0f} s, work dir {work})")
    return 1 if abnormal else 0


if __name__ == "__main__":
    sys.exit(main())
