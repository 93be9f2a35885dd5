"""save() on the paths users take: a second save at a step, a fallback, foreign parameters, faults.

Real Delta tables and ledgers on local disk; a real full disk (a small tmpfs, when the tests may
mount one).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from deltalake import WriterProperties, write_deltalake
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.errors import (
    CheckpointError,
    CheckpointWriteError,
    CommitConflictError,
    RunFencedError,
)
from lakeckpt_tables.ledger import DeltaLedger

ROWS = 120


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("src") / "t"
    props = WriterProperties(max_row_group_size=20)
    for start in range(0, ROWS, 60):
        ids = np.arange(start, start + 60, dtype=np.int64)
        write_deltalake(str(path), pa.table({"id": ids}), mode="append", writer_properties=props)
    return path


def _loader(table: Path) -> StatefulDataLoader:
    dataset = LakeDataset(DeltaSource(str(table)), batch_size=8, seed=5, shuffle_window=2)
    return StatefulDataLoader(dataset, batch_size=None)


def _events(root: Path, name: str) -> list[dict[str, object]]:
    """Details of the ledger's events of that name, oldest first."""
    rows = DeltaLedger(str(root / "_ledger")).to_arrow().sort_by("committed_at").to_pylist()
    return [json.loads(r["detail"]) for r in rows if r["event"] == name]


def _ids(batches: list[dict[str, torch.Tensor]]) -> list[int]:
    return [int(i) for b in batches for i in b["id"]]


# -- a second save at the same step ----------------------------------------------------------


