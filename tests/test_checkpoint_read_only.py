"""Read-only restores (issue 32, item 2): evaluating a checkpoint commits nothing and takes no
ownership, so the job training the run saves on while other processes restore its checkpoints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.errors import CheckpointError, CheckpointRestoreError
from lakeckpt_tables.ledger import DeltaLedger

SAVES = 8

EVALUATE = """
import json, os, pathlib, sys, time, torch
from lakeckpt_tables.checkpoint import CheckpointManager
root, done, seen = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
evaluator = CheckpointManager(root, "r")
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
steps, last = [], 0
deadline = time.monotonic() + 90
while not done.exists() and time.monotonic() < deadline:
    records = evaluator.checkpoints()
    if not records or records[-1].step <= last:
        time.sleep(0.05)
        continue  # evaluate each new checkpoint once: the newest, model and optimizer...
    last = evaluator.restore(model=model, optimizer=optimizer, read_only=True)
    steps += [last, evaluator.restore(model=model, tag="best", read_only=True)]  # ... tagged
    pathlib.Path(f"{seen}.tmp").write_text(str(last))
    os.replace(f"{seen}.tmp", seen)
print(json.dumps(steps))
"""


@pytest.mark.timeout(120)
def test_a_training_job_saves_on_while_another_process_evaluates_its_checkpoints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job trains here; the evaluator is a process of its own (one process start: the
    costly part)."""
    monkeypatch.setenv("LAKECKPT_REGISTRY", "off")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    root, done, seen = tmp_path / "ckpt", tmp_path / "done", tmp_path / "seen"
    evaluator = subprocess.Popen([sys.executable, "-c", EVALUATE, str(root), str(done),
                                  str(seen)], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    try:
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        job = CheckpointManager(root, "r")
        job.restore(model=model, optimizer=optimizer)
        for step in range(1, SAVES + 1):
            model(torch.ones(1, 4)).sum().backward()
            optimizer.step()
            job.save(step, model=model, optimizer=optimizer, tags=["best"] if step == 1 else [])
            deadline = time.monotonic() + 30  # go on once the evaluator restored this step
            while time.monotonic() < deadline and evaluator.poll() is None and \
                    int(seen.read_text() if seen.exists() else 0) < step:
                time.sleep(0.02)
    finally:
        done.touch()
        out, err = evaluator.communicate(timeout=60)
    assert evaluator.returncode == 0, err[-3000:]
    assert [r.step for r in job.checkpoints()] == list(range(1, SAVES + 1))  # never fenced
    evaluated = json.loads(out.splitlines()[-1])
    # it evaluated every checkpoint as it came, between the job's saves (the job waited for
    # it), and the tagged one each time
    assert set(evaluated[0::2]) == set(range(1, SAVES + 1)), evaluated
    assert set(evaluated[1::2]) == {1}, evaluated
    ledger = DeltaLedger(str(root / "_ledger"))
    events = [r["event"] for r in ledger.to_arrow().to_pylist() if r["record"] == "event"]
    assert events.count("claim") + events.count("restore") == 1  # the job's own, at its start
    assert ledger.owner("r") == job.owner


def test_a_read_only_restore_retires_nothing_and_its_manager_cannot_save(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKECKPT_REGISTRY", "off")
    model = torch.nn.Linear(1, 1)
    job = CheckpointManager(tmp_path, "r")
    job.save(1, model=model)
    newest = job.save(2, model=model)
    shard = next((tmp_path / newest.model_location).glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[::-1])  # step 2 fails verification
    rows = DeltaLedger(str(tmp_path / "_ledger")).to_arrow().num_rows
    evaluator = CheckpointManager(tmp_path, "r")
    assert evaluator.restore(model=model, read_only=True) == 1  # step 2 skipped...
    assert DeltaLedger(str(tmp_path / "_ledger")).to_arrow().num_rows == rows  # not retired
    with pytest.raises(CheckpointRestoreError, match=r"step 2 .* is not restorable"):
        evaluator.restore(model=model, step=2, read_only=True)
    with pytest.raises(CheckpointError, match=r"restored it read-only .* cannot save"):
        evaluator.save(3, model=model)
    assert DeltaLedger(str(tmp_path / "_ledger")).owner("r") == job.owner


def test_a_read_only_restore_with_a_loader_resumes_it_at_that_step_and_commits_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np
    import pyarrow as pa
    from deltalake import write_deltalake
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lakeckpt_tables import DeltaSource, LakeDataset

    monkeypatch.setenv("LAKECKPT_REGISTRY", "off")
    write_deltalake(str(tmp_path / "t"), pa.table({"id": np.arange(40)}))

    def loader() -> StatefulDataLoader:
        return StatefulDataLoader(LakeDataset(DeltaSource(str(tmp_path / "t")), batch_size=4,
                                              seed=3), batch_size=None)

    whole = [i for b in loader() for i in b["id"].tolist()]
    job, training = CheckpointManager(tmp_path / "ckpt", "r"), loader()
    for step, _ in enumerate(training, 1):
        if step in (2, 4):
            job.save(step, dataloader=training)
        if step == 4:
            break
    ledger = DeltaLedger(str(tmp_path / "ckpt" / "_ledger"))
    rows = ledger.to_arrow().num_rows
    evaluated = loader()
    assert CheckpointManager(tmp_path / "ckpt", "r").restore(
        dataloader=evaluated, step=2, read_only=True) == 2
    assert [i for b in evaluated for i in b["id"].tolist()] == whole[2 * 4:]
    assert (ledger.to_arrow().num_rows, ledger.owner("r")) == (rows, job.owner)
    job.save(5, dataloader=training)  # the owner saves on
