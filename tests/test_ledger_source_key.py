"""The ``source_key`` column (issue 21): consumption records name their Mixture source, and a
ledger written before the column existed still opens, verifies and takes new commits."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyiceberg.catalog.sql import SqlCatalog

from lakeckpt_tables.ledger import DeltaLedger, IcebergLedger
from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.ledger.records import (
    CheckpointRecord,
    ConsumptionRecord,
    commit_rows,
)

OLD_SCHEMA = pa.schema([f for f in s.LEDGER_SCHEMA if f.name != s.SOURCE_KEY])


def record(step: int) -> CheckpointRecord:
    return CheckpointRecord(run_id="r", checkpoint_id=f"c{step}", step=step,
                            parent_id=f"c{step - 1}" if step > 1 else None,
                            model_location=f"r/step-{step}", manifest={}, reader_state="",
                            source=None, source_version=None, world_size=1, tags=(),
                            config_hash="h", wall_time_s=1.0)


def consumed(key: str | None) -> list[ConsumptionRecord]:
    return [ConsumptionRecord(0, 0, 0, 0, "f.parquet", 0, 0, 10, source_key=key)]


def old_rows() -> pa.Table:
    """Rows as a ledger before the column wrote them (same checksums: the column is null)."""
    stamped = CheckpointRecord(**{**record(1).__dict__, "committed_at": datetime.now(UTC)})
    return commit_rows(stamped, consumed(None), [], owner="1").select(OLD_SCHEMA.names)


def open_old(kind: str, tmp_path: Path) -> Any:
    if kind == "delta":
        uri = str(tmp_path / "ledger")
        DeltaTable.create(uri, OLD_SCHEMA, raise_if_key_not_exists=False, configuration={
            s.FORMAT_PROPERTY: str(s.LEDGER_FORMAT_VERSION)})
        write_deltalake(uri, old_rows(), mode="append")
        return lambda: DeltaLedger(uri)
    catalog = SqlCatalog("c", uri=f"sqlite:///{tmp_path}/cat.db",
                         warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.ledger", schema=OLD_SCHEMA, properties={
        s.FORMAT_PROPERTY: str(s.LEDGER_FORMAT_VERSION)})
    table.append(old_rows())
    return lambda: IcebergLedger("ns.ledger", catalog=catalog)


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_an_old_ledger_gains_the_column_keeps_its_rows_and_records_source_keys(
        kind: str, tmp_path: Path) -> None:
    ledger = open_old(kind, tmp_path)()
    assert [c.step for c in ledger.checkpoints("r")] == [1]
    assert ledger.consumption(run_id="r")["source_key"].to_pylist() == [None]
    ledger.commit(record(2), consumed("web"), [], owner="1")
    rows = ledger.consumption(run_id="r")
    assert list(zip(rows["step"].to_pylist(), rows["source_key"].to_pylist(),
                    strict=True)) == [(1, None), (2, "web")]
    assert [c.step for c in ledger.checkpoints("r")] == [1, 2]