def test_a_final_save_at_the_step_the_loop_saved_returns_the_committed_checkpoint(
        table: Path, tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    loader = _loader(table)
    it = iter(loader)
    next(it), next(it)
    manager = CheckpointManager(tmp_path, "r")
    first = manager.save(2, model=model, dataloader=loader)
    again = manager.save(2, model=model, dataloader=loader)
    assert again == first
    assert [r.checkpoint_id for r in manager.checkpoints()] == [first.checkpoint_id]
    assert sorted(os.listdir(tmp_path / "r")) == [Path(first.model_location).name]
    assert DeltaLedger(str(tmp_path / "_ledger")).consumption(run_id="r").num_rows == len(
        DeltaLedger(str(tmp_path / "_ledger")).consumption(checkpoint_id=first.checkpoint_id))


def test_a_finished_run_relaunched_finds_its_final_checkpoint_at_the_same_step(
        table: Path, tmp_path: Path) -> None:
    """The README's "a run that finished stays finished": restore, a loop that yields nothing
    (its DataLoader drew a seed from torch's RNG), the final save: that checkpoint, no
    conflict (NOTE [ a save at the restored step ]); a changed model still conflicts."""
    model = torch.nn.Linear(2, 1)
    loader = _loader(table)
    manager = CheckpointManager(tmp_path, "r")
    step = sum(1 for _ in loader)  # trained to the end
    final = manager.save(step, model=model, dataloader=loader)
    for changed in (False, True):
        again, loader = CheckpointManager(tmp_path, "r"), _loader(table)
        assert again.restore(model=model, dataloader=loader) == step
        assert list(loader) == []
        if not changed:
            assert again.save(step, model=model, dataloader=loader) == final
            continue
        with torch.no_grad():
            model.weight.add_(1.0)
        with pytest.raises(CommitConflictError, match="with other content"):
            again.save(step, model=model, dataloader=loader)
    assert [r.checkpoint_id for r in manager.checkpoints()] == [final.checkpoint_id]


def test_a_second_save_at_a_step_with_other_content_is_a_named_conflict(
        table: Path, tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    manager = CheckpointManager(tmp_path, "r")
    first = manager.save(2, model=model)
    with torch.no_grad():
        model.weight.add_(1.0)
    with pytest.raises(CommitConflictError, match=r"run r step 2 is already committed as "
                       rf"checkpoint {first.checkpoint_id} with other content"):
        manager.save(2, model=model)
    assert [r.checkpoint_id for r in manager.checkpoints()] == [first.checkpoint_id]
    assert sorted(os.listdir(tmp_path / "r")) == [Path(first.model_location).name]


def test_another_jobs_commit_at_that_step_stays_a_conflict_even_with_the_same_content(
        tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    CheckpointManager(tmp_path, "r").save(2, model=model)
    with pytest.raises(CommitConflictError, match="'r'"):
        CheckpointManager(tmp_path, "r").save(2, model=model)


# -- a checkpoint restore skips is retired --------------------------------------------------


def _damage(root: Path, location: str) -> None:
    shard = next(p for p in (root / location).iterdir() if p.suffix == ".distcp")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))


def test_a_run_that_fell_back_from_10_to_5_saves_10_again_and_every_restart_works(
        table: Path, tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    manager = CheckpointManager(tmp_path, "r")
    manager.save(5, model=model)
    ten = manager.save(10, model=model)
    _damage(tmp_path, ten.model_location)

    second = CheckpointManager(tmp_path, "r")
    assert second.restore(model=model) == 5
    retired = _events(tmp_path, "retired")
    assert [(e["checkpoint_id"], e["step"]) for e in retired] == [(ten.checkpoint_id, 10)]
    assert "fail verification" in str(retired[0]["reason"])
    assert [r.step for r in second.checkpoints()] == [5]
    new_ten = second.save(10, model=model)
    assert new_ten.checkpoint_id != ten.checkpoint_id
    assert [r.checkpoint_id for r in second.checkpoints()][-1] == new_ten.checkpoint_id
    for _ in range(2):  # every later restart restores the new step 10 and saves on
        job = CheckpointManager(tmp_path, "r")
        assert job.restore(model=model) == 10
    assert job.save(15, model=model).parent_id == new_ten.checkpoint_id


def test_a_run_whose_every_checkpoint_is_damaged_starts_over_and_the_ledger_says_so(
        table: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    loader = _loader(table)
    batches = iter(loader)
    first = [next(batches) for _ in range(3)]
    only = CheckpointManager(tmp_path, "r").save(3, model=model, dataloader=loader)
    _damage(tmp_path, only.model_location)

    again = _loader(table)
    job = CheckpointManager(tmp_path, "r")
    assert job.restore(model=model, dataloader=again) is None  # a fresh run, not an error
    retired = _events(tmp_path, "retired")
    assert [(e["checkpoint_id"], e["step"]) for e in retired] == [(only.checkpoint_id, 3)]
    assert [e["retired_steps"] for e in _events(tmp_path, "restart")] == [[3]]
    assert job.checkpoints() == []
    # the reader starts at the beginning: the damaged checkpoint's rows are read again
    assert _ids([next(iter(again)) for _ in range(1)]) == _ids(first[:1])
    assert job.save(3, model=model, dataloader=again).parent_id is None


def test_restore_records_which_checkpoint_and_how_many_steps_were_lost(
        table: Path, tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    manager = CheckpointManager(tmp_path, "r")
    five = manager.save(5, model=model)
    ten = manager.save(10, model=model)
    assert CheckpointManager(tmp_path, "r").restore(model=model) == 10
    _damage(tmp_path, ten.model_location)
    assert CheckpointManager(tmp_path, "r").restore(model=model) == 5
    restores = _events(tmp_path, "restore")
    assert [(e["checkpoint_id"], e["step"], e["newest_step"], e["steps_lost"])
            for e in restores] == [(ten.checkpoint_id, 10, 10, 0), (five.checkpoint_id, 5, 10, 5)]


# -- an optimizer over parameters the model does not hold ------------------------------------


def test_an_optimizer_over_another_models_parameters_is_refused_at_save_naming_the_fix(
        tmp_path: Path) -> None:
    model, head = torch.nn.Linear(3, 1), torch.nn.Linear(1, 2)
    optimizer = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1, momentum=0.9)
    (head(model(torch.ones(2, 3)))).sum().backward()
    optimizer.step()
    manager = CheckpointManager(tmp_path, "r")
    with pytest.raises(CheckpointError, match=r"updates 2 parameter\(s\) that are not "
                       r"parameters of the model .*\(shapes \[\(2, 1\), \(2,\)\]\).*ModuleDict"):
        manager.save(1, model=model, optimizer=optimizer)
    assert manager.checkpoints() == [] and not (tmp_path / "r").exists()
    both = torch.nn.ModuleDict({"model": model, "head": head})
    manager.save(1, model=both, optimizer=optimizer)
    fresh = torch.nn.ModuleDict({"model": torch.nn.Linear(3, 1), "head": torch.nn.Linear(1, 2)})
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    assert CheckpointManager(tmp_path, "r").restore(model=fresh, optimizer=fresh_opt) == 1
    assert all(torch.equal(a, b) for a, b in zip(both.parameters(), fresh.parameters(),
                                                 strict=True))
    assert fresh_opt.state_dict()["state"][3]["momentum_buffer"].equal(
        optimizer.state_dict()["state"][3]["momentum_buffer"])


# -- faults in save ---------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> object:
    """A real 64 KiB file system (tmpfs): writes beyond it fail with ENOSPC."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_is_a_named_write_error_saying_enospc_and_leaves_nothing(
        tmp_path: Path, small_disk: Path) -> None:
    manager = CheckpointManager(small_disk, "r", ledger=f"delta:{tmp_path / 'ledger'}")
    manager.save(1, model=torch.nn.Linear(2, 1))
    big = torch.nn.Linear(256, 256)  # 257 KiB of parameters
    with pytest.raises(CheckpointWriteError,
                       match=r"run r at step 2 .*not saved.*the disk is full \(ENOSPC\)"):
        manager.save(2, model=big)
    assert [r.step for r in manager.checkpoints()] == [1]
    assert len(os.listdir(small_disk / "r")) == 1
    assert manager.save(3, model=torch.nn.Linear(2, 1)).step == 3


def _ledger_files(root: Path) -> list[Path]:
    return sorted((root / "_ledger").glob("*.parquet"), key=lambda p: p.stat().st_mtime_ns)


def test_a_failed_compaction_after_a_landed_commit_is_an_event_not_a_failure(
        tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, "r", compact_every=2)
    manager.save(1, model=torch.nn.Linear(2, 1))
    (first,) = _ledger_files(tmp_path)
    first.write_bytes(first.read_bytes()[:100])  # compaction must read it, and cannot
    record = manager.save(2, model=torch.nn.Linear(2, 1))
    assert record.step == 2
    # the way out the named error gives: move the damaged file aside, repair the log
    from deltalake import DeltaTable

    first.rename(tmp_path / "damaged.parquet")
    DeltaTable(str(tmp_path / "_ledger")).repair()
    ledger = DeltaLedger(str(tmp_path / "_ledger"))
    assert [r.checkpoint_id for r in ledger.checkpoints("r")] == [record.checkpoint_id]
    (event,) = _events(tmp_path, "compaction_failed")
    assert "damaged.parquet" not in str(event["error"]) and "lakeckpt-" in str(event["error"])


def test_a_job_that_did_not_restore_cannot_write_into_a_run_another_job_owns(
        tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    CheckpointManager(tmp_path, "r").save(1, model=model)
    with pytest.raises(RunFencedError, match="run 'r' is owned by job"):
        CheckpointManager(tmp_path, "r").save(2, model=model)


def test_a_lost_response_after_a_landed_commit_is_settled_from_the_log_and_nothing_deleted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit lands, then the call fails (the response was lost): save() asks the ledger
    again, which finds the checkpoint through the run's app transaction, and returns it."""
    from typing import Any

    from deltalake import DeltaTable

    real = DeltaTable.create_write_transaction
    calls: list[int] = []

    def land_then_fail(self: DeltaTable, *args: Any, **kwargs: Any) -> Any:
        out = real(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            raise OSError("injected: connection reset after the commit landed")
        return out

    manager = CheckpointManager(tmp_path, "r")
    manager.save(1, model=torch.nn.Linear(2, 1))
    monkeypatch.setattr(DeltaTable, "create_write_transaction", land_then_fail)
    record = manager.save(2, model=torch.nn.Linear(2, 1))
    monkeypatch.undo()
    assert record.step == 2 and len(calls) == 1  # the retry found it and committed nothing
    ledger = DeltaLedger(str(tmp_path / "_ledger"))
    assert [r.checkpoint_id for r in ledger.checkpoints("r")][1] == record.checkpoint_id
    assert ledger.to_arrow().filter(pa.compute.field("record") == "checkpoint").num_rows == 2
    assert manager.gc() == []
    assert (tmp_path / record.model_location).is_dir()
    assert CheckpointManager(tmp_path, "r").restore(model=torch.nn.Linear(2, 1)) == 2


def test_gc_in_a_job_that_no_longer_owns_the_run_removes_nothing(tmp_path: Path) -> None:
    old = CheckpointManager(tmp_path, "r")
    old.save(1, model=torch.nn.Linear(2, 1))
    new = CheckpointManager(tmp_path, "r")
    assert new.restore(model=torch.nn.Linear(2, 1)) == 1
    in_flight = tmp_path / "r" / "step-000000002-0123abcd"
    in_flight.mkdir()
    with pytest.raises(RunFencedError, match=r"gc removes nothing"):
        old.gc()
    assert in_flight.is_dir()
    assert new.gc() == ["r/step-000000002-0123abcd"]
