"""Azure Blob and GCS as S3 is proven: tables, checkpoints, the ledger and the command line on
real emulators (Azurite, fake-gcs-server) on loopback, through the storage options only.

Each test runs once per store (the ``store`` fixture of ``tests/_stores.py``: one emulator per
store for the module). The environment names an unreachable store with other credentials under
every variable the clients read (``hostile_env``): any fallback to it fails the test.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import _stores
import pytest
import torch
from _s3server import S3Server
from conftest import ROW_GROUP_ROWS, file_ranges, loader_for, rows_table, write_delta

from lakeckpt_tables import DeltaSource, IcebergSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.io import Storage
from lakeckpt_tables.ledger import DeltaLedger

store = _stores.store  # the fixtures of the module
hostile_env = _stores.hostile_env

RANGES = file_ranges()
IDS = list(range(RANGES[0][0], RANGES[-1][1]))
LAKECKPT = [sys.executable, "-m", "lakeckpt_tables.cli"]


def ids_of(dataset: LakeDataset, workers: int = 0) -> list[int]:
    return [i for batch in loader_for(dataset, workers) for i in batch["id"].tolist()]


@pytest.fixture(scope="module")
def delta_table(store: S3Server) -> str:
    uri = store.uri(store.bucket("delta"), "rows")
    write_delta(uri, RANGES, storage_options=Storage(uri, store.options()).delta_options())
    return uri


def _data_requests(server: S3Server) -> list[tuple[str, str, str]]:
    return [r for r in server.requests() if r[1].endswith(".parquet")]


# ---------------------------------------------------------------------------- Storage


def test_storage_operations_through_the_options_only(store: S3Server, hostile_env: None
                                                     ) -> None:
    bucket = store.bucket()
    root = Storage(store.uri(bucket, "root"), store.options())
    assert root.list() == [] and not root.exists("a/one")
    root.put("a/one", b"0123456789")
    root.put("a/two", b"xy")
    assert root.read_bytes("a/one", 3, 4) == b"3456"
    assert root.list("a") == ["one", "two"] and root.list() == ["a"]
    assert root.size("a/one") == 10 and root.exists("a") and root.exists("a/two")
    root.put("a/one", b"new")
    assert root.read_bytes(f"{root.uri}/a/one") == b"new"
    root.delete("a/two")
    assert root.list("a") == ["one"]
    root.delete("a")
    assert not root.exists("a/one") and root.list() == []
    with pytest.raises(FileNotFoundError):
        root.read_bytes("a/one")
    # credentials stay out of sight, and a copy in another process rebuilds its client
    root.put("f", b"data")
    assert store.secret not in repr(root)
    copy = pickle.loads(pickle.dumps(root))
    assert copy._fs is None and copy.read_bytes("f") == b"data"
    if store.kind == "azure":  # the URI forms users write name the same blobs
        for uri in (f"abfs://{bucket}@devstoreaccount1.dfs.core.windows.net/root",
                    f"abfss://{bucket}@devstoreaccount1.dfs.core.windows.net/root"):
            assert Storage(uri, store.options()).read_bytes("f") == b"data"


# ---------------------------------------------------------------------------- tables


@pytest.mark.parametrize("workers", [0, 2])
def test_a_delta_table_is_read_through_its_options_with_bounded_requests(
        delta_table: str, store: S3Server, hostile_env: None, workers: int) -> None:
    dataset = LakeDataset(DeltaSource(delta_table, storage_options=store.options()),
                          columns=["id", "x"], batch_size=24, seed=3)
    units = dataset.snapshot.units
    store.reset()
    assert sorted(ids_of(dataset, workers)) == IDS  # 2 workers: the clients cross a fork
    if workers == 0:
        gets = [r for r in _data_requests(store) if r[0] == "GET"]
        heads = [r for r in _data_requests(store) if r[0] == "HEAD"]
        assert heads == []  # sizes come from the log, footers from the pin
        assert len(units) <= len(gets) <= 2 * len(units)


def test_files_as_units_and_follow_mode_polling(delta_table: str, store: S3Server,
                                                hostile_env: None) -> None:
    options = store.options()
    files = LakeDataset(DeltaSource(delta_table, storage_options=options, units="files"),
                        columns=["id"], batch_size=24)
    assert sorted(ids_of(files)) == IDS
    uri = delta_table.replace("/rows", "/followed")
    delta = Storage(uri, options).delta_options()
    write_delta(uri, [(0, 40)], storage_options=delta)
    dataset = LakeDataset(DeltaSource(uri, storage_options=options), columns=["id"],
                          batch_size=10, shuffle=False, follow=True, poll_interval=0.05,
                          max_idle=0.6, min_segment_rows=1)
    seen: list[int] = []
    for batch in loader_for(dataset, 0):
        seen.extend(batch["id"].tolist())
        if len(seen) == 40:
            write_delta(uri, [(40, 90)], storage_options=delta)
    assert sorted(seen) == list(range(90))


def test_an_iceberg_table_with_its_warehouse_on_the_store(
        store: S3Server, tmp_path: Path, hostile_env: None) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("stores", uri=f"sqlite:///{tmp_path}/catalog.db",
                         warehouse=store.warehouse(store.bucket("ice"), "wh"),
                         **store.iceberg_properties())
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.rows", schema=rows_table(0, 1).schema, properties={
        "write.parquet.row-group-limit": str(ROW_GROUP_ROWS)})
    for lo, hi in RANGES[:2]:
        table.append(rows_table(lo, hi))
    dataset = LakeDataset(IcebergSource("ns.rows", catalog=catalog), columns=["id", "name"],
                          batch_size=24, seed=5)
    assert all(u.path.startswith(store.warehouse("", "")[:4]) for u in dataset.snapshot.units)
    assert sorted(ids_of(dataset, 2)) == list(range(RANGES[0][0], RANGES[1][1]))


# ---------------------------------------------------------------------- checkpoints


def test_checkpoints_save_restore_retire_and_gc_through_the_options_only(
        delta_table: str, store: S3Server, hostile_env: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a root misread as a local path would land here
    root = store.uri(store.bucket("ckpt"), "ckpt")
    options = store.options()

    def loader() -> Any:
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(LakeDataset(DeltaSource(delta_table, storage_options=options),
                                              columns=["id"], batch_size=16, seed=3),
                                  batch_size=None)

    model = torch.nn.Linear(2, 1)
    first = loader()
    it = iter(first)
    manager = CheckpointManager(root, "run", storage_options=options, keep_last=1)
    seen = [next(it)["id"].tolist() for _ in range(2)]
    manager.save(2, model=model, dataloader=first)
    seen += [next(it)["id"].tolist() for _ in range(2)]
    with torch.no_grad():
        model.weight.fill_(0.25)
    record = manager.save(4, model=model, dataloader=first)
    rest = [b["id"].tolist() for b in it]
    stored = Storage(root, options)
    assert stored.list("run") == [record.model_location.split("/")[1]]  # step 2 retired
    assert ".metadata" in stored.list(record.model_location)
    stored.put("run/step-000000009-orphan00/__0_0.distcp", b"aborted attempt")
    assert manager.gc() == ["run/step-000000009-orphan00"]
    assert list(tmp_path.iterdir()) == []

    fresh_model, fresh = torch.nn.Linear(2, 1), loader()
    again = CheckpointManager(root, "run", storage_options=options)
    assert again.restore(model=fresh_model, dataloader=fresh) == 4
    assert torch.equal(fresh_model.weight, torch.full((1, 2), 0.25))
    assert [b["id"].tolist() for b in fresh] == rest
    assert Counter(i for b in seen + rest for i in b) == Counter(IDS)
    ledger = DeltaLedger(f"{root}/_ledger", storage_options=stored.delta_options())
    assert [c.step for c in ledger.checkpoints("run")] == [2, 4]
    assert store.secret not in repr(record) + repr(fresh.state_dict())


@pytest.mark.timeout(120)
def test_the_command_line_takes_the_storage_options(
        delta_table: str, store: S3Server, tmp_path: Path) -> None:
    """verify, checkpoints and progress in ONE process (a process costs more than a command),
    which must exit cleanly: no pending task of an async client left at exit."""
    root = store.uri(store.bucket("cli"), "ckpt")
    options = store.options()
    manager = CheckpointManager(root, "run", storage_options=options)
    loader = loader_for(LakeDataset(DeltaSource(delta_table, storage_options=options),
                                    columns=["id"], batch_size=30, shuffle=False), 0)
    for step, _ in enumerate(loader, start=1):
        manager.save(step, model=torch.nn.Linear(1, 1), dataloader=loader)
        if step == 2:
            break
    (tmp_path / "opts.json").write_text(json.dumps(options))
    script = "\n".join([
        "from lakeckpt_tables.cli import main",
        *(f"print('exit', main([{cmd!r}, {root!r}, '--storage-options', '@opts.json', "
          f"'--output', 'json']), flush=True)" for cmd in ("verify", "checkpoints", "progress"))])
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=_hostile(),
                          capture_output=True, text=True, timeout=110)
    out, err = done.stdout, done.stderr
    assert done.returncode == 0 and out.count("exit 0") == 3, out + err
    verified = json.loads(out.split("exit 0")[0])
    assert verified and all(row["ok"] for row in verified), out
    steps = json.loads(out.split("exit 0")[1])
    assert [row["step"] for row in steps] == [1, 2], out
    assert store.secret not in out + err
    assert err == "", err  # no "Task was destroyed but it is pending!", no warning


def _hostile() -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AZURE_", "GOOGLE_", "STORAGE_EMULATOR", "LAKECKPT_"))}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.update(STORAGE_EMULATOR_HOST="http://127.0.0.1:9", AZURE_STORAGE_ENDPOINT=
               "http://127.0.0.1:9", AZURE_STORAGE_CONNECTION_STRING=
               "AccountName=x;AccountKey=eA==;BlobEndpoint=http://127.0.0.1:9/x;")
    return env


def test_the_object_store_bench_counts_requests_on_the_emulators(
        store: S3Server, capsys: pytest.CaptureFixture[str]) -> None:
    """``lakeckpt bench read --uri`` reports GETs per row group and metadata requests per
    data file on each store, with S3's ceilings: <= 2 GETs per row group, 0 per file."""
    from lakeckpt_tables.cli import main

    uri = store.uri(f"bench-{store.kind}", "table")  # the bench makes its own bucket here
    code = main(["bench", "read", "--uri", uri, "--rows", "20000", "--rounds", "1", "--json",
                 "--storage-options", json.dumps(store.options())])
    out = json.loads(capsys.readouterr().out)
    assert out["uri"] == uri and out["rows"] == 20_000 and out["row_groups"] == 4
    assert out["requests_per_row_group"] == 1.0  # id and x: one coalesced range
    assert out["heads_per_file"] == 0.0  # the files opened for their footers are reused
    assert (out["footer_reads_first"], out["footer_reads_again"]) == (4, 0)
    assert code == (0 if out["passed"] else 1)
    assert store.secret not in json.dumps(out)


