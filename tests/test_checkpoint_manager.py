"""CheckpointManager in one process (a world of one): save, restore, async, retention, audit."""

from __future__ import annotations

import itertools
import os
import random
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from deltalake import WriterProperties, write_deltalake
from pyiceberg.catalog.sql import SqlCatalog
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.errors import CheckpointError
from lakeckpt_tables.ledger import DeltaLedger, IcebergLedger

ROWS = 500


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("src") / "t"
    props = WriterProperties(max_row_group_size=30)
    for start in range(0, ROWS, 125):
        ids = np.arange(start, start + 125, dtype=np.int64)
        write_deltalake(str(path), pa.table({"id": ids, "x": ids.astype(np.float32)}),
                        mode="append", writer_properties=props)
    return path


def _loader(table: Path, *, workers: int = 0, batch: int = 16, epochs: int = 1,
            window: int = 3) -> StatefulDataLoader:
    dataset = LakeDataset(DeltaSource(str(table)), batch_size=batch, seed=3, epochs=epochs,
                          shuffle_window=window)
    return StatefulDataLoader(dataset, batch_size=None, num_workers=workers)


def _ids(batch: dict[str, torch.Tensor]) -> list[int]:
    return [int(i) for i in batch["id"]]


def test_a_restore_brings_back_model_optimizer_scheduler_extra_rng_and_position(
        table: Path, tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    loader = _loader(table)
    it = iter(loader)
    seen = [_ids(next(it)) for _ in range(4)]
    random.seed(11)
    torch.manual_seed(12)
    manager = CheckpointManager(tmp_path, "r1")
    record = manager.save(4, model=model, optimizer=optimizer, lr_scheduler=scheduler,
                          dataloader=loader, extra={"note": "hello"}, tags=("best",))
    assert record is not None and record.step == 4 and record.tags == ("best",)
    expected_next = [_ids(b) for b in it]
    expected_random, expected_torch = random.random(), torch.rand(1)

    model2 = torch.nn.Linear(3, 1)
    optimizer2 = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9)
    scheduler2 = torch.optim.lr_scheduler.StepLR(optimizer2, step_size=2)
    loader2 = _loader(table)
    extra: dict[str, str] = {"note": ""}
    step = CheckpointManager(tmp_path, "r1").restore(
        model=model2, optimizer=optimizer2, lr_scheduler=scheduler2, dataloader=loader2,
        extra=extra)
    assert step == 4
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters(),
                                                 strict=True))
    assert optimizer2.state_dict()["state"][0]["momentum_buffer"].equal(
        optimizer.state_dict()["state"][0]["momentum_buffer"])
    assert scheduler2.state_dict()["last_epoch"] == scheduler.state_dict()["last_epoch"]
    assert extra == {"note": "hello"}
    assert (random.random(), torch.rand(1)) == (expected_random, expected_torch)
    assert [_ids(b) for b in loader2] == expected_next
    assert sorted([i for b in seen + expected_next for i in b]) == list(range(ROWS))


def test_a_fresh_run_restores_nothing(tmp_path: Path) -> None:
    assert CheckpointManager(tmp_path, "new").restore(model=torch.nn.Linear(1, 1)) is None


def test_an_async_save_becomes_visible_only_when_committed(table: Path, tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 1)
    loader = _loader(table)
    it = iter(loader)
    next(it)
    manager = CheckpointManager(tmp_path, "a", async_save=True)
    assert manager.save(1, model=model, dataloader=loader) is None
    assert DeltaLedger(str(tmp_path / "_ledger")).checkpoints("a") == []
    next(it)
    assert manager.save(2, model=model, dataloader=loader) is None  # commits step 1 first
    assert [r.step for r in DeltaLedger(str(tmp_path / "_ledger")).checkpoints("a")] == [1]
    record = manager.wait()
    assert record is not None and record.step == 2
    assert [r.step for r in manager.checkpoints()] == [1, 2]
    assert manager.wait() is None


