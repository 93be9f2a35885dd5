"""RunLedger: the public ledger commit of a checkpoint a trainer wrote, and the resume from it
(NOTE [ someone else's checkpoint ]). One process, a world of one: the trainer is a loop that
writes its own files (torch.save), as Lightning or the Hugging Face Trainer would."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import torch
from crash_jobs import assert_exactly_once, write_table
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset, merge_states
from lakeckpt_tables.audit import connect
from lakeckpt_tables.audit.exactly_once import verify
from lakeckpt_tables.checkpoint import CheckpointManager, RunLedger
from lakeckpt_tables.errors import (
    CheckpointError,
    RunFencedError,
    UncommittedCheckpointError,
    UncommittedCheckpointWarning,
)
from lakeckpt_tables.ledger import DeltaLedger

ROWS = 300
BATCH = 10
STEPS = ROWS // BATCH


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("src") / "t"
    write_table(path, ROWS)
    return path


def _loader(table: Path, workers: int = 0) -> StatefulDataLoader:
    dataset = LakeDataset(DeltaSource(str(table)), columns=["id"], batch_size=BATCH, seed=5,
                          shuffle_window=2)
    return StatefulDataLoader(dataset, batch_size=None, num_workers=workers)


def _trainer_save(root: Path, step: int, weights: torch.Tensor) -> Path:
    """What a trainer writes on its own: a directory per checkpoint."""
    where = root / f"checkpoint-{step}"
    where.mkdir(parents=True)
    torch.save({"w": weights, "step": step}, where / "model.pt")
    (where / "trainer_state.json").write_text(f'{{"step": {step}}}')
    return where


def _train(table: Path, root: Path, *, stop_after: int | None, workers: int = 0,
           every: int = 7) -> tuple[list[list[int]], RunLedger]:
    """A trainer's loop with the two lines an integration adds: resume from the ledger's
    checkpoint, commit after each trainer save. ``stop_after`` steps: the job dies there."""
    run = RunLedger(root, "run")
    loader = _loader(table, workers)
    found = sorted(str(p) for p in root.glob("checkpoint-*"))
    record = run.resume(dataloader=loader, found=found)
    step = record.step if record is not None else 0
    weights = torch.load(Path(run.url(record)) / "model.pt")["w"] if record else torch.zeros(1)
    seen = []
    for batch in loader:
        step += 1
        ids = [int(i) for i in batch["id"]]
        seen.append(ids)
        weights = weights + sum(ids)
        if step % every == 0:
            where = _trainer_save(root, step, weights)
            run.commit(step, str(where), dataloader=loader)
        if stop_after is not None and step == stop_after:
            run.heartbeat(step)  # the job's first beat is written: it reached this step
            break
    return seen, run


def test_a_trainer_checkpoint_committed_then_resumed_is_exact_and_verified(
        table: Path, tmp_path: Path) -> None:
    reference, _ = _train(table, tmp_path / "ref", stop_after=None)
    root = tmp_path / "job"
    first, _ = _train(table, root, stop_after=17)  # committed at 7 and 14; 15-17 lost
    rest, run = _train(table, root, stop_after=None)
    assert first[:14] + rest == reference
    assert_exactly_once({0: first[:14] + rest}, ROWS)
    ledger = DeltaLedger(str(root / "_ledger"))
    records = list(ledger.checkpoints("run"))
    assert [r.step for r in records] == [7, 14, 21, 28]
    assert [r.model_location for r in records] == [f"checkpoint-{s}" for s in (7, 14, 21, 28)]
    assert sorted(records[0].manifest) == ["model.pt", "trainer_state.json"]
    assert records[2].parent_id == records[1].checkpoint_id  # the resume is the lineage
    recoveries = connect(str(root)).sql("SELECT step, steps_lost FROM recoveries").fetchall()
    assert recoveries == [(14, 3)]
    (verdict,) = verify(str(root), run="run")
    assert verdict.ok, verdict.violations[:3]
    # the trainer deletes its own files: the ledger removed none, and the audit sees which
    # the trainer's rotation deleted
    assert all((root / f"checkpoint-{s}").is_dir() for s in (7, 14, 21, 28))
    shutil.rmtree(root / "checkpoint-7")
    assert connect(str(root)).sql("SELECT step, removed_reason IS NOT NULL FROM checkpoints"
                                  ).fetchall() == [(7, True), (14, False), (21, False),
                                                   (28, False)]
    assert run.head is not None and run.head.step == 28


def test_a_trainer_checkpoint_the_ledger_never_committed_is_reported_and_refused(
        table: Path, tmp_path: Path) -> None:
    root = tmp_path / "job"
    _train(table, root, stop_after=9)  # committed at 7
    _trainer_save(root, 9, torch.zeros(1))  # the trainer saved 9; the job died before the commit
    run = RunLedger(root, "run")
    with pytest.raises(UncommittedCheckpointError, match=r"checkpoint-9.*never committed"
                       r"[\s\S]*step 7 at .*checkpoint-7"):
        run.resume(dataloader=_loader(table), location=str(root / "checkpoint-9"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        record = run.resume(dataloader=_loader(table),
                            found=[str(p) for p in root.glob("checkpoint-*")])
    assert record is not None and record.step == 7
    assert [str(w.message) for w in caught if w.category is UncommittedCheckpointWarning]
    assert "checkpoint-9" in str(caught[-1].message)
    # asked for by its location, a committed checkpoint is resumed exactly
    again = RunLedger(root, "run").resume(location="checkpoint-7")
    assert again is not None and again.checkpoint_id == record.checkpoint_id


def test_a_commit_names_only_what_is_there_and_the_fenced_job_cannot_commit(
        table: Path, tmp_path: Path) -> None:
    root = tmp_path / "job"
    loader = _loader(table)
    run = RunLedger(root, "run")
    run.resume(dataloader=loader)
    next(iter(loader))
    with pytest.raises(CheckpointError, match=r"nothing is at .*checkpoint-1.*save has finished"):
        run.commit(1, "checkpoint-1", dataloader=loader)
    assert list(DeltaLedger(str(root / "_ledger")).checkpoints("run")) == []
    single = root / "step=1.ckpt"  # a trainer checkpoint that is one file (Lightning)
    torch.save({"w": 1}, single)
    record = run.commit(1, str(single), dataloader=loader)
    assert list(record.manifest) == [""] and record.model_location == "step=1.ckpt"
    with pytest.raises(CheckpointError, match="not under the ledger's root"):
        run.commit(2, str(tmp_path / "elsewhere"), dataloader=loader)
    RunLedger(root, "run").resume()  # another job takes the run over
    torch.save({"w": 2}, root / "step=2.ckpt")
    with pytest.raises(RunFencedError):
        run.commit(2, "step=2.ckpt", dataloader=loader)


def test_the_manager_and_the_public_commit_are_one_commit_path(table: Path,
                                                                tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, "run")
    assert isinstance(manager._run, RunLedger)
    loader = _loader(table)
    it = iter(loader)
    next(it)
    record = manager.save(1, model=torch.nn.Linear(1, 1), dataloader=loader)
    assert record is not None and manager._run.head == record


def test_merged_states_load_into_a_dataset_as_merge_states_returns_them(table: Path) -> None:
    loader = _loader(table, workers=2)
    it = iter(loader)
    before = [[int(i) for i in next(it)["id"]] for _ in range(5)]
    rest = [[int(i) for i in b["id"]] for b in it]
    assert len(before) == 5
    loader = _loader(table, workers=2)
    it = iter(loader)
    for _ in range(5):
        next(it)
    states = loader.state_dict()["_snapshot"]["_worker_snapshots"]
    merged = merge_states([w["dataset_state"] for w in states.values()])
    resumed = _loader(table, workers=2)
    resumed.dataset.load_state_dict(merged)  # the ReaderState itself, as the docs show
    assert [[int(i) for i in b["id"]] for b in resumed] == rest
