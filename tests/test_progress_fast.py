"""An Iceberg ledger of a SQL catalog given by URI is read without pyiceberg or SQLAlchemy
(NOTE [ direct iceberg read ] in ``lakeckpt_tables/audit/iceberg_direct.py``), and answers
exactly as pyiceberg's path does; anything it does not read takes that path."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from audit_helpers import ROWS, SimulatedRun, write_table
from conftest import file_ranges, write_iceberg

from lakeckpt_tables.audit import connect
from lakeckpt_tables.audit import iceberg_direct as direct
from lakeckpt_tables.audit.avro import AvroError, read_container
from lakeckpt_tables.audit.registry import load_catalog
from lakeckpt_tables.audit.target import read_ledger
from lakeckpt_tables.cli import main
from lakeckpt_tables.errors import LedgerError

PROGRESS = "SELECT * FROM progress ORDER BY run_id, segment, epoch"


def _catalog(uri: str, root: Path, name: str = "lakeckpt") -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(name, uri=uri, warehouse=f"file://{root}/warehouse")


def _fill(catalog: Any, identifier: str, table: Path, *, iceberg_run: bool = True) -> None:
    """Two runs (one over a Delta source, one over an Iceberg one), compacted into small
    summarized files, then a checkpoint more: live, replaced and unsummarized files."""
    from lakeckpt_tables.ledger import compaction
    from lakeckpt_tables.ledger.iceberg import IcebergLedger
    from lakeckpt_tables.sources.iceberg import IcebergSource

    ledger = IcebergLedger(identifier, catalog=catalog)
    runs = [SimulatedRun(table, ledger, "a", world=2, batch=7, window=3)]
    if iceberg_run:
        source = f"{identifier.rsplit('.', 1)[0]}.src"
        write_iceberg(catalog, source, file_ranges())
        runs.append(SimulatedRun(lambda: IcebergSource(source, catalog=catalog), ledger, "b",
                                 world=1, batch=5, window=3))
    for run in runs:
        run.train(3)
        run.checkpoint()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compaction, "FILE_ROWS", 20)
        patch.setattr(compaction, "SLICE_ROWS", 3)
        ledger.compact()
    runs[0].train(2)
    runs[0].checkpoint()


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("src") / "t"
    write_table(path)
    return path


@pytest.fixture(scope="module")
def sqlite_uri(tmp_path_factory: pytest.TempPathFactory, table: Path) -> str:
    root = tmp_path_factory.mktemp("fast")
    uri = f"sqlite:///{root}/catalog.db"
    _fill(_catalog(uri, root), "ml.ledger", table)
    return uri


@pytest.fixture(scope="module")
def pg_namespace(tmp_path_factory: pytest.TempPathFactory, table: Path) -> Iterator[str]:
    uri = os.environ.get("LAKECKPT_TEST_PG_URI")
    if not uri:
        pytest.skip("LAKECKPT_TEST_PG_URI is not set")
    catalog = _catalog(uri, tmp_path_factory.mktemp("pg"))
    namespace = f"fast_{uuid.uuid4().hex[:8]}"
    _fill(catalog, f"{namespace}.ledger", table)
    yield namespace
    for identifier in catalog.list_tables(namespace):
        catalog.drop_table(identifier)
    catalog.drop_namespace(namespace)


def _assert_same_as_pyiceberg(identifier: str, uri: str) -> None:
    """The direct read's files, rows, totals and views are pyiceberg's path's."""
    from lakeckpt_tables.ledger.iceberg_files import IcebergFiles, snapshot_files

    found = direct.read_direct(identifier, uri)
    assert found is not None
    catalog = load_catalog(uri)
    iceberg = catalog.load_table(identifier)
    planned = snapshot_files(iceberg, iceberg.current_snapshot().snapshot_id)
    files = IcebergFiles.of(iceberg)
    assert planned is not None and files is not None
    assert found.files == [(files.path(f), size) for f, size in planned]  # row for row
    assert (found.snapshot_id, found.base) == (iceberg.current_snapshot().snapshot_id,
                                               files.base)
    target = f"iceberg:{identifier}"
    fast, slow = read_ledger(target, catalog=uri), read_ledger(target, catalog=catalog)
    assert (fast.where, fast.version) == (slow.where, slow.version)
    assert fast.scan().sort_by("checksum").equals(slow.scan().sort_by("checksum"))
    keys = [("run_id", "ascending"), ("step", "ascending"), ("segment", "ascending")]
    assert fast.consumed().sort_by(keys).equals(slow.consumed().sort_by(keys))
    assert fast.catalog.name == "lakeckpt"  # loaded when asked for
    progress = [connect(target, catalog=c).sql(PROGRESS).to_arrow_table()
                for c in (uri, catalog)]
    assert progress[0].equals(progress[1])
    sizes = dict(zip(progress[0]["run_id"].to_pylist(), progress[0]["rows_in_pass"].to_pylist(),
                     strict=True))
    assert sizes == {"a": ROWS, "b": file_ranges()[-1][1]}  # the sources were found