def test_retention_keeps_the_last_n_and_tagged_and_gc_removes_only_orphans(
        tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    manager = CheckpointManager(tmp_path, "k", keep_last=2)
    for step in range(1, 6):
        manager.save(step, model=model, tags=("best",) if step == 2 else ())
    records = {r.step: r for r in manager.checkpoints()}
    kept = {s for s, r in records.items() if (tmp_path / r.model_location).is_dir()}
    assert kept == {2, 4, 5}
    import json

    events = DeltaLedger(str(tmp_path / "_ledger")).to_arrow().filter(
        pa.compute.field("event") == "removed").to_pylist()
    assert sorted((json.loads(e["detail"])["step"], json.loads(e["detail"])["reason"],
                   json.loads(e["detail"])["checkpoint_id"]) for e in events) == [
        (1, "retention", records[1].checkpoint_id), (3, "retention", records[3].checkpoint_id)]
    orphan = tmp_path / "k" / "step-000000006-deadbeef"
    orphan.mkdir()
    (orphan / "__0_0.distcp").write_bytes(b"half written")
    removed = manager.gc()
    assert removed == ["k/step-000000006-deadbeef"]
    assert {s for s, r in records.items() if (tmp_path / r.model_location).is_dir()} == kept
    reader = CheckpointManager(tmp_path, "k")
    assert reader.restore(model=model, tag="best", read_only=True) == 2
    assert reader.restore(model=model, step=4, read_only=True) == 4
    with pytest.raises(CheckpointError,
                       match=r"step 3 .* is removed: .*retention.* not restorable"):
        reader.restore(model=model, step=3, read_only=True)


class _Broken(torch.nn.Module):
    def state_dict(self, *args: object, **kwargs: object) -> dict[str, torch.Tensor]:
        raise RuntimeError("disk on fire")


def test_a_rank_that_fails_to_prepare_aborts_the_checkpoint_and_leaves_nothing(
        tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, "f")
    manager.save(1, model=torch.nn.Linear(1, 1))
    with pytest.raises(CheckpointError, match="disk on fire"):
        manager.save(2, model=_Broken())
    assert [r.step for r in manager.checkpoints()] == [1]
    assert len(os.listdir(tmp_path / "f")) == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_the_ledger_consumption_of_a_run_covers_every_row_exactly_once(
        table: Path, tmp_path: Path, workers: int) -> None:
    """Checkpoints fall inside shuffle windows; counts per row group still add up once."""
    loader = _loader(table, workers=workers, batch=7, epochs=2, window=3)
    manager = CheckpointManager(tmp_path, "audit")
    seen: list[int] = []
    step = 0
    for batch in loader:
        step += 1
        seen.extend(_ids(batch))
        if step % 9 == 0:
            manager.save(step, dataloader=loader)
    manager.save(step + 1, dataloader=loader)
    consumption = DeltaLedger(str(tmp_path / "_ledger")).consumption(run_id="audit")
    rows: dict[tuple[int, str, int], int] = defaultdict(int)
    exact: dict[tuple[int, str, int], list[tuple[int, int]]] = defaultdict(list)
    for rec in consumption.to_pylist():
        key = (rec["epoch"], rec["file"], rec["row_group"])
        rows[key] += rec["rows"]
        if rec["rows"] == rec["row_end"] - rec["row_start"]:
            exact[key].append((rec["row_start"], rec["row_end"]))
    units = DeltaSource(str(table)).snapshot().units
    for epoch in (0, 1):
        for unit in units:
            assert rows[(epoch, unit.path, unit.row_group)] == unit.rows
    for ranges in exact.values():
        ranges.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(ranges))
    assert sorted(seen) == sorted(list(range(ROWS)) * 2)


