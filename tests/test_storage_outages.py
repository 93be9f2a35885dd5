"""Outages of the store, told plainly and survived: a real S3 server with injected faults.

The server's front (``tests/_s3server.py``) answers 503 to everything (a storm), delays every
answer past the client's timeout (a stall), or lets a request land and drops its response.
Each time the store is retried within the budget the options give, then named; nothing is
committed by a save that failed, no client ever tries to create a bucket, and the next save
or restore after the store comes back works, exactly once.
"""

from __future__ import annotations

import _s3server
import pytest
import torch
from _s3server import S3Server

from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.errors import CheckpointWriteError, StorageError, StoreUnavailableError
from lakeckpt_tables.io import Storage
from lakeckpt_tables.ledger import DeltaLedger

s3 = _s3server.s3  # the fixture of the module

BUDGET = "1.5"


def _options(server: S3Server) -> dict[str, str]:
    return server.options(lakeckpt_retry_seconds=BUDGET, max_attempts="1",
                          connect_timeout="1", request_timeout="1")


def _bucket_requests(server: S3Server, bucket: str) -> list[tuple[str, str, str]]:
    """Requests on the bucket itself (CreateBucket is a PUT of ``/<bucket>``)."""
    return [r for r in server.requests() if r[1].rstrip("/") == f"/{bucket}" and r[0] == "PUT"]


def _steps(root: str, options: dict[str, str]) -> list[int]:
    ledger = DeltaLedger(f"{root}/_ledger", storage_options=options, create=False)
    return [c.step for c in ledger.checkpoints("run")]


@pytest.mark.timeout(60)
def test_a_save_in_a_503_storm_is_store_unavailable_commits_nothing_and_the_next_commits_once(
        s3: S3Server) -> None:
    bucket = s3.bucket("storm")
    root = f"s3://{bucket}/ckpt"
    options = _options(s3)
    manager = CheckpointManager(root, "run", storage_options=options)
    model = torch.nn.Linear(2, 1)
    manager.save(1, model=model)
    s3.reset()
    with s3.down(), pytest.raises(CheckpointWriteError) as caught:
        manager.save(2, model=model)
    text = str(caught.value)
    assert "store unavailable" in text and root in text and "nothing was committed" in text
    assert "lakeckpt_retry_seconds" in text  # what to do
    assert "\x1b[" not in text and "<Error>" not in text and s3.secret not in text
    assert _bucket_requests(s3, bucket) == []  # no client tried to create the bucket
    assert _steps(root, options) == [1]
    assert manager.save(2, model=model).step == 2  # the store is back: exactly once
    assert _steps(root, options) == [1, 2]
    restored = torch.nn.Linear(2, 1)
    assert CheckpointManager(root, "run", storage_options=options).restore(model=restored) == 2
    assert torch.equal(restored.weight, model.weight)


@pytest.mark.timeout(60)
def test_a_manager_created_in_a_503_storm_names_the_store_and_the_budget(s3: S3Server) -> None:
    root = f"s3://{s3.bucket('stormnew')}/ckpt"
    with s3.down(), pytest.raises(StoreUnavailableError) as caught:
        CheckpointManager(root, "run", storage_options=_options(s3))
    assert caught.value.kind == "unavailable" and caught.value.uri.startswith(root)
    assert "store unavailable" in str(caught.value) and f"{float(BUDGET):g} s" in str(
        caught.value)
    manager = CheckpointManager(root, "run", storage_options=_options(s3))
    assert manager.save(1, model=torch.nn.Linear(2, 1)).step == 1


@pytest.mark.timeout(60)
def test_stalled_responses_are_timed_out_retried_and_named(s3: S3Server) -> None:
    bucket = s3.bucket("stall")
    store = Storage(f"s3://{bucket}/root", _options(s3))
    store.put("a", b"payload")
    s3.faults(latency_ms=2500)  # every answer comes after the 1 s request timeout
    try:
        with pytest.raises(StoreUnavailableError, match=r"store unavailable: could not read "
                           rf"s3://{bucket}/root/a \(unavailable\)"):
            store.read_bytes("a")
    finally:
        s3.faults()
    assert store.read_bytes("a") == b"payload"


@pytest.mark.timeout(60)
def test_dropped_connections_are_retried_and_a_save_lands_exactly_once(s3: S3Server) -> None:
    bucket = s3.bucket("dropped")
    root = f"s3://{bucket}/ckpt"
    options = s3.options(lakeckpt_retry_seconds="10")
    manager = CheckpointManager(root, "run", storage_options=options)
    model = torch.nn.Linear(2, 1)
    manager.save(1, model=model)
    s3.reset()
    s3.faults(lose=[{"method": "PUT", "path": r"\.distcp$", "times": 2},
                    {"method": "PUT", "path": r"/_ledger/lakeckpt-.*\.parquet$", "times": 1},
                    {"method": "GET", "path": r"/_ledger/lakeckpt-.*\.parquet$", "times": 1}])
    try:
        record = manager.save(2, model=model)
    finally:
        s3.faults()
    assert record.step == 2
    assert _steps(root, options) == [1, 2]
    assert _bucket_requests(s3, bucket) == []
    assert CheckpointManager(root, "run", storage_options=options).restore(
        model=torch.nn.Linear(2, 1)) == 2


def test_a_missing_bucket_is_named_as_such_at_once(s3: S3Server) -> None:
    options = s3.options(lakeckpt_retry_seconds="30")  # not retried: waiting cures nothing
    with pytest.raises(StorageError) as caught:
        CheckpointManager("s3://no-such-bucket-lakeckpt/ckpt", "run", storage_options=options)
    assert caught.value.kind == "bucket missing"
    assert "s3://no-such-bucket-lakeckpt/ckpt" in str(caught.value)
    assert "create it, or fix the bucket name" in str(caught.value)
    assert "\x1b[" not in str(caught.value) and "<Error>" not in str(caught.value)


@pytest.mark.timeout(60)
def test_a_full_store_is_named_commits_nothing_and_the_next_save_commits_once(
        s3: S3Server) -> None:
    """MinIO answers 507 XMinioStorageFull when its drives are full: its own kind, not
    retried (waiting frees nothing), nothing committed."""
    root = f"s3://{s3.bucket('full')}/ckpt"
    options = s3.options(lakeckpt_retry_seconds="30", max_attempts="1")
    manager = CheckpointManager(root, "run", storage_options=options)
    model = torch.nn.Linear(2, 1)
    manager.save(1, model=model)
    s3.faults(full=True)
    try:
        with pytest.raises(CheckpointWriteError, match="store full"):
            manager.save(2, model=model)
        with pytest.raises(StorageError) as put:
            Storage(root, options).put("f", b"x")
    finally:
        s3.faults()
    assert put.value.kind == "store full" and "free space or raise the quota" in str(put.value)
    assert _steps(root, options) == [1]
    assert manager.save(2, model=model).step == 2
    assert _steps(root, options) == [1, 2]
