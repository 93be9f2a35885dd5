"""Forget a user mid-pass: a deletion honored at the next checkpoint, through a SIGKILL.

A job trains one pass over a Delta table of events (``id``, ``user_id``, ``x``) with
``LakeDataset(..., deletes="honor")``, saving every 5 steps. After step 12 the platform deletes
user 42's rows the way Databricks does (a DELETE written as deletion vectors); the job goes on,
its checkpoint at step 15 observes the deletion and takes the user's rows it has not trained
yet out of the pass. At step 18 the job is SIGKILLed; a new job restores step 15's checkpoint
and trains to the end. Then the auditor asks the ledger and the table alone:

    lakeckpt audit ROOT --where "user_id = 42"          # per run: deleted, stopped_after_step
    lakeckpt audit ROOT --where "user_id = 42" --rows   # per row: steps, version, stopped after

    python examples/forget_user.py

The last line says ``PROOF OK`` (exit 0) when, by the trainer's own record of its batches, no
step after 15 trained on the user (the killed job's lost steps included), every other row was
trained exactly once, and the audit says exposure stopped after step 15 for exactly the
user's rows the run trained on; ``PROOF FAILED`` otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

USER, DELETE_AFTER, KILL_AT, EVERY = 42, 12, 18, 5


def write_events(table: Path) -> None:
    from deltalake import WriterProperties, write_deltalake

    for part in range(3):
        ids = np.arange(part * 1000, (part + 1) * 1000, dtype=np.int64)
        write_deltalake(str(table), pa.table({"id": ids, "user_id": ids % 50,
                                              "x": ids.astype(np.float32)}), mode="append",
                        writer_properties=WriterProperties(max_row_group_size=250),
                        configuration={"delta.enableDeletionVectors": "true"} if part == 0
                        else None)


def delete_user(table: Path) -> int:
    """Delete the user's rows with deletion vectors, as Spark and Databricks write a DELETE."""
    from deltalake import DeltaTable

    from lakeckpt_tables.tools.bench.tables import write_deletion_vectors

    deleted = {}
    for add in pa.table(DeltaTable(str(table)).get_add_actions(flatten=True)).to_pylist():
        users = pq.read_table(table / add["path"], columns=["user_id"]).column(0).to_numpy()
        deleted[add["path"]] = np.flatnonzero(users == USER)
    return write_deletion_vectors(str(table), deleted, predicate=f"user_id = {USER}")


def train(table: Path, root: Path, log: Path) -> None:
    """The job: one pass, a checkpoint every EVERY steps; each batch's ids logged by step."""
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lakeckpt_tables import DeltaSource, LakeDataset
    from lakeckpt_tables.checkpoint import CheckpointManager

    manager = CheckpointManager(root, "forget")
    loader = StatefulDataLoader(LakeDataset(DeltaSource(str(table)), columns=["id", "x"],
                                            batch_size=64, seed=7, deletes="honor"),
                                batch_size=None)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    step = manager.restore(model=model, optimizer=optimizer, dataloader=loader) or 0
    with log.open("a") as out:
        for batch in loader:
            step += 1
            model(batch["x"].unsqueeze(1)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            out.write(json.dumps({"step": step, "ids": batch["id"].tolist()}) + "\n")
            out.flush()
            if step % EVERY == 0:
                manager.save(step, model=model, optimizer=optimizer, dataloader=loader)
            (root / "reached").write_text(str(step))
            while step in (DELETE_AFTER, KILL_AT) and not (root / f"go-{step}").exists():
                time.sleep(0.02)  # the platform deletes, or the job is killed, here
        manager.save(step, model=model, optimizer=optimizer, dataloader=loader)


def _wait(root: Path, step: int, job: subprocess.Popen[bytes]) -> None:
    while not ((root / "reached").exists() and (root / "reached").read_text() == str(step)):
        if job.poll() is not None:
            raise SystemExit(f"the job ended before step {step}")
        time.sleep(0.02)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--job", nargs=3, metavar=("TABLE", "ROOT", "LOG"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.job:
        train(*(Path(a) for a in args.job))
        return 0
    with tempfile.TemporaryDirectory(prefix="lakeckpt-forget-") as tmp:
        work = Path(tmp)
        table, root, log = work / "events", work / "checkpoints", work / "batches.jsonl"
        root.mkdir()
        write_events(table)
        job_args = [sys.executable, __file__, "--job", str(table), str(root), str(log)]
        job = subprocess.Popen(job_args)
        _wait(root, DELETE_AFTER, job)
        version = delete_user(table)
        print(f"step {DELETE_AFTER}: user {USER}'s rows deleted (deletion vectors, version "
              f"{version})")
        (root / f"go-{DELETE_AFTER}").touch()
        _wait(root, KILL_AT, job)
        os.kill(job.pid, signal.SIGKILL)
        job.wait()
        print(f"step {KILL_AT}: the job is SIGKILLed; a new job resumes")
        (root / f"go-{KILL_AT}").touch()
        subprocess.run(job_args, check=True)
        ok = _prove(table, root, log)
    print(f"PROOF OK: no step after {EVERY * (DELETE_AFTER // EVERY + 1)} trained on user "
          f"{USER}, every other row exactly once, and the audit says so" if ok
          else "PROOF FAILED: the run or the audit disagrees with the trainer's record")
    return 0 if ok else 1


def _prove(table: Path, root: Path, log: Path) -> bool:
    from lakeckpt_tables.audit import rows as audit_rows
    from lakeckpt_tables.audit.where import exposure, matches_of
    from lakeckpt_tables.cli import main as lakeckpt

    applied = EVERY * (DELETE_AFTER // EVERY + 1)  # the first checkpoint after the deletion
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    resumed_at = next(i for i in range(1, len(logged))
                      if logged[i]["step"] <= logged[i - 1]["step"])
    first_job = [e for e in logged[:resumed_at] if e["step"] <= logged[resumed_at]["step"] - 1]
    trained = first_job + logged[resumed_at:]  # the steps the run kept (the lost ones dropped)
    ids = [i for e in trained for i in e["ids"]]
    user = {i for i in range(3000) if i % 50 == USER}
    # no step after the checkpoint that applied it, the killed job's lost steps included
    late = [e["step"] for e in logged if e["step"] > applied and user & set(e["ids"])]
    exactly_once = len(ids) == len(set(ids)) and set(ids) - user == set(range(3000)) - user
    lakeckpt(["audit", str(root), "--where", f"user_id = {USER}"])  # what the auditor reads
    rows: list[dict[str, Any]] = audit_rows(root, where=f"user_id = {USER}").to_pylist()
    per_row = pa.Table.from_pylist(rows)
    runs = [r.to_json() for r in exposure(root, matches_of(per_row), per_row=per_row)]
    trained_user = user & set(ids)
    print(f"user {USER}: {len(trained_user)} of {len(user)} rows trained before step "
          f"{applied}; the audit: {runs[0]['deleted']} deleted rows trained, exposure stopped "
          f"after step {runs[0]['stopped_after_step']}")
    return (not late and exactly_once and len(runs) == 1
            and runs[0]["stopped_after_step"] == applied
            and runs[0]["deleted"] == len(trained_user) == len(rows)
            and all(r["stopped_after_step"] == applied and r["last_trained_step"] <= applied
                    for r in rows))


if __name__ == "__main__":
    sys.exit(main())