def test_the_manager_commits_through_an_iceberg_ledger_in_a_sql_catalog(
        table: Path, tmp_path: Path) -> None:
    catalog = SqlCatalog("c", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")
    ledger = IcebergLedger("lakeckpt.ledger", catalog=catalog)
    model = torch.nn.Linear(2, 1)
    loader = _loader(table)
    next(iter(loader))
    CheckpointManager(tmp_path / "ck", "ice", ledger=ledger).save(1, model=model,
                                                                   dataloader=loader)
    again = IcebergLedger("lakeckpt.ledger", catalog=catalog)
    assert [r.step for r in again.checkpoints("ice")] == [1]
    assert again.consumption(run_id="ice").num_rows > 0
    assert CheckpointManager(tmp_path / "ck", "ice", ledger=again).restore(model=model) == 1


def test_periodic_ledger_compaction_keeps_every_checkpoint_and_retention_working(
        tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    manager = CheckpointManager(tmp_path, "c", keep_last=2, compact_every=3)
    for step in range(1, 8):
        manager.save(step, model=model)
    ledger_dir = tmp_path / "_ledger" / "_delta_log"
    assert any(p.name.endswith(".checkpoint.parquet") for p in ledger_dir.iterdir())
    records = CheckpointManager(tmp_path, "c").checkpoints()
    assert [r.step for r in records] == list(range(1, 8))
    assert [r.step for r in records if (tmp_path / r.model_location).is_dir()] == [6, 7]


def test_the_delta_ledger_can_be_filtered_on_any_column_through_its_file_statistics(
        table: Path, tmp_path: Path) -> None:
    """deltalake's pyarrow dataset (what DuckDB queries) prunes files by min/max statistics."""
    from datetime import UTC, datetime

    import pyarrow.compute as pc
    from deltalake import DeltaTable

    loader = _loader(table)
    next(iter(loader))
    manager = CheckpointManager(tmp_path, "s")
    manager.save(1, dataloader=loader)
    manager.save(2, model=torch.nn.Linear(1, 1))
    dataset = DeltaTable(str(tmp_path / "_ledger")).to_pyarrow_dataset()
    since = datetime(2000, 1, 1, tzinfo=UTC)
    assert dataset.to_table(filter=pc.field("world_size") >= 1).num_rows == 2
    assert dataset.to_table(filter=pc.field("committed_at") >= since).num_rows > 2
    assert dataset.to_table(filter=pc.field("rows") > 0).num_rows > 0
    consumed = manager.ledger.consumption(run_id="s") if manager.ledger else None
    assert consumed is not None and consumed.num_rows > 0
    some_file = consumed["file"][0].as_py()
    assert dataset.to_table(filter=pc.field("file") == some_file).num_rows > 0


def _undelivered(ledger_dir: Path) -> list[dict[str, object]]:
    import json as _json

    rows = DeltaLedger(str(ledger_dir)).to_arrow().to_pylist()
    return [_json.loads(r["detail"]) for r in rows if r["event"] == "undelivered"]


def test_rows_drop_last_leaves_out_are_recorded_in_the_ledger_never_silently(
        table: Path, tmp_path: Path) -> None:
    dataset = LakeDataset(DeltaSource(str(table)), batch_size=16, seed=3, drop_last=True)
    loader = StatefulDataLoader(dataset, batch_size=None)
    delivered = {i for b in loader for i in _ids(b)}
    CheckpointManager(tmp_path, "d").save(1, dataloader=loader)
    events = _undelivered(tmp_path / "_ledger")
    assert [e["reason"] for e in events] == ["drop_last"]
    assert events[0]["rows"] == ROWS - len(delivered) == ROWS % 16
    files = {u.path for u in DeltaSource(str(table)).snapshot().units}
    ranges = events[0]["ranges"]
    assert isinstance(ranges, list)
    assert all(path in files for path, _, _, _ in ranges)
    assert sum(r1 - r0 for _, _, r0, r1 in ranges) == events[0]["rows"]


def test_a_lockstep_remainder_of_two_ranks_is_named_row_by_row(tmp_path: Path) -> None:
    from lakeckpt_tables.checkpoint.consumption import segment_events
    from lakeckpt_tables.reader import merge_states, states_from_loader

    write_deltalake(str(tmp_path), pa.table({"id": np.arange(5, dtype=np.int64)}))
    states, delivered = [], set()
    for rank in (0, 1):  # batch size 1 over 2 ranks: 5 rows leave 1 that lockstep cannot give
        dataset = LakeDataset(DeltaSource(str(tmp_path)), batch_size=1, rank=rank, world_size=2)
        loader = StatefulDataLoader(dataset, batch_size=None)
        delivered |= {i for b in loader for i in _ids(b)}
        states.extend(states_from_loader(loader.state_dict()))
    events = segment_events(dataset, None, merge_states(states))
    assert events[0] == ("round", {"round": 0, "segment": 0, "epoch": 0, "version": 0,
                                   "base_version": None, "rows": 5, "delivered": 4})
    events = events[1:]
    assert [(name, e["reason"], e["rows"]) for name, e in events] == [
        ("undelivered", "lockstep remainder", 1)]
    (_, _, r0, r1), = events[0][1]["ranges"]
    missing = set(range(5)) - delivered
    assert r1 - r0 == 1 and missing == {r0}
