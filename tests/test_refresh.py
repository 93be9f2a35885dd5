"""refresh="epoch": every epoch reads the latest version, pinned for it by set_epoch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from deltalake import write_deltalake
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager


def _append(path: Path, first: int, last: int) -> None:
    write_deltalake(str(path), pa.table({"id": np.arange(first, last, dtype=np.int64)}),
                    mode="append")


def _dataset(path: Path, **kwargs: Any) -> LakeDataset:
    return LakeDataset(DeltaSource(str(path)), batch_size=8, refresh="epoch", seed=5, **kwargs)


def _ids(loader: StatefulDataLoader) -> list[int]:
    return [int(i) for batch in loader for i in batch["id"]]


@pytest.mark.parametrize("workers", [0, 2])
def test_each_epoch_reads_the_version_latest_when_it_began_and_nothing_later(
        tmp_path: Path, workers: int) -> None:
    _append(tmp_path, 0, 100)
    dataset = _dataset(tmp_path)
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=workers)
    dataset.set_epoch(0)
    assert sorted(_ids(loader)) == list(range(100))
    _append(tmp_path, 100, 150)
    dataset.set_epoch(1)
    it = iter(loader)
    first = [int(i) for i in next(it)["id"]]
    _append(tmp_path, 150, 170)  # lands during epoch 1: joins at epoch 2
    epoch1 = first + [int(i) for batch in it for i in batch["id"]]
    assert sorted(epoch1) == list(range(150))
    dataset.set_epoch(2)
    assert sorted(_ids(loader)) == list(range(170))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_epoch_keeps_its_version_and_continues_the_uninterrupted_sequence(
        tmp_path: Path, workers: int) -> None:
    _append(tmp_path, 0, 120)
    dataset = _dataset(tmp_path)
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=workers)
    dataset.set_epoch(0)
    _ids(loader)
    _append(tmp_path, 120, 180)
    dataset.set_epoch(1)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    expected = [[int(i) for i in batch["id"]] for batch in it]
    _append(tmp_path, 180, 230)  # must not join the resumed epoch

    resumed = _dataset(tmp_path)
    resumed.load_state_dict(state)
    assert resumed.resume_epoch == 1
    resumed.set_epoch(resumed.resume_epoch)
    loader2 = StatefulDataLoader(resumed, batch_size=None, num_workers=workers)
    assert [[int(i) for i in batch["id"]] for batch in loader2] == expected
    resumed.set_epoch(2)
    assert sorted(_ids(loader2)) == list(range(230))


def test_the_checkpoint_manager_restores_a_re_pinned_epoch(tmp_path: Path) -> None:
    table = tmp_path / "t"
    _append(table, 0, 64)
    _append(table, 64, 96)
    dataset = _dataset(table)
    loader = StatefulDataLoader(dataset, batch_size=None)
    dataset.set_epoch(0)
    it = iter(loader)
    seen = [int(i) for _ in range(3) for i in next(it)["id"]]
    CheckpointManager(tmp_path / "ck", "r").save(3, dataloader=loader)
    rest = [int(i) for batch in it for i in batch["id"]]
    _append(table, 96, 200)

    again = _dataset(table)
    loader2 = StatefulDataLoader(again, batch_size=None)
    assert CheckpointManager(tmp_path / "ck", "r").restore(dataloader=loader2) == 3
    again.set_epoch(again.resume_epoch)
    assert _ids(loader2) == rest
    assert sorted(seen + rest) == list(range(96))


def test_verify_checks_each_finished_epoch_at_the_version_it_was_pinned_to(
        tmp_path: Path) -> None:
    """A state names only the epochs its slices stand in: the finished ones before are
    checked at the versions their ``round`` events name."""
    from lakeckpt_tables.audit import verify

    table = tmp_path / "t"
    _append(table, 0, 40)
    dataset = _dataset(table)
    loader = StatefulDataLoader(dataset, batch_size=None)
    manager = CheckpointManager(tmp_path / "ck", "r")
    dataset.set_epoch(0)
    assert sorted(_ids(loader)) == list(range(40))
    manager.save(5, dataloader=loader)
    _append(table, 40, 64)
    dataset.set_epoch(1)
    assert sorted(_ids(loader)) == list(range(64))
    manager.save(13, dataloader=loader)
    dataset.set_epoch(2)
    next(iter(loader))
    manager.save(14, dataloader=loader)
    (verdict,) = verify(str(tmp_path / "ck"))
    assert verdict.violations == [] and verdict.finished_passes == [(0, 0), (1, 1)]
    assert verdict.rows == 40 + 64 + 8


def test_misuse_of_re_pinned_epochs_is_refused_with_the_fix(tmp_path: Path) -> None:
    _append(tmp_path, 0, 10)
    with pytest.raises(ValueError, match="set_epoch"):
        list(_dataset(tmp_path))
    with pytest.raises(ValueError, match="one epoch per pass"):
        _dataset(tmp_path, epochs=2)
    with pytest.raises(ValueError, match="refresh='epoch'"):
        LakeDataset(DeltaSource(str(tmp_path)), batch_size=8).set_epoch(1)