def test_an_iceberg_ledger_with_its_warehouse_on_the_store(
        store: S3Server, tmp_path: Path, hostile_env: None) -> None:
    """The storage options reach the Iceberg ledger's FileIO as adls.* / gcs.* properties
    (NOTE [ iceberg ledger store ]): its metadata, manifests and data files on the store."""
    from pyiceberg.catalog.sql import SqlCatalog

    from lakeckpt_tables.ledger import IcebergLedger

    bucket = store.bucket("iceledger")  # the warehouse's alone: its writes are the ledger's
    warehouse = store.warehouse(bucket, "wh")
    catalog = SqlCatalog("ledger", uri=f"sqlite:///{tmp_path}/catalog.db",
                         warehouse=warehouse)  # no FileIO properties: the options give them
    root, options = store.uri(store.bucket("root"), "ckpt"), store.options()

    def ledger() -> IcebergLedger:
        return IcebergLedger("ml.ledger", catalog=catalog, storage=Storage(warehouse, options))

    model = torch.nn.Linear(2, 1)
    store.reset()
    manager = CheckpointManager(root, "run", storage_options=options, ledger=ledger())
    manager.save(1, model=model)
    manager.save(2, model=model)
    assert any(f"/{bucket}/" in p and m in ("PUT", "POST") for m, p, _ in store.requests())
    again = CheckpointManager(root, "run", storage_options=options, ledger=ledger())
    assert again.restore(model=torch.nn.Linear(2, 1)) == 2
    assert [c.step for c in again.checkpoints()] == [1, 2]
