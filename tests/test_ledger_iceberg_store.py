"""The Iceberg ledger reaches its store through the run's storage options (issue 22 item 3).

A real S3 server on loopback holds the warehouse; the catalog names the warehouse but carries
no S3 properties, and the environment's ``AWS_*`` variables name a shadow server: the only way
to the right server is the options of the checkpoint root's ``Storage``.
"""

from __future__ import annotations

from pathlib import Path

import _s3server
import pytest
from _s3server import S3Server
from pyiceberg.catalog.sql import SqlCatalog

from lakeckpt_tables.io import Storage
from lakeckpt_tables.ledger import CheckpointRecord, ConsumptionRecord, open_ledger
from lakeckpt_tables.ledger.iceberg import IcebergLedger

s3 = _s3server.s3  # the fixtures of the module
shadow_s3 = _s3server.shadow_s3
shadow_env = _s3server.shadow_env


def _checkpoint(step: int) -> CheckpointRecord:
    return CheckpointRecord(
        run_id="r", checkpoint_id=f"c{step}", step=step,
        parent_id=None if step == 1 else f"c{step - 1}", model_location=f"m/{step}",
        manifest={}, reader_state="", source=None, source_version=None, world_size=1,
        tags=(), config_hash="h", wall_time_s=1.0)


@pytest.mark.timeout(60)
def test_iceberg_ledger_commits_and_reads_back_through_the_roots_storage_options(
        s3: S3Server, shadow_env: S3Server, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = s3.bucket("ledger")
    catalog_uri = f"sqlite:///{tmp_path}/catalog.db"
    # the default catalog, as a run opens it: a warehouse on S3, no S3 properties
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKECKPT__URI", catalog_uri)
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKECKPT__WAREHOUSE", f"s3://{bucket}/warehouse")
    root = Storage(f"s3://{bucket}/checkpoints", s3.options())
    ledger = open_ledger("iceberg:ml.ledger", storage=root)
    consumed = [ConsumptionRecord(0, 0, 0, 0, "part-0.parquet", 0, 0, 10)]
    ledger.commit(_checkpoint(1), consumed)
    ledger.commit(_checkpoint(2), [ConsumptionRecord(0, 0, 0, 0, "part-0.parquet", 0, 10, 25)])

    again = open_ledger("iceberg:ml.ledger", storage=root)
    assert [c.step for c in again.checkpoints("r")] == [1, 2]
    assert again.consumption("r")["rows"].to_pylist() == [10, 15]
    files = Storage(f"s3://{bucket}/warehouse", s3.options()).list("ml/ledger/data")
    # each commit: its checkpoint's rows and its consumption, a file each (NOTE [ few rows
    # first ] in ledger/records.py)
    assert sum(name.endswith(".parquet") for name in files) == 4
    assert shadow_env.requests() == []  # nothing fell back to the environment

    # the catalog given is left as it was: the ledger's FileIO properties are its own
    plain = SqlCatalog("lakeckpt", uri=catalog_uri, warehouse=f"s3://{bucket}/warehouse")
    direct = IcebergLedger("ml.ledger", catalog=plain,
                           storage=Storage(f"s3://{bucket}/warehouse", s3.options()))
    assert direct.latest("r") is not None and direct.latest("r").step == 2
    assert not any(key.startswith("s3.") for key in plain.properties)


@pytest.mark.timeout(60)
def test_reading_an_iceberg_ledger_takes_the_storage_options_given_to_the_read(
        s3: S3Server, shadow_env: S3Server, tmp_path: Path) -> None:
    """`lakeckpt progress/verify/audit iceberg:... --storage-options` read the ledger with
    them, not with the environment's (which points at another server here)."""
    from lakeckpt_tables.audit.target import read_ledger
    from lakeckpt_tables.audit.views import connect

    bucket = s3.bucket("ledger")
    catalog = SqlCatalog("lakeckpt", uri=f"sqlite:///{tmp_path}/catalog.db",
                         warehouse=f"s3://{bucket}/warehouse")
    writer = IcebergLedger("ml.ledger", catalog=catalog,
                           storage=Storage(f"s3://{bucket}/warehouse", s3.options()))
    writer.commit(_checkpoint(1), [ConsumptionRecord(0, 0, 0, 0, "part-0.parquet", 0, 0, 10)])

    snapshot = read_ledger("iceberg:ml.ledger", catalog=catalog, storage_options=s3.options())
    assert snapshot.version is not None  # the table's snapshot was read, from the server
    with connect("iceberg:ml.ledger", catalog=catalog, storage_options=s3.options()) as con:
        assert con.execute("select sum(rows) from consumption").fetchall() == [(10,)]
    assert shadow_env.requests() == []
    assert not any(key.startswith("s3.") for key in catalog.properties)
