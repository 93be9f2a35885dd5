"""A deletion request: which checkpoints saw user 42, and which runs must be retrained?

Two runs train from one Delta table of events (``id``, ``user_id``, ``x``): run ``before`` is
pinned to the version written before user 42's rows were appended, run ``after`` reads the
table once they are in, with shuffling, and stops half way. Then the auditor asks, from the
ledger and the table alone:

    lakeckpt audit ROOT --where "user_id = 42" --table TABLE

which recomputes, from the pure read plan and the reader positions the ledger holds, the exact
rows every checkpoint trained on (even inside shuffled windows) and evaluates the predicate on
them. A checkpoint's model has seen user 42 if it, or any checkpoint it was resumed from,
trained on one of those rows: those models must be deleted or retrained.

    python examples/audit_deletion.py

The last line says ``PROOF OK`` (exit 0) when the audit names exactly the checkpoints whose
batches (recorded by the trainer itself) held a row of user 42; ``PROOF FAILED`` otherwise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from deltalake import WriterProperties, write_deltalake
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager

USER = 42


def write_events(path: Path, lo: int, hi: int, users: range) -> None:
    ids = np.arange(lo, hi, dtype=np.int64)
    user_ids = np.array(users, dtype=np.int64)[ids % len(users)]
    write_deltalake(str(path), pa.table({"id": ids, "user_id": user_ids,
                                         "x": ids.astype(np.float32)}),
                    mode="append", writer_properties=WriterProperties(max_row_group_size=100))


def train(table: Path, root: Path, run_id: str, version: int | None,
          max_steps: int | None) -> dict[str, list[int]]:
    """Train, checkpointing every 4 steps; return the user ids each checkpoint's batches held."""
    manager = CheckpointManager(root, run_id)
    loader = StatefulDataLoader(LakeDataset(DeltaSource(str(table)), columns=["user_id", "x"],
                                            batch_size=32, seed=3, version=version,
                                            shuffle_window=2), batch_size=None)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    users: list[int] = []
    seen: dict[str, list[int]] = {}
    for step, batch in enumerate(loader, start=1):
        loss = model(batch["x"].unsqueeze(1)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        users.extend(int(u) for u in batch["user_id"])
        if step % 4 == 0:
            record = manager.save(step, model=model, optimizer=optimizer, dataloader=loader)
            assert record is not None
            seen[record.checkpoint_id], users = users, []
        if max_steps is not None and step >= max_steps:
            break
    return seen


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lakeckpt-deletion-") as tmp:
        work = Path(tmp)
        table, root = work / "events", work / "checkpoints"
        write_events(table, 0, 2000, range(0, 40))        # version 0: users 0..39
        write_events(table, 2000, 3000, range(40, 50))    # version 1: users 40..49 arrive
        print("runs: 'before' trains on version 0 (users 0..39); 'after' on version 1, half way")
        expected = {"before": train(table, root, "before", 0, None),
                    "after": train(table, root, "after", None, 40)}
        # the auditor's side: the ledger and the table, nothing the trainer kept
        done = subprocess.run([sys.executable, "-m", "lakeckpt_tables.cli", "audit", str(root),
                               "--where", f"user_id = {USER}", "--table", str(table),
                               "--output", "json"], capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr)
            return 1
        found: list[dict[str, Any]] = json.loads(done.stdout)
        subprocess.run([sys.executable, "-m", "lakeckpt_tables.cli", "audit", str(root),
                        "--where", f"user_id = {USER}", "--table", str(table)])
        for run in found:
            print(f"run {run['run_id']}: user {USER} first trained at step {run['first_step']}, "
                  f"last at step {run['last_step']} ({run['rows']} rows); "
                  f"{len(run['exposed'])} checkpoint(s) to delete or retrain")
        retrain = sorted(r["run_id"] for r in found)
        print(f"runs to retrain: {retrain or 'none'}")
        truth = {run: [c for c, users in seen.items() if USER in users]
                 for run, seen in expected.items()}
        ok = (retrain == ["after"] and found[0]["checkpoints"] == truth["after"]
              and not truth["before"]
              and found[0]["rows"] == sum(users.count(USER)
                                          for users in expected["after"].values()))
    print("PROOF OK: the audit named exactly the checkpoints whose batches held user 42" if ok
          else "PROOF FAILED: the audit and the trainer disagree")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
