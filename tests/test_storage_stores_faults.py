"""The S3 faults on Azure Blob and GCS: an outage for a whole save, a lost response to a ledger
commit, dropped connections, a missing container or bucket, wrong credentials and a full store.

Real emulators behind the front of ``tests/_stores.py`` (which injects the faults the emulators
cannot). Each is a named ``StorageError`` with its ``kind``; nothing is committed when the
outcome is unknown, the next save commits exactly once, and no container or bucket is created.
"""

from __future__ import annotations

import _stores
import pytest
import torch
from _s3server import S3Server

from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.errors import (
    CheckpointWriteError,
    RunFencedError,
    StorageError,
    StoreUnavailableError,
)
from lakeckpt_tables.io import Storage
from lakeckpt_tables.ledger import DeltaLedger

store = _stores.store  # the fixture of the module

BUDGET = "1"


def _steps(root: str, options: dict[str, str]) -> list[int]:
    ledger = DeltaLedger(f"{root}/_ledger", storage_options=Storage(root, options)
                         .delta_options(), create=False)
    return [c.step for c in ledger.checkpoints("run")]


def _creations(server: S3Server) -> list[tuple[str, str, str]]:
    """Requests that create a container (Azure: PUT /account/name) or a bucket (GCS)."""
    return [r for r in server.requests()
            if (r[0] == "PUT" and r[1].strip("/").count("/") == 1 and server.kind == "azure")
            or (r[0] == "POST" and r[1].rstrip("/") == "/storage/v1/b")]


@pytest.mark.timeout(60)
def test_a_save_while_the_store_is_down_commits_nothing_and_the_next_commits_once(
        store: S3Server) -> None:
    root = store.uri(store.bucket("storm"), "ckpt")
    options = store.options(lakeckpt_retry_seconds=BUDGET)
    store.reset()
    with store.down(), pytest.raises(StoreUnavailableError) as created:
        CheckpointManager(root, "run", storage_options=options)
    assert created.value.kind == "unavailable" and created.value.uri.startswith(root)
    manager = CheckpointManager(root, "run", storage_options=options)
    model = torch.nn.Linear(2, 1)
    manager.save(1, model=model)
    with store.down(), pytest.raises(CheckpointWriteError) as caught:
        manager.save(2, model=model)
    text = str(caught.value)
    assert "store unavailable" in text and root in text and "nothing was committed" in text
    assert "lakeckpt_retry_seconds" in text and store.secret not in text
    assert _steps(root, options) == [1]
    assert manager.save(2, model=model).step == 2
    assert _steps(root, options) == [1, 2]
    assert _creations(store) == []  # no client tried to create the container or bucket


@pytest.mark.timeout(60)
def test_a_lost_response_after_a_landed_ledger_commit_loses_nothing(store: S3Server) -> None:
    """The store applies the ledger commit's log write and the response is dropped; the
    client retries its create-if-absent (Azure: If-None-Match, GCS: if-generation-match=0),
    which now fails as a conflict with our own commit: save() must recognise it."""
    root = store.uri(store.bucket("lost"), "ckpt")
    options = store.options()
    manager = CheckpointManager(root, "run", storage_options=options)
    model = torch.nn.Linear(2, 1)
    manager.save(1, model=model)
    store.reset()
    log = r"_ledger/_delta_log/\d{20}\.json$"
    store.faults(lose=[{"method": "PUT", "path": log, "times": 1}])
    try:
        record = manager.save(2, model=model)
    finally:
        store.faults()
    puts = [p for m, p, _ in store.requests() if m == "PUT" and "/_delta_log/0" in p]
    assert len(puts) >= 2 and puts[0] == puts[1]  # the lost one, then its retry
    assert record.step == 2
    again = CheckpointManager(root, "run", storage_options=options)
    store.faults(lose=[{"method": "PUT", "path": log, "times": 1}])
    try:  # the restore's claim (the run's new owner) loses its response too
        assert again.restore(model=torch.nn.Linear(2, 1)) == 2
    finally:
        store.faults()
    assert again.save(3, model=model).step == 3
    with pytest.raises(RunFencedError, match="owned by job"):
        manager.save(4, model=model)  # the claim landed: the old job is fenced
    assert _steps(root, options) == [1, 2, 3]


@pytest.mark.timeout(60)
def test_dropped_connections_are_retried_and_a_save_lands_exactly_once(
        store: S3Server) -> None:
    root = store.uri(store.bucket("dropped"), "ckpt")
    options = store.options(lakeckpt_retry_seconds="10")
    manager = CheckpointManager(root, "run", storage_options=options)
    model = torch.nn.Linear(2, 1)
    manager.save(1, model=model)
    store.reset()
    store.faults(lose=[{"method": "PUT", "path": r"\.distcp$", "times": 2},
                       {"method": "GET", "path": r"/_ledger/lakeckpt-.*\.parquet$", "times": 1}])
    try:
        record = manager.save(2, model=model)
    finally:
        store.faults()
    assert record.step == 2
    assert _steps(root, options) == [1, 2]
    assert CheckpointManager(root, "run", storage_options=options).restore(
        model=torch.nn.Linear(2, 1)) == 2
    assert _creations(store) == []


def test_a_missing_container_or_bucket_and_wrong_credentials_are_named_at_once(
        store: S3Server) -> None:
    options = store.options(lakeckpt_retry_seconds="30")  # not retried: waiting cures nothing
    store.reset()
    missing = store.uri("no-such-bucket-lakeckpt", "ckpt")
    with pytest.raises(StorageError) as caught:
        CheckpointManager(missing, "run", storage_options=options)
    assert caught.value.kind == "bucket missing" and missing in str(caught.value)
    assert "create it, or fix the bucket name" in str(caught.value)
    with pytest.raises(StorageError) as read:
        Storage(missing, options).read_bytes("f")
    assert read.value.kind == "bucket missing"
    assert _creations(store) == []
    root = store.uri(store.bucket("denied"), "ckpt")
    if store.kind == "azure":  # Azurite checks the key's signature
        wrong = store.options(azure_storage_account_key="d3Jvbmcta2V5" * 7 + "AA==")
        with pytest.raises(StorageError) as denied:
            Storage(root, wrong).read_bytes("f")
    else:  # fake-gcs-server checks nothing: the front refuses every request, as GCS would
        store.faults(deny=True)
        try:
            with pytest.raises(StorageError) as denied:
                Storage(root, options).read_bytes("f")
        finally:
            store.faults()
    assert denied.value.kind == "access denied" and "credentials" in str(denied.value)
    assert store.secret not in str(denied.value)


@pytest.mark.timeout(60)
def test_a_full_store_is_named_on_a_save_commits_nothing_and_the_next_commits_once(
        store: S3Server) -> None:
    root = store.uri(store.bucket("full"), "ckpt")
    options = store.options(lakeckpt_retry_seconds="30")  # not retried: waiting frees nothing
    manager = CheckpointManager(root, "run", storage_options=options)
    model = torch.nn.Linear(2, 1)
    manager.save(1, model=model)
    store.faults(full=True)
    try:
        with pytest.raises(CheckpointWriteError) as caught:
            manager.save(2, model=model)
        with pytest.raises(StorageError) as put:
            Storage(root, options).put("f", b"x")
    finally:
        store.faults()
    assert "store full" in str(caught.value) and "free space or raise the quota" in str(
        caught.value)
    assert put.value.kind == "store full"
    assert _steps(root, options) == [1]
    assert manager.save(2, model=model).step == 2
    assert _steps(root, options) == [1, 2]