def test_a_sqlite_catalog_ledger_is_read_directly_as_pyiceberg_reads_it(sqlite_uri: str) -> None:
    _assert_same_as_pyiceberg("ml.ledger", sqlite_uri)


@pytest.mark.postgres
def test_a_postgresql_catalog_ledger_is_read_directly_as_pyiceberg_reads_it(
        pg_namespace: str) -> None:
    _assert_same_as_pyiceberg(f"{pg_namespace}.ledger", os.environ["LAKECKPT_TEST_PG_URI"])


def _error(target: str, catalog: Any) -> str:
    with pytest.raises(LedgerError) as raised:
        read_ledger(target, catalog=catalog)
    return str(raised.value)


def test_another_catalog_name_a_missing_table_or_format_take_pyiceberg_s_path(
        tmp_path: Path, sqlite_uri: str) -> None:
    """What the direct read does not find or accept is pyiceberg's to answer: the same
    named error (a table of another catalog name is not the URI's catalog's)."""
    from lakeckpt_tables.ledger.iceberg import IcebergLedger

    uri = f"sqlite:///{tmp_path}/catalog.db"
    other = _catalog(uri, tmp_path, name="other")
    IcebergLedger("ml.ledger", catalog=other)
    mine = _catalog(uri, tmp_path)
    for identifier in ("ml.ledger", "ml.missing", "nowhere.ledger"):
        assert direct.read_direct(identifier, uri) is None
        message = _error(f"iceberg:{identifier}", uri)
        assert message == _error(f"iceberg:{identifier}", mine)
        assert message.startswith(f"no ledger iceberg:{identifier} (catalog lakeckpt)")
    mine.create_namespace("ml")
    mine.create_table("ml.old", schema=pa.schema([("a", pa.int64())]),
                      properties={"lakeckpt.ledger.format": "1"}).append(
        pa.table({"a": [1]}))
    message = _error("iceberg:ml.old", uri)
    assert message == _error("iceberg:ml.old", mine) and "format version 1" in message
    with sqlite3.connect(f"{tmp_path}/catalog.db") as db:  # a view of that name: not a table
        db.execute("INSERT INTO iceberg_tables SELECT 'lakeckpt', 'ml', 'view', "
                   "metadata_location, NULL, 'VIEW' FROM iceberg_tables WHERE table_name = 'old'")
    assert direct.read_direct("ml.view", uri) is None
    assert _error("iceberg:ml.view", uri) == _error("iceberg:ml.view", mine)
    IcebergLedger("ml.empty", catalog=mine)  # no snapshot yet: pyiceberg's path, empty
    assert direct.read_direct("ml.empty", uri) is None
    assert read_ledger("iceberg:ml.empty", catalog=uri).rows.num_rows == 0


