"""restore() when things are missing or wrong: never stuck, and a failed restore changes nothing.

Real Delta tables and ledgers on local disk; the restore after damage runs in a fresh process.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from deltalake import WriterProperties, write_deltalake
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.errors import CheckpointRestoreError, RunFencedError, RunInUseError
from lakeckpt_tables.ledger import CheckpointRecord, DeltaLedger

ROWS = 48
BATCH = 4
SAVE_EVERY = 3


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("src") / "t"
    props = WriterProperties(max_row_group_size=8)
    for start in range(0, ROWS, 24):
        ids = np.arange(start, start + 24, dtype=np.int64)
        write_deltalake(str(path), pa.table({"id": ids}), mode="append", writer_properties=props)
    return path


@pytest.fixture(autouse=True)
def _no_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKECKPT_REGISTRY", "off")


def train(table: str, root: str, *, stop: int | None = None) -> dict[str, object]:
    """Restore run "r", train to ``stop`` (or the end) saving every few steps and at the end;
    the restored step and the ids each step trained on."""
    dataset = LakeDataset(DeltaSource(table), batch_size=BATCH, seed=7, shuffle_window=2)
    loader = StatefulDataLoader(dataset, batch_size=None)
    model = torch.nn.Linear(1, 1)
    manager = CheckpointManager(root, "r")
    restored = manager.restore(model=model, dataloader=loader) or 0
    step, ids = restored, []
    for batch in loader:
        step += 1
        ids.append([int(i) for i in batch["id"]])
        if step % SAVE_EVERY == 0:
            manager.save(step, model=model, dataloader=loader)
        if step == stop:
            break
    manager.save(step, model=model, dataloader=loader)
    return {"restored": restored, "ids": ids}


FRESH_PROCESS = """
import json, sys, traceback
sys.path.insert(0, sys.argv[2])
from test_checkpoint_restore import train
results = {}
for root in sys.argv[3:]:
    try:
        results[root] = train(sys.argv[1], root)
    except Exception:
        results[root] = {"error": traceback.format_exc()}
