"""A large commit of the Delta ledger is written as parts in parallel and added by one log
commit (NOTE [ parallel ledger parts ]); a part that fails leaves no file behind; each file's
add-action statistics come from its footer, equal to those computed from its rows."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

import lakeckpt_tables.ledger.delta as delta
from lakeckpt_tables.errors import StorageError
from lakeckpt_tables.ledger import CheckpointRecord, ConsumptionRecord, DeltaLedger, LedgerEvent
from lakeckpt_tables.ledger.delta_files import stats
from lakeckpt_tables.ledger.records import commit_rows, intact_rows

PART_ROWS = 16


def _checkpoint(step: int) -> CheckpointRecord:
    return CheckpointRecord(run_id="run", checkpoint_id=f"c{step}", step=step, parent_id=None,
                            model_location="m", manifest={}, reader_state="s", source=None,
                            source_version=None, world_size=4, tags=(), config_hash="h",
                            wall_time_s=1.0, committed_at=datetime(2026, 1, 1, tzinfo=UTC))


def _records(n: int) -> list[ConsumptionRecord]:
    return [ConsumptionRecord(i % 4, 0, 0, 0, f"f{i}.parquet", 0, 0, 10) for i in range(n)]


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delta, "_PART_ROWS", PART_ROWS)
    monkeypatch.setattr(delta, "_MAX_PARTS", 3)


def _data_files(root: Path) -> list[Path]:
    return sorted(root.glob("*.parquet"))


@pytest.mark.timeout(20)
@pytest.mark.usefixtures("small_parts")
def test_a_large_commit_is_several_files_added_by_one_log_commit(tmp_path: Path) -> None:
    ledger = DeltaLedger(str(tmp_path))
    ledger.commit(_checkpoint(1), _records(5))  # small: one file
    version = DeltaTable(str(tmp_path)).version()
    ledger.commit(_checkpoint(2), _records(3 * PART_ROWS + 7))
    table = DeltaTable(str(tmp_path))
    assert table.version() == version + 1  # one commit
    assert len(table.file_uris()) == 1 + 3 and len(_data_files(tmp_path)) == 4
    rows = ledger.consumption("run", "c2")
    assert sorted(rows["file"].to_pylist()) == sorted(f"f{i}.parquet"
                                                      for i in range(3 * PART_ROWS + 7))
    intact, damaged = intact_rows(ledger.to_arrow())
    assert damaged == [] and intact.num_rows == 1 + 5 + 1 + 3 * PART_ROWS + 7
    assert [c.checkpoint_id for c in ledger.checkpoints("run")] == ["c1", "c2"]
    ledger.compact()
    assert len(DeltaTable(str(tmp_path)).file_uris()) == 1
    assert ledger.consumption("run", "c2").num_rows == 3 * PART_ROWS + 7


@pytest.mark.timeout(20)
@pytest.mark.usefixtures("small_parts")
def test_a_part_that_fails_leaves_no_file_and_nothing_committed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = DeltaLedger(str(tmp_path))
    write = DeltaLedger._write_file

    def failing(self: DeltaLedger, rows: pa.Table, **kw: bool) -> object:
        if rows.num_rows < 2 * PART_ROWS and rows["record"][0].as_py() != "checkpoint":
            raise StorageError("disk full", uri=str(tmp_path), kind="unavailable")
        return write(self, rows, **kw)

    monkeypatch.setattr(DeltaLedger, "_write_file", failing)
    with pytest.raises(StorageError, match="disk full"):
        ledger.commit(_checkpoint(1), _records(3 * PART_ROWS))
    assert _data_files(tmp_path) == [] and ledger.checkpoints("run") == []


@pytest.mark.timeout(20)
def test_add_action_statistics_from_the_footer_equal_those_from_the_rows() -> None:
    events = [LedgerEvent("note", {"text": "é" * n}) for n in (1, 3000)]
    consumption = [ConsumptionRecord(i % 5, i % 3, 0, 1, f"dir/é{i:05d}.parquet", i % 8, i, i + 9,
                                     tokens=i if i % 2 else None) for i in range(300)]
    long_state = replace(_checkpoint(4), reader_state="x" * 10_000)  # too long for a statistic
    rows = commit_rows(long_state, consumption, events, owner="7")
    for group_rows in (64, 1000):  # nulls only in some row groups, or one group
        buffer = pa.BufferOutputStream()
        pq.write_table(rows, buffer, row_group_size=group_rows)
        footer = pq.read_metadata(pa.BufferReader(buffer.getvalue()))
        assert footer.num_row_groups == -(-rows.num_rows // group_rows)
        assert json.loads(stats(rows, footer)) == json.loads(stats(rows))
