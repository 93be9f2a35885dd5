"""Checkpoints on S3 and across nodes: a real S3 server, real torchrun jobs, real SIGKILL.

The root ``s3://bucket/ckpt`` holds the model files (torch.distributed.checkpoint's fsspec
writer), their checksums are read back through the same options, and the default Delta
ledger lives under it. Per-node roots (each rank its own local directory) must fail by name
before anything is reported saved, and restore must refuse before any rank loads.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import _s3server
import numpy as np
import pyarrow as pa
import pytest
import torch
from _s3server import S3Server
from deltalake import WriterProperties, write_deltalake
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.errors import CheckpointError, RunFencedError, StorageError
from lakeckpt_tables.io import Storage
from lakeckpt_tables.ledger import DeltaLedger

s3 = _s3server.s3  # the fixtures of the module
shadow_s3 = _s3server.shadow_s3
shadow_env = _s3server.shadow_env

ROWS = 192  # 12 batches of 16 on one rank, 6 per rank on two
JOB = str(Path(__file__).parent / "jobs" / "storage_train.py")


def _write(uri: str, options: dict[str, str] | None) -> None:
    props = WriterProperties(max_row_group_size=24)
    for start in range(0, ROWS, 64):
        ids = np.arange(start, start + 64, dtype=np.int64)
        write_deltalake(uri, pa.table({"id": ids, "x": ids.astype(np.float32)}),
                        mode="append", writer_properties=props, storage_options=options)


@pytest.fixture(scope="module")
def s3_table(s3: S3Server) -> str:
    uri = f"s3://{s3.bucket('src')}/t"
    _write(uri, Storage(uri, s3.options()).delta_options())
    return uri


@pytest.fixture(scope="module")
def local_table(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = str(tmp_path_factory.mktemp("src") / "t")
    _write(uri, None)
    return uri


def _loader(uri: str, options: dict[str, str] | None) -> StatefulDataLoader:
    dataset = LakeDataset(DeltaSource(uri, storage_options=options), columns=["id"],
                          batch_size=16, seed=3)
    return StatefulDataLoader(dataset, batch_size=None, num_workers=0)


def _bucket_bytes(server: S3Server, bucket: str) -> bytes:
    import boto3

    client = boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=server.key,
                          aws_secret_access_key=server.secret, region_name="us-east-1")
    out = b""
    for item in client.list_objects_v2(Bucket=bucket).get("Contents", []):
        out += client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
    return out


# ------------------------------------------------------------------------ in process


def test_a_checkpoint_on_s3_saves_restores_and_retires_through_its_options_only(
        s3_table: str, s3: S3Server, shadow_env: S3Server, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)  # a root misread as a local path would land here
    caplog.set_level(logging.INFO)
    bucket = s3.bucket("ckpt")
    root = f"s3://{bucket}/ckpt"
    options = s3.options()
    model = torch.nn.Linear(2, 1)
    loader = _loader(s3_table, options)
    it = iter(loader)
    manager = CheckpointManager(root, "run", storage_options=options, keep_last=1)
    seen = [next(it)["id"].tolist() for _ in range(2)]
    manager.save(2, model=model, dataloader=loader)
    seen += [next(it)["id"].tolist() for _ in range(2)]
    with torch.no_grad():
        model.weight.fill_(0.25)
    record = manager.save(4, model=model, dataloader=loader)
    assert record is not None
    assert s3.secret not in repr(loader.state_dict()) + repr(record)
    rest = [b["id"].tolist() for b in it]

    store = Storage(root, options)
    assert store.list("run") == [record.model_location.split("/")[1]]  # step 2 retired
    assert ".metadata" in store.list(record.model_location)
    assert store.exists("_ledger/_delta_log/00000000000000000000.json")
    assert os.listdir(tmp_path) == []

    fresh_model = torch.nn.Linear(2, 1)
    fresh = _loader(s3_table, options)
    again = CheckpointManager(root, "run", storage_options=options)
    assert again.restore(model=fresh_model, dataloader=fresh) == 4
    assert torch.equal(fresh_model.weight, torch.full((1, 2), 0.25))
    assert [b["id"].tolist() for b in fresh] == rest
    assert [c.step for c in DeltaLedger(f"{root}/_ledger", storage_options=Storage(
        root, options).delta_options()).checkpoints("run")] == [2, 4]
    assert shadow_env.requests() == []
    stored = _bucket_bytes(s3, bucket)
    assert s3.secret.encode() not in stored and s3.key.encode() not in stored
    assert s3.secret not in caplog.text and s3.key not in caplog.text


def test_the_ledger_on_s3_goes_through_the_roots_store_only(
        s3: S3Server, shadow_env: S3Server) -> None:
    # one storage seam: the ledger's log (delta-rs) and its data files (pyarrow) are reached
    # with the manager's options, never the environment's (which names the shadow server)
    root = f"s3://{s3.bucket('bigfile')}/ckpt"
    options = s3.options()
    manager = CheckpointManager(root, "run", storage_options=options)
    model = torch.nn.Linear(2, 1)
    first, second = manager.save(1, model=model), manager.save(2, model=model)
    assert first is not None and second is not None
    ledger = DeltaLedger(f"{root}/_ledger", storage_options=options, create=False)
    assert [r.step for r in ledger.checkpoints("run")] == [1, 2]
    assert CheckpointManager(root, "run", storage_options=options).restore(
        model=torch.nn.Linear(2, 1)) == 2
    assert shadow_env.requests() == []
    assert any("/_ledger/lakeckpt-" in p for m, p, _ in s3.requests() if m == "PUT")


def test_gc_on_s3_removes_only_what_no_checkpoint_names(s3: S3Server) -> None:
    root = f"s3://{s3.bucket('gc')}/ckpt"
    options = s3.options()
    manager = CheckpointManager(root, "run", storage_options=options)
    model = torch.nn.Linear(2, 1)
    kept = manager.save(1, model=model)
    assert kept is not None
    store = Storage(root, options)
    store.put("run/step-000000002-orphan00/__0_0.distcp", b"aborted attempt")
    assert manager.gc() == ["run/step-000000002-orphan00"]
    assert store.list("run") == [kept.model_location.split("/")[1]]


def test_a_checkpoint_root_on_a_server_that_is_down_saves_nothing_and_a_retry_commits(
        s3: S3Server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    root = f"s3://{s3.bucket('down')}/ckpt"
    options = s3.options(max_attempts="1", lakeckpt_retry_seconds="1")
    manager = CheckpointManager(root, "run", storage_options=options)
    model = torch.nn.Linear(2, 1)
    with s3.down(), pytest.raises((StorageError, CheckpointError)) as caught:
        manager.save(1, model=model)
    assert s3.secret not in str(caught.value)
    assert s3.secret not in caplog.text and s3.key not in caplog.text
    assert manager.checkpoints() == []
    record = manager.save(1, model=model)
    assert record is not None and [c.step for c in manager.checkpoints()] == [1]
    restored = torch.nn.Linear(2, 1)
    assert CheckpointManager(root, "run", storage_options=options).restore(model=restored) == 1
    assert torch.equal(restored.weight, model.weight)


def test_restore_checks_files_through_the_options(s3: S3Server,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    root = f"s3://{s3.bucket('verify')}/ckpt"
    options = s3.options()
    manager = CheckpointManager(root, "run", storage_options=options, keep_last=2)
    model = torch.nn.Linear(2, 1)
    manager.save(1, model=model)
    second = manager.save(2, model=model)
    assert second is not None
    store = Storage(root, options)
    name = next(n for n in store.list(second.model_location) if n.endswith(".distcp"))
    store.put(f"{second.model_location}/{name}", b"corrupted")
    assert CheckpointManager(root, "run", storage_options=options).restore(model=model) == 1
    warned = [r.getMessage() for r in caplog.records if r.name.startswith("lakeckpt_tables")]
    assert any("fails verification" in m and root in m for m in warned)
    assert s3.secret not in caplog.text and s3.key not in caplog.text  # credentials never logged


# -------------------------------------------------------------------- torchrun jobs


def _torchrun(table: str, root: str, out: Path, *, options: dict[str, str] | None,
              roots: tuple[str, str] | None = None, extra: tuple[str, ...] = ()
              ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("LAKECKPT_CRASH_AT", None)
    if options is not None:
        env["LAKECKPT_TEST_OPTIONS"] = json.dumps(options)
    for rank, rank_root in enumerate(roots or ()):
        env[f"LAKECKPT_TEST_ROOT_RANK{rank}"] = rank_root
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node=2", "--max-restarts=0", JOB, "--table", table, "--root", root,
           "--out", str(out), *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)


def _trained(out: Path) -> list[int]:
    ids = []
    for path in sorted(out.glob("rank*.log")):
        for line in path.read_text().splitlines():
            ids.extend(int(i) for i in line.split(" ", 1)[1].split(","))
    return ids


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_two_rank_job_on_s3_killed_mid_run_resumes_exactly_once(
        s3_table: str, s3: S3Server, tmp_path: Path) -> None:
    root = f"s3://{s3.bucket('job')}/ckpt"
    options = s3.options()
    out = tmp_path / "out"
    killed = _torchrun(s3_table, root, out, options=options,
                       extra=("--kill-after-step", "4"))
    assert killed.returncode != 0
    ledger = DeltaLedger(f"{root}/_ledger", storage_options=Storage(root, options)
                         .delta_options())
    assert [c.step for c in ledger.checkpoints("run")] == [3]
    done = _torchrun(s3_table, root, out, options=options)
    assert done.returncode == 0, done.stderr[-2000:]
    trained = _trained(out)
    assert Counter(trained) == Counter(range(ROWS))
    assert [c.step for c in ledger.checkpoints("run")] == [3, 6, 7]
    assert s3.secret not in killed.stderr + done.stderr


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_per_node_roots_fail_by_name_before_anything_is_saved(
        local_table: str, tmp_path: Path) -> None:
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    out = tmp_path / "out"
    run = _torchrun(local_table, str(node0), out, options=None,
                    roots=(str(node0), str(node1)))
    assert run.returncode != 0
    assert "StorageRootNotSharedError" in run.stderr and "rank 1" in run.stderr
    assert DeltaLedger(str(node0 / "_ledger")).checkpoints("run") == []
    assert not (node0 / "run").exists() and not (node1 / "run").exists()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_rank_that_misses_a_checkpoint_file_fails_the_restore_by_name_on_every_rank(
        local_table: str, tmp_path: Path) -> None:
    """Rank 1's root is a copy that lost a model file (and passes the shared-root probe): the
    restore is refused on every rank, naming the rank and the file, before anything is loaded
    or claimed."""
    node0, node1, out = tmp_path / "node0", tmp_path / "node1", tmp_path / "out"
    alone = subprocess.run([sys.executable, JOB, "--table", local_table, "--root", str(node0),
                            "--out", str(out), "--kill-after-step", "4"],
                           capture_output=True, text=True, timeout=240)
    assert alone.returncode == -signal.SIGKILL, alone.stderr[-2000:]
    ledger = DeltaLedger(str(node0 / "_ledger"))
    (saved,) = ledger.checkpoints("run")
    owner = ledger.owner("run")
    shutil.copytree(node0, node1)
    lost = sorted((node1 / saved.model_location).glob("*.distcp"))[0]
    lost.unlink()
    # where rank 0's probe of a shared root writes is shared: the probe passes
    shutil.rmtree(node1 / "_nodes", ignore_errors=True)
    (node0 / "_nodes").mkdir(exist_ok=True)
    (node1 / "_nodes").symlink_to(node0 / "_nodes")
    run = _torchrun(local_table, str(node0), out, options=None,
                    roots=(str(node0), str(node1)))
    assert run.returncode != 0
    # raised on both ranks (their lines may interleave)
    assert run.stderr.count("StorageRootNotSharedError") == 2, run.stderr[-3000:]
    said = run.stderr.count(f"cannot be restored: rank 1 under {node1} misses ['{lost.name}']")
    assert said == 2, run.stderr[-3000:]
    assert [c.checkpoint_id for c in ledger.checkpoints("run")] == [saved.checkpoint_id]
    assert DeltaLedger(str(node0 / "_ledger")).owner("run") == owner  # nobody claimed the run


def test_a_lost_response_after_a_landed_ledger_commit_on_s3_loses_nothing(
        s3: S3Server) -> None:
    """The server applies the ledger commit's log PUT and drops the response; the client
    retries the conditional PUT, gets 412 and delta-rs reports a conflict with our own commit.
    save() must recognise its own landed commit and keep the file the log names."""
    bucket = s3.bucket("lost")
    root = f"s3://{bucket}/ckpt"
    options = s3.options()
    manager = CheckpointManager(root, "run", storage_options=options)
    model = torch.nn.Linear(2, 1)
    manager.save(1, model=model)
    s3.reset()
    s3.faults(lose=[{"method": "PUT", "path": r"_ledger/_delta_log/\d{20}\.json$", "times": 1}])
    try:
        record = manager.save(2, model=model)
    finally:
        s3.faults()
    log_puts = [p for m, p, _ in s3.requests() if m == "PUT" and "/_delta_log/0" in p]
    assert len(log_puts) >= 2 and log_puts[0] == log_puts[1]  # the lost one, then its retry
    assert record.step == 2
    again = CheckpointManager(root, "run", storage_options=options)
    assert [c.checkpoint_id for c in again.checkpoints()][1] == record.checkpoint_id
    s3.faults(lose=[{"method": "PUT", "path": r"_ledger/_delta_log/\d{20}\.json$", "times": 1}])
    try:  # the restore's claim (the run's new owner) loses its response too
        assert again.restore(model=torch.nn.Linear(2, 1)) == 2
    finally:
        s3.faults()
    assert again.gc() == []
    assert again.save(3, model=model).step == 3
    with pytest.raises(RunFencedError, match="owned by job"):
        manager.save(4, model=model)  # the claim landed: the old job is fenced
    assert [c.step for c in DeltaLedger(f"{root}/_ledger", storage_options=Storage(
        root, options).delta_options()).checkpoints("run")] == [1, 2, 3]


def test_an_iceberg_ledger_on_s3_loses_nothing_to_lost_responses(
        s3: S3Server, tmp_path: Path) -> None:
    """Every file an Iceberg commit writes (data, manifests, metadata) is a plain PUT, which
    the client retries after a lost response; the pointer swap is the catalog's (SQL), so a
    landed commit cannot be mistaken for a lost race."""
    from pyiceberg.catalog.sql import SqlCatalog

    from lakeckpt_tables.ledger import IcebergLedger

    bucket = s3.bucket("iceledger")
    catalog = SqlCatalog("ledgers3", uri=f"sqlite:///{tmp_path}/catalog.db",
                         warehouse=f"s3://{bucket}/wh", **s3.iceberg_properties())
    root = f"s3://{bucket}/ckpt"
    options = s3.options()
    model = torch.nn.Linear(2, 1)
    manager = CheckpointManager(root, "run", storage_options=options,
                                ledger=IcebergLedger("ml.ledger", catalog=catalog))
    manager.save(1, model=model)
    s3.reset()
    lose = [{"method": "PUT", "path": p, "times": 1}
            for p in (r"/wh/ml/ledger/data/.*\.parquet$", r"\.avro$", r"\.metadata\.json$")]
    s3.faults(lose=lose)
    try:
        record = manager.save(2, model=model)
    finally:
        s3.faults()
    puts = Counter(p for m, p, _ in s3.requests() if m == "PUT" and "/wh/" in p)
    assert {p.rsplit(".", 1)[-1] for p, n in puts.items() if n >= 2} == {"parquet", "avro",
                                                                         "json"}
    again = CheckpointManager(root, "run", storage_options=options,
                              ledger=IcebergLedger("ml.ledger", catalog=catalog))
    assert [c.checkpoint_id for c in again.checkpoints()][1] == record.checkpoint_id
    assert again.restore(model=torch.nn.Linear(2, 1)) == 2
    assert again.gc() == []
    assert again.save(3, model=model).step == 3
    assert [c.step for c in IcebergLedger("ml.ledger", catalog=catalog).checkpoints("run")] \
        == [1, 2, 3]