def test_a_damaged_manifest_list_is_not_read_directly(tmp_path: Path, sqlite_uri: str) -> None:
    found = direct.read_direct("ml.ledger", sqlite_uri)
    assert found is not None
    meta = json.loads(Path(direct._metadata_location(sqlite_uri, "ml", "ledger")
                           .removeprefix("file://")).read_text())
    (snapshot,) = [s for s in meta["snapshots"]
                   if s["snapshot-id"] == meta["current-snapshot-id"]]
    data = Path(snapshot["manifest-list"].removeprefix("file://")).read_bytes()
    assert read_container(data)  # whole: read
    for cut in (data[:-20], data[:len(data) // 2], b"Obj\x02" + data[4:]):
        with pytest.raises(AvroError):
            read_container(cut)
    assert direct.read_direct("ml.ledger", f"{sqlite_uri}?mode=ro") is None  # not parsed here
    assert direct.read_direct("ml.ledger", "mysql://h/db") is None


def _pairs(entries: list[dict[str, Any]]) -> dict[Any, Any]:
    """An Iceberg map (an Avro array of key-value records) as a dict."""
    return {e["key"]: e["value"] for e in entries}


def test_the_avro_reader_decodes_manifests_as_pyiceberg_does(sqlite_uri: str) -> None:
    from pyiceberg.manifest import ManifestEntryStatus

    from lakeckpt_tables.ledger.iceberg_files import snapshot_files

    iceberg = load_catalog(sqlite_uri).load_table("ml.ledger")
    manifests = iceberg.current_snapshot().manifests(iceberg.io)
    listed = read_container(Path(iceberg.current_snapshot().manifest_list
                                 .removeprefix("file://")).read_bytes())
    assert [(m["manifest_path"], m["content"], m["added_snapshot_id"]) for m in listed] == [
        (m.manifest_path, int(m.content), m.added_snapshot_id) for m in manifests]
    for manifest in manifests:
        entries = read_container(Path(manifest.manifest_path.removeprefix("file://"))
                                 .read_bytes())
        theirs = manifest.fetch_manifest_entry(iceberg.io, discard_deleted=False)
        assert [(e["status"], e["snapshot_id"], e["data_file"]["file_path"],
                 e["data_file"]["record_count"], e["data_file"]["file_size_in_bytes"],
                 _pairs(e["data_file"]["value_counts"]), _pairs(e["data_file"]["lower_bounds"]))
                for e in entries] == [
            (int(e.status), e.snapshot_id, e.data_file.file_path, e.data_file.record_count,
             e.data_file.file_size_in_bytes, e.data_file.value_counts,
             e.data_file.lower_bounds) for e in theirs]
    deleted = 0
    for snapshot in iceberg.snapshots():  # every snapshot's live files, row for row
        planned = snapshot_files(iceberg, snapshot.snapshot_id)
        assert direct.live_files(snapshot.manifest_list) == [
            (f.removeprefix("file://"), size) for f, size in planned]
        deleted += sum(e.status == ManifestEntryStatus.DELETED
                       for m in snapshot.manifests(iceberg.io)
                       for e in m.fetch_manifest_entry(iceberg.io, discard_deleted=False))
    assert deleted  # the compaction's snapshot: replaced files are not live


def test_the_catalog_name_is_pyiceberg_s_default() -> None:
    from lakeckpt_tables.sources.iceberg import DEFAULT_CATALOG_NAME

    assert direct.CATALOG_NAME == DEFAULT_CATALOG_NAME


@pytest.mark.timeout(60)
def test_cli_progress_imports_neither_sqlalchemy_nor_pyiceberg_and_answers_the_same(
        table: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Without Iceberg sources to size, the catalog is never loaded."""
    uri = f"sqlite:///{tmp_path}/catalog.db"
    _fill(_catalog(uri, tmp_path), "ml.ledger", table, iceberg_run=False)
    argv = ["progress", "iceberg:ml.ledger", "--catalog", uri, "--output", "json"]
    code = ("import sys, runpy\n"
            f"sys.argv = ['lakeckpt', *{argv!r}]\n"
            "try:\n    runpy.run_module('lakeckpt_tables.cli', run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "loaded = sorted({m.split('.')[0] for m in sys.modules} & "
            "{'sqlalchemy', 'pyiceberg', 'rich'})\n"
            "print(loaded, file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=50, check=True)
    assert done.stderr.strip().splitlines()[-1] == "[]"
    monkeypatch.setattr(direct, "read_direct", lambda identifier, uri: None)  # pyiceberg's
    assert main(argv) == 0
    assert json.loads(done.stdout) == json.loads(capsys.readouterr().out)


def test_the_default_catalog_is_read_directly_unless_configured_otherwise(
        table: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No catalog given: the packaged default's SQLite file, read directly as pyiceberg reads
    it; a pyiceberg configuration (environment or file) may point elsewhere: pyiceberg's."""
    from lakeckpt_tables.sources.iceberg import default_catalog, default_catalog_uri

    for name in [n for n in os.environ if n.lower().startswith("pyiceberg_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("LAKECKPT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    uri = default_catalog_uri()
    assert uri == f"sqlite:///{tmp_path}/home/catalog.db"
    _fill(default_catalog(), "ml.ledger", table, iceberg_run=False)
    slow = read_ledger("iceberg:ml.ledger", catalog=default_catalog())
    assert direct.read_direct("ml.ledger", uri) is not None
    for name in (None, "lakeckpt"):
        fast = read_ledger("iceberg:ml.ledger", catalog=name)
        assert fast.version == slow.version
        assert fast.scan().sort_by("checksum").equals(slow.scan().sort_by("checksum"))
        assert fast.catalog.properties["warehouse"] == f"file://{tmp_path}/home/warehouse"
    (tmp_path / ".pyiceberg.yaml").write_text("catalog: {}\n")
    assert default_catalog_uri() is None
    (tmp_path / ".pyiceberg.yaml").unlink()
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKECKPT__URI", f"sqlite:///{tmp_path}/other.db")
    assert default_catalog_uri() is None
    with pytest.raises(LedgerError, match=r"no ledger iceberg:ml\.ledger"):
        read_ledger("iceberg:ml.ledger")  # the configured catalog, which has no such ledger
