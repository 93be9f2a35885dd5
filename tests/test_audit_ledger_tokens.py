"""The ``tokens`` ledger column (issue 21.3): a ledger written before it existed (without it, and
without ``source_key``) is read by the audit as it is, and gains it when a run opens it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyiceberg.catalog.sql import SqlCatalog

from lakeckpt_tables.audit import connect
from lakeckpt_tables.ledger import DeltaLedger, IcebergLedger
from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.ledger.records import CheckpointRecord, ConsumptionRecord, commit_rows
from tests.test_ledger_source_key import record

OLD_SCHEMA = pa.schema([f for f in s.LEDGER_SCHEMA if f.name not in (s.SOURCE_KEY, s.TOKENS)])


def old_rows() -> pa.Table:
    """Rows as a ledger before both columns wrote them (their checksums hold: both null)."""
    stamped = CheckpointRecord(**{**record(1).__dict__, "committed_at": datetime.now(UTC)})
    consumed = [ConsumptionRecord(0, 0, 0, 0, "f.parquet", 0, 0, 10)]
    return commit_rows(stamped, consumed, [], owner="1").select(OLD_SCHEMA.names)


def write_old(kind: str, tmp_path: Path) -> tuple[str, Any, Any]:
    """(audit target, its catalog, a function opening the ledger as a run does)."""
    if kind == "delta":
        uri = str(tmp_path / "_ledger")
        DeltaTable.create(uri, OLD_SCHEMA, raise_if_key_not_exists=False, configuration={
            s.FORMAT_PROPERTY: str(s.LEDGER_FORMAT_VERSION)})
        write_deltalake(uri, old_rows(), mode="append")
        return str(tmp_path), None, lambda: DeltaLedger(uri)
    catalog = SqlCatalog("c", uri=f"sqlite:///{tmp_path}/cat.db",
                         warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.ledger", schema=OLD_SCHEMA, properties={
        s.FORMAT_PROPERTY: str(s.LEDGER_FORMAT_VERSION)})
    table.append(old_rows())
    return "iceberg:ns.ledger", catalog, lambda: IcebergLedger("ns.ledger", catalog=catalog)


def consumed(target: str, catalog: Any) -> list[tuple[Any, ...]]:
    con = connect(target, catalog=catalog)
    return con.sql("SELECT step, rows, tokens FROM consumption ORDER BY step").fetchall()


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_ledger_older_than_the_tokens_column_reads_and_then_records_tokens(
        kind: str, tmp_path: Path) -> None:
    target, catalog, open_ledger = write_old(kind, tmp_path)
    assert consumed(target, catalog) == [(1, 10, None)]  # read as it is: nothing altered
    ledger = open_ledger()
    assert ledger.consumption(run_id="r")[s.TOKENS].to_pylist() == [None]
    ledger.commit(record(2), [ConsumptionRecord(0, 0, 0, 0, "f.parquet", 0, 10, 12,
                                                source_key="web", tokens=37)], [], owner="1")
    assert [c.step for c in ledger.checkpoints("r")] == [1, 2]  # old rows keep their checksums
    assert consumed(target, catalog) == [(1, 10, None), (2, 2, 37)]