print(json.dumps(results))
"""


def _events(root: Path, name: str) -> list[dict[str, object]]:
    rows = DeltaLedger(str(root / "_ledger")).to_arrow().sort_by("committed_at").to_pylist()
    return [json.loads(r["detail"]) for r in rows if r["event"] == name]


def _lose(root: Path, what: str, location: str, ledger_file: Path) -> None:
    directory = root / location
    if what == "directory":
        for f in directory.iterdir():
            f.unlink()
        directory.rmdir()
    elif what == "shard":
        next(directory.glob("*.distcp")).unlink()
    elif what == "manifest":
        (directory / ".metadata").unlink()
    else:
        ledger_file.unlink()


LOSSES = ["directory", "shard", "manifest", "ledger file"]


@dataclass
class Damaged:
    """A run stopped after its second checkpoint, which then lost ``what``; and how a fresh
    process restoring it went on."""

    root: Path
    first: dict[str, Any]
    newest: CheckpointRecord
    ledger_file: Path
    rest: dict[str, Any]


@pytest.fixture(scope="module")
def damaged(table: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Damaged]:
    """Every kind of loss, each in a run of its own, restored and trained to the end by one
    fresh process (its start costs more than the four restores, run one after the other)."""
    runs = {}
    for what in LOSSES:
        root = tmp_path_factory.mktemp("damaged")
        first = train(str(table), str(root), stop=2 * SAVE_EVERY)
        newest = DeltaLedger(str(root / "_ledger")).checkpoints("r")[-1]
        assert newest.step == 2 * SAVE_EVERY
        ledger_file = max((root / "_ledger").glob("*.parquet"), key=lambda p: p.stat().st_mtime)
        _lose(root, what, newest.model_location, ledger_file)
        runs[what] = Damaged(root, first, newest, ledger_file, {})
    env = {**os.environ, "LAKECKPT_REGISTRY": "off", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(table),
                           str(Path(__file__).parent), *(str(d.root) for d in runs.values())],
                          env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for run in runs.values():
        run.rest = results[str(run.root)]
    return runs


@pytest.mark.timeout(120)
@pytest.mark.parametrize("what", LOSSES)
def test_a_run_whose_newest_checkpoint_lost_files_goes_on_from_the_previous_exactly_once(
        table: Path, damaged: dict[str, Damaged], what: str) -> None:
    dataset = LakeDataset(DeltaSource(str(table)), batch_size=BATCH, seed=7, shuffle_window=2)
    uninterrupted = [[int(i) for i in b["id"]] for b in StatefulDataLoader(dataset,
                                                                           batch_size=None)]
    run = damaged[what]
    tmp_path, first, newest, ledger_file, rest = (run.root, run.first, run.newest,
                                                  run.ledger_file, run.rest)
    assert "error" not in rest, rest.get("error")
    assert rest["restored"] == SAVE_EVERY
    assert first["ids"][:SAVE_EVERY] + rest["ids"] == uninterrupted  # exactly once, in order
    steps = [r.step for r in DeltaLedger(str(tmp_path / "_ledger")).checkpoints("r")]
    assert steps == list(range(SAVE_EVERY, len(uninterrupted) + 1, SAVE_EVERY))  # 6 again
    if what == "ledger file":
        (repaired,) = _events(tmp_path, "ledger_repaired")
        assert repaired["files"] == [ledger_file.name] and repaired["missing"] is True
    else:
        (retired,) = _events(tmp_path, "retired")
        assert (retired["checkpoint_id"], retired["step"]) == (newest.checkpoint_id,
                                                               newest.step)
        named = {"directory": "directory", "shard": ".distcp", "manifest": ".metadata"}[what]
        assert any(named in m for m in retired["missing"])  # type: ignore[union-attr]
        assert "missing" in str(retired["reason"])
    # and a later restart restores the end of the run
    assert CheckpointManager(tmp_path, "r").restore(model=torch.nn.Linear(1, 1)) == len(
        uninterrupted)


def _ledger_rows(root: Path) -> int:
    return DeltaLedger(str(root / "_ledger")).to_arrow().num_rows


def test_a_model_or_optimizer_that_does_not_fit_is_named_and_changes_nothing(
        tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    owner = CheckpointManager(tmp_path, "r")
    owner.save(1, model=model)
    rows = _ledger_rows(tmp_path)

    wider = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
    with pytest.raises(CheckpointRestoreError,
                       match=r"1 of another shape: model\.0\.weight: checkpoint \(3, 2\), "
                             r"here \(3, 4\).*Nothing was loaded"):
        CheckpointManager(tmp_path, "r").restore(model=wider)
    deeper = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1),
                                 torch.nn.Linear(1, 1))
    with pytest.raises(CheckpointRestoreError,
                       match=r"2 missing from the checkpoint: model\.2\.bias, model\.2\.weight"):
        CheckpointManager(tmp_path, "r").restore(model=deeper)
    shallow = torch.nn.Sequential(torch.nn.Linear(2, 3))
    with pytest.raises(CheckpointRestoreError,
                       match=r"2 in the checkpoint but not here: model\.1\.bias, model\.1\.weight"):
        CheckpointManager(tmp_path, "r").restore(model=shallow)
    with pytest.raises(CheckpointRestoreError, match=r"missing from the checkpoint: "
                       r"optimizer\.param_groups\.0\.dampening"):
        CheckpointManager(tmp_path, "r").restore(model=model, optimizer=optimizer)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    with pytest.raises(CheckpointRestoreError, match=r"8 missing from the checkpoint: "
                       r"lr_scheduler\._get_lr_called_within_step, "):
        CheckpointManager(tmp_path, "r").restore(model=model, lr_scheduler=scheduler)
    # nothing was recorded and nobody took the run: its owner saves on
    assert _ledger_rows(tmp_path) == rows
    assert owner.save(2, model=model).step == 2
    assert CheckpointManager(tmp_path, "r").restore(model=model) == 2


def test_a_new_run_id_beside_other_runs_says_which_exist_and_require_refuses_to_start_fresh(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    CheckpointManager(tmp_path, "experiment-1").save(1, model=torch.nn.Linear(1, 1))
    with caplog.at_level(logging.WARNING, logger="lakeckpt_tables"):
        assert CheckpointManager(tmp_path, "experimnet-1").restore() is None
    assert "Other runs there: ['experiment-1']" in caplog.text
    rows = _ledger_rows(tmp_path)
    with pytest.raises(CheckpointRestoreError, match=r"run 'typo' has no checkpoint .*"
                       r"require=True\) does not start fresh. Runs there: \['experiment-1'\]"):
        CheckpointManager(tmp_path, "typo").restore(require=True)
    assert _ledger_rows(tmp_path) == rows
    assert CheckpointManager(tmp_path, "experiment-1").restore(require=True) == 1


def test_refuse_keeps_a_live_owner_and_names_it_fence_takes_the_run_over(
        tmp_path: Path) -> None:
    model = torch.nn.Linear(1, 1)
    first = CheckpointManager(tmp_path, "r")
    first.save(1, model=model)
    rows = _ledger_rows(tmp_path)
    with pytest.raises(RunInUseError, match=rf"owned by live job {first.owner} \(last commit "
                       r"step 1, last sign of life \d+ s ago.*takeover='fence'"):
        CheckpointManager(tmp_path, "r", takeover="refuse").restore(model=model)
    assert _ledger_rows(tmp_path) == rows
    assert first.save(2, model=model).step == 2  # the owner was not fenced
    # an owner silent for longer than live_for is dead: refuse takes its run over
    assert CheckpointManager(tmp_path, "r", takeover="refuse", live_for=0).restore(
        model=model) == 2
    with pytest.raises(RunFencedError):
        first.save(3, model=model)
    # a job that claimed a fresh run is live while it beats
    fresh = CheckpointManager(tmp_path, "new")
    assert fresh.restore(model=model) is None
    fresh.heartbeat(1)
    with pytest.raises(RunInUseError, match=rf"job {fresh.owner} \(no checkpoint yet"):
        CheckpointManager(tmp_path, "new", takeover="refuse").restore(model=model)


def test_restore_records_the_step_the_previous_job_reached_and_how_many_steps_were_lost(
        tmp_path: Path) -> None:
    model = torch.nn.Linear(1, 1)
    manager = CheckpointManager(tmp_path, "r")
    manager.save(5, model=model)
    ten = manager.save(10, model=model)
    manager.heartbeat(17)  # trained on to step 17, then killed
    assert CheckpointManager(tmp_path, "r").restore(model=model) == 10
    (tmp_path / "r" / "step-000000019-0badc0de").mkdir()  # a save attempt a crash cut short
    assert CheckpointManager(tmp_path, "r").restore(model=model) == 10
    assert [(e["checkpoint_id"], e["newest_step"], e["reached_step"], e["steps_lost"])
            for e in _events(tmp_path, "restore")] == [(ten.checkpoint_id, 10, 17, 7),
                                                        (ten.checkpoint_id, 10, 19, 9)]


def test_an_error_after_an_unknown_commit_outcome_keeps_the_files_a_landed_commit_may_name(
        tmp_path: Path) -> None:
    from lakeckpt_tables.errors import CommitStateUnknownError, LedgerError

    manager = CheckpointManager(tmp_path, "r")
    manager.save(1, model=torch.nn.Linear(1, 1))
    assert manager.ledger is not None
    answers = iter([CommitStateUnknownError("injected: the response was lost"),
                    LedgerError("injected: the ledger cannot be read right now")])

    def commit(*args: object, **kwargs: object) -> None:
        raise next(answers)

    manager.ledger.commit = commit  # type: ignore[method-assign]
    with pytest.raises(CommitStateUnknownError, match=r"asking again failed too .*cannot be read"):
        manager.save(2, model=torch.nn.Linear(1, 1))
    assert len(list((tmp_path / "r").glob("step-000000002-*"))) == 1  # the files stay


def test_the_first_checkpoint_names_the_table_read_and_an_iceberg_tables_catalog(
        tmp_path: Path) -> None:
    from conftest import sql_catalog, write_iceberg

    from lakeckpt_tables import IcebergSource

    catalog = sql_catalog(tmp_path / "cat")
    table = write_iceberg(catalog, "ns.rows", [(0, 40)])
    dataset = LakeDataset(IcebergSource("ns.rows", catalog=catalog), batch_size=8)
    loader = StatefulDataLoader(dataset, batch_size=None)
    batches = iter(loader)
    manager = CheckpointManager(tmp_path / "root", "r")
    for step in (1, 2):
        next(batches)
        manager.save(step, dataloader=loader)
    (source,) = _events(tmp_path / "root", "source")  # once, with the first checkpoint
    assert source == {"format": "iceberg", "location": table.location().removeprefix("file://"),
                      "table_id": str(table.metadata.table_uuid), "catalog": "lakeckpt_test",
                      "identifier": "ns.rows"}


def test_an_iceberg_ledger_that_lost_the_file_of_its_newest_commit_falls_back(
        tmp_path: Path) -> None:
    from conftest import sql_catalog

    from lakeckpt_tables.ledger import IcebergLedger

    catalog = sql_catalog(tmp_path / "cat")
    model = torch.nn.Linear(1, 1)
    manager = CheckpointManager(tmp_path / "root", "r",
                                ledger=IcebergLedger("lakeckpt.ledger", catalog=catalog))
    manager.save(1, model=model)
    manager.save(2, model=model)
    lost = max((tmp_path / "cat" / "warehouse").rglob("*.parquet"),
               key=lambda p: p.stat().st_mtime_ns)
    lost.unlink()
    ledger = IcebergLedger("lakeckpt.ledger", catalog=catalog)
    assert CheckpointManager(tmp_path / "root", "r", ledger=ledger).restore(model=model) == 1
    events = ledger.to_arrow().filter(pa.compute.field("event") == "ledger_repaired")
    (detail,) = [json.loads(d) for d in events["detail"].to_pylist()]
    assert detail["missing"] is True and detail["files"][0].endswith(lost.name)


def test_a_model_file_altered_in_place_fails_its_checksum_and_restore_falls_back_saying_so(
        tmp_path: Path) -> None:
    """The weights' bytes rewritten, same size: torch.distributed.checkpoint would load them
    without a word, so only the restore's checksum verification tells (issue 32, item 6)."""
    model = torch.nn.Linear(64, 1, bias=False)
    manager = CheckpointManager(tmp_path, "r")
    for step, value in ((1, 1.0), (2, 2.0)):
        torch.nn.init.constant_(model.weight, value)
        newest = manager.save(step, model=model)
    (shard,) = (tmp_path / newest.model_location).glob("*.distcp")
    data = shard.read_bytes()
    twos, sevens = np.full(64, 2.0, "<f4").tobytes(), np.full(64, 7.0, "<f4").tobytes()
    assert data.count(twos) == 1
    shard.write_bytes(data.replace(twos, sevens))  # same size, other weights

    restored = torch.nn.Linear(64, 1, bias=False)
    assert CheckpointManager(tmp_path, "r").restore(model=restored) == 1
    assert torch.equal(restored.weight, torch.ones(1, 64))
    (retired,) = _events(tmp_path, "retired")
    assert (retired["checkpoint_id"], retired["step"], retired["missing"]) == (
        newest.checkpoint_id, 2, [])
    assert f"{shard.name} does not match its sha256" in str(retired["reason"])
    assert "fail verification" in str(retired["reason"])
    (fallback,) = _events(tmp_path, "restore_fallback")
    assert fallback["step"] == 1 and [s["step"] for s in fallback["skipped"]] == [2]
    assert [(e["step"], e["newest_step"], e["steps_lost"])
            for e in _events(tmp_path, "restore")] == [(1, 2, 1)]
