"""Bounded plan units: a large row group is planned as row ranges (issue 8 items 9 and 8).

A table of one 600-row row group, read by 2 ranks with ``unit_rows=50``: every epoch delivers
every row once, a rank's rows change from epoch to epoch, the unit order changes between
epochs, and every consumption record CheckpointManager writes names an exact range inside the
row group (rows 1-18 of a 17-row row group would fail here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import flat, loader_for, take, write_one_row_group

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.ledger import DeltaLedger

ROWS = 600


@pytest.fixture(scope="module")
def one_row_group(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = str(tmp_path_factory.mktemp("one") / "rows")
    return write_one_row_group(uri, ROWS)


def reader(uri: str, rank: int, **kwargs: Any) -> LakeDataset:
    args: dict[str, Any] = {"columns": ["id"], "batch_size": 20, "seed": 3, "epochs": 2,
                            "rank": rank, "world_size": 2, "unit_rows": 50}
    args.update(kwargs)
    return LakeDataset(DeltaSource(uri), **args)


def epochs_of(uri: str, rank: int, **kwargs: Any) -> list[list[int]]:
    batches = take(loader_for(reader(uri, rank, **kwargs), 0))
    half = len(batches) // 2
    return [flat(batches[:half]), flat(batches[half:])]


def test_one_large_row_group_is_mixed_across_ranks_and_epochs_exactly_once(
        one_row_group: str) -> None:
    runs = [epochs_of(one_row_group, rank) for rank in range(2)]
    for epoch in range(2):
        assert sorted(runs[0][epoch] + runs[1][epoch]) == list(range(ROWS))
    # a rank sees other rows in epoch 2: with whole row groups as units it saw the same half
    again = len(set(runs[0][0]) & set(runs[0][1])) / len(runs[0][0])
    assert 0.2 < again < 0.8
    # and not in row order: 12 units of 50 rows, ranges of a rank come from all over
    assert runs[0][0] != sorted(runs[0][0])
    assert max(runs[0][0]) - min(runs[0][0]) > ROWS // 2


def test_the_unit_order_changes_between_epochs_unshuffled_rows_within(
        one_row_group: str) -> None:
    plan_epochs = []
    for epoch in range(2):
        dataset = reader(one_row_group, 0)
        rnd = dataset.rounds.get(epoch, {}, wait=False)
        assert rnd is not None
        plan, units = dataset.round_plan(epoch, (2, 1, 20), {}, {})
        assert len(units.rows) == ROWS // 50 and set(units.rows.tolist()) == {50}
        plan_epochs.append(plan.order.tolist())
    assert sorted(plan_epochs[0]) == sorted(plan_epochs[1]) == list(range(12))
    assert plan_epochs[0] != plan_epochs[1]


@pytest.mark.parametrize("shuffle", [False, True])
def test_every_consumption_record_is_an_exact_range_inside_its_row_group(
        one_row_group: str, tmp_path: Path, shuffle: bool) -> None:
    root = tmp_path / "ckpt"
    loader = loader_for(reader(one_row_group, 0, shuffle=shuffle, epochs=1, world_size=1), 0)
    manager = CheckpointManager(str(root), run_id="run")
    step = 0
    for _ in loader:
        step += 1
        if step % 4 == 0:
            manager.save(step, dataloader=loader)
    manager.save(step + 1, dataloader=loader)
    records = DeltaLedger(str(root / "_ledger")).consumption().to_pylist()
    covered = np.zeros(ROWS, dtype=np.int64)
    for rec in records:
        assert rec["row_group"] == 0
        assert 0 <= rec["row_start"] < rec["row_end"] <= ROWS, rec
        assert 0 < rec["rows"] <= rec["row_end"] - rec["row_start"], rec
        if not shuffle:
            assert rec["rows"] == rec["row_end"] - rec["row_start"], rec
            covered[rec["row_start"]:rec["row_end"]] += 1
    assert sum(r["rows"] for r in records) == ROWS
    if not shuffle:
        assert covered.tolist() == [1] * ROWS


def test_the_audit_names_the_rows_a_checkpoint_trained_inside_a_row_group_of_many_units(
        one_row_group: str, tmp_path: Path) -> None:
    from lakeckpt_tables.audit import rows

    root = tmp_path / "ckpt"
    loader = loader_for(reader(one_row_group, 0, epochs=1, world_size=1), 0)
    manager = CheckpointManager(str(root), run_id="run")
    delivered: list[list[int]] = []
    for step, batch in enumerate(loader, 1):
        delivered.append(batch["id"].tolist())
        if step % 7 == 0:
            manager.save(step, dataloader=loader)
    records = DeltaLedger(str(root / "_ledger")).checkpoints("run")
    assert [r.step for r in records] == [7, 14, 21, 28]
    for record in records:  # the ids are the rows of the one row group
        got = rows(str(root), checkpoint=record.checkpoint_id)
        assert set(got["row_group"].to_pylist()) == {0}
        assert got["row"].to_pylist() == flat(delivered[record.step - 7 : record.step])
