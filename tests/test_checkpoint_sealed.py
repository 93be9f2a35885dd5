"""A rank's consumption travels to rank 0 sealed, and a rank that cannot seal fails the save
like any failed phase 1 (rank 0 aborts; no rank waits forever)."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime

from lakeckpt_tables.checkpoint.commit import Attempt, Prepared, sealed
from lakeckpt_tables.ledger import ConsumptionRecord, LedgerEvent
from lakeckpt_tables.ledger.records import SEALED_COLUMNS

AT = datetime(2026, 11, 25, 20, 0, tzinfo=UTC)


def _attempt(consumed: list[ConsumptionRecord]) -> Attempt:
    prepared = Prepared(True, consumed=consumed, events=[LedgerEvent("round", {})])
    return Attempt(3, "ckpt", "run/step-3", (), prepared, committed_at=AT)


def test_a_report_travels_with_its_rows_sealed_and_without_its_records() -> None:
    records = [ConsumptionRecord(1, w, 0, 0, "f.parquet", w, 0, 10, rows=5) for w in range(3)]
    report = sealed(_attempt(records), "run", "42")
    assert report.ok and report.consumed == [] and report.sealed is not None
    assert report.sealed.common == {"run_id": "run", "checkpoint_id": "ckpt", "step": 3,
                                    "committed_at": AT, "owner": "42"}
    assert report.sealed.rows.column_names == [*SEALED_COLUMNS, "checksum"]
    assert report.sealed.rows["worker"].to_pylist() == [0, 1, 2]
    assert report.events == [LedgerEvent("round", {})]


def test_a_rank_that_cannot_seal_reports_a_failure() -> None:
    too_big = ConsumptionRecord(2**40, 0, 0, 0, "f.parquet", 0, 0, 10)  # rank is int32
    report = sealed(_attempt([too_big]), "run", "42")
    assert not report.ok and report.sealed is None
    assert report.error.startswith("its consumption records do not fit the ledger's columns")
    assert "1099511627776" in report.error


def test_sealed_rows_cross_the_gather_as_one_arrow_stream_unchanged() -> None:
    records = [ConsumptionRecord(1, w, 0, 0, f"f{w}.parquet", w, 0, 10, rows=5, tokens=w or None)
               for w in range(4)]
    report = sealed(_attempt(records), "run", "42")
    assert report.sealed is not None
    data = pickle.dumps(report)
    assert b"_reconstruct_table" not in data and data.count(b"f3.parquet") == 1  # one stream
    back = pickle.loads(data)
    assert back.sealed == report.sealed and back.sealed.common == report.sealed.common
    assert back.sealed.table().equals(report.sealed.table())
    empty = sealed(_attempt([]), "run", "42").sealed
    assert empty is not None and len(pickle.loads(pickle.dumps(empty))) == 0
