"""Read-only restores (issue 32, item 2): evaluating a checkpoint commits nothing and takes no
ownership, so the job training the run saves on while other processes restore its checkpoints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.errors import CheckpointError, CheckpointRestoreError
from lakeckpt_tables.ledger import DeltaLedger

SAVES = 8

TRAIN = """
import json, sys, time, torch
from lakeckpt_tables.checkpoint import CheckpointManager
root, saves = sys.argv[1], int(sys.argv[2])
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
manager = CheckpointManager(root, "r")
manager.restore(model=model, optimizer=optimizer)
for step in range(1, saves + 1):
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    manager.save(step, model=model, optimizer=optimizer, tags=["best"] if step == 1 else [])
    time.sleep(0.3)  # the evaluator restores between saves
print(json.dumps({"owner": manager.owner, "saved": [r.step for r in manager.checkpoints()]}))
"""

EVALUATE = """
import json, pathlib, sys, time, torch
from lakeckpt_tables.checkpoint import CheckpointManager
root, done = sys.argv[1], pathlib.Path(sys.argv[2])
evaluator = CheckpointManager(root, "r")
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
steps = []
deadline = time.monotonic() + 60
while not done.exists() and time.monotonic() < deadline:
    newest = evaluator.restore(model=model, optimizer=optimizer, read_only=True)
    if newest is not None:  # the newest, model and optimizer; the tagged one, model only
        steps += [newest, evaluator.restore(model=model, tag="best", read_only=True)]
    time.sleep(0.1)
print(json.dumps(steps))
"""


@pytest.mark.timeout(120)
def test_a_training_job_saves_on_while_another_process_evaluates_its_checkpoints(
        tmp_path: Path) -> None:
    env = {**os.environ, "LAKECKPT_REGISTRY": "off", "PYTHONWARNINGS": "ignore"}
    root, done = tmp_path / "ckpt", tmp_path / "done"
    evaluator = subprocess.Popen([sys.executable, "-c", EVALUATE, str(root), str(done)],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
    try:
        trained = subprocess.run([sys.executable, "-c", TRAIN, str(root), str(SAVES)], env=env,
                                 capture_output=True, text=True, timeout=100)
    finally:
        done.touch()
        out, err = evaluator.communicate(timeout=60)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert evaluator.returncode == 0, err[-3000:]
    job = json.loads(trained.stdout.splitlines()[-1])
    assert job["saved"] == list(range(1, SAVES + 1))  # never fenced
    evaluated = json.loads(out.splitlines()[-1])
    assert len(evaluated) >= 4 and set(evaluated[1::2]) == {1}, evaluated  # it did evaluate
    assert len(set(evaluated[0::2])) >= 2, evaluated  # ... while the job saved
    ledger = DeltaLedger(str(root / "_ledger"))
    events = [r["event"] for r in ledger.to_arrow().to_pylist() if r["record"] == "event"]
    assert events.count("claim") + events.count("restore") == 1  # the job's own, at its start
    assert ledger.owner("r") == job["owner"]


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
