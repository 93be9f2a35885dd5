"""Iceberg tables read by field id as pyiceberg reads them, at every snapshot: renamed, swapped,
dropped and re-added, promoted and added columns; identity partitions whose column the files do
not store; positional deletes and Puffin deletion vectors; equality deletes refused by name."""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conformance import compare, read_all
from conftest import loader_for, sql_catalog

from lakeckpt_tables import IcebergSource, LakeDataset
from lakeckpt_tables.errors import UnsupportedTableError


def _every_snapshot_reads_as_pyiceberg_reads_it(catalog: Any, identifier: str) -> int:
    table = catalog.load_table(identifier)
    checked = 0
    for snap in table.metadata.snapshots:
        ours = read_all(IcebergSource(identifier, catalog=catalog).snapshot(snap.snapshot_id))
        reference = table.scan(snapshot_id=snap.snapshot_id).to_arrow()
        assert not compare(ours, reference), (snap.snapshot_id, compare(ours, reference))
        checked += 1
    return checked


def _schema(**fields: pa.DataType) -> pa.Schema:
    return pa.schema([pa.field(k, v) for k, v in fields.items()])


def test_schema_evolution_is_resolved_by_field_id_at_every_snapshot(tmp_path: Path) -> None:
    catalog = sql_catalog(tmp_path)
    catalog.create_namespace("ns")
    t = catalog.create_table("ns.evolve", schema=_schema(id=pa.int64(), a=pa.int32(),
                                                         b=pa.int32(), f=pa.float32(),
                                                         gone=pa.string()))

    def append(n0: int, n1: int, **extra: Any) -> None:
        table = catalog.load_table("ns.evolve")
        arrow = table.schema().as_arrow()
        cols = {}
        for field in arrow:
            if field.name == "id":
                cols["id"] = pa.array(range(n0, n1), field.type)
            elif pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
                cols[field.name] = pa.array([f"{field.name}{i}" for i in range(n0, n1)],
                                            field.type)
            else:
                fid = int(field.metadata[b"PARQUET:field_id"])
                cols[field.name] = pa.array([i * 100 + fid for i in range(n0, n1)], field.type)
        table.append(pa.table(cols, schema=arrow))

    append(0, 3)
    with t.update_schema() as up:  # rename a -> alpha
        up.rename_column("a", "alpha")
    append(3, 5)
    t = catalog.load_table("ns.evolve")
    with t.update_schema() as up:  # swap two names: alpha <-> b
        up.rename_column("alpha", "tmp")
    t = catalog.load_table("ns.evolve")
    with t.update_schema() as up:
        up.rename_column("b", "alpha")
    t = catalog.load_table("ns.evolve")
    with t.update_schema() as up:
        up.rename_column("tmp", "b")
    append(5, 7)
    t = catalog.load_table("ns.evolve")
    with t.update_schema() as up:  # drop and re-add under the same name: a new field id
        up.delete_column("gone")
    t = catalog.load_table("ns.evolve")
    with t.update_schema() as up:
        up.add_column("gone", __import__("pyiceberg.types", fromlist=["StringType"]).StringType())
    append(7, 9)
    t = catalog.load_table("ns.evolve")
    from pyiceberg.types import DoubleType, LongType

    with t.update_schema() as up:  # promote int -> long, float -> double
        up.update_column("b", LongType())
        up.update_column("f", DoubleType())
    append(9, 11)
    assert _every_snapshot_reads_as_pyiceberg_reads_it(catalog, "ns.evolve") == 5
    latest = read_all(IcebergSource("ns.evolve", catalog=catalog).snapshot())
    rows = {r["id"]: r for r in latest.to_pylist()}
    assert rows[0]["gone"] is None  # the re-added column is another column: old files null
    assert (rows[0]["b"], rows[0]["alpha"]) == (2, 3)  # field ids 2 (was a) and 3 (was b)
    assert (rows[10]["b"], rows[10]["alpha"]) == (1002, 1003)
    assert latest.schema.field("b").type == pa.int64()


def _write_data_file(path: Path, columns: dict[str, tuple[int, pa.Array]]) -> int:
    fields = [pa.field(name, arr.type, metadata={b"PARQUET:field_id": str(fid).encode()})
              for name, (fid, arr) in columns.items()]
    pq.write_table(pa.table([a for _, a in columns.values()], schema=pa.schema(fields)),
                   str(path), row_group_size=4)
    return path.stat().st_size


def _add_file(table: Any, path: Path, rows: int, partition: Any, content: Any = None,
              equality_ids: list[int] | None = None, file_format: Any = None) -> None:
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    data_file = DataFile.from_args(
        content=content if content is not None else DataFileContent.DATA,
        file_path=f"file://{path}", file_format=file_format or FileFormat.PARQUET,
        partition=partition,
        record_count=rows, file_size_in_bytes=path.stat().st_size,
        equality_ids=equality_ids)
    data_file.spec_id = table.metadata.default_spec_id
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        append.append_data_file(data_file)


def _partitioned(tmp_path: Path) -> tuple[Any, Any]:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import LongType, NestedField, StringType

    catalog = sql_catalog(tmp_path)
    catalog.create_namespace("ns")
    schema = Schema(NestedField(1, "id", LongType(), required=False),
                    NestedField(2, "region", StringType(), required=False))
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"))
    return catalog, catalog.create_table("ns.parted", schema=schema, partition_spec=spec,
                                         properties={"format-version": "2"})


def test_identity_partition_values_come_from_the_manifest_when_files_lack_them(
        tmp_path: Path) -> None:
    from pyiceberg.typedef import Record

    catalog, _table = _partitioned(tmp_path)
    for region, lo in (("eu", 0), ("us", 10)):
        path = tmp_path / f"{region}.parquet"
        _write_data_file(path, {"id": (1, pa.array(range(lo, lo + 6), pa.int64()))})
        _add_file(catalog.load_table("ns.parted"), path, 6, Record(region))
    assert _every_snapshot_reads_as_pyiceberg_reads_it(catalog, "ns.parted") == 2
    got = read_all(IcebergSource("ns.parted", catalog=catalog).snapshot())
    assert sorted(zip(got["id"].to_pylist(), got["region"].to_pylist(), strict=True)) == (
        [(i, "eu") for i in range(6)] + [(i, "us") for i in range(10, 16)])


def test_positional_deletes_are_applied_with_lockstep_and_exact_resume(tmp_path: Path) -> None:
    from pyiceberg.manifest import DataFileContent
    from pyiceberg.typedef import Record

    catalog, _table = _partitioned(tmp_path)
    data = tmp_path / "eu.parquet"
    _write_data_file(data, {"id": (1, pa.array(range(40), pa.int64()))})
    _add_file(catalog.load_table("ns.parted"), data, 40, Record("eu"))
    deleted = [0, 3, 4, 5, 17, 39]
    deletes = tmp_path / "eu-deletes.parquet"
    _write_data_file(deletes, {
        "file_path": (2147483546, pa.array([f"file://{data}"] * len(deleted), pa.string())),
        "pos": (2147483545, pa.array(deleted, pa.int64()))})
    _add_file(catalog.load_table("ns.parted"), deletes, len(deleted), Record("eu"),
              DataFileContent.POSITION_DELETES)
    assert _every_snapshot_reads_as_pyiceberg_reads_it(catalog, "ns.parted") == 2
    live = [i for i in range(40) if i not in deleted]
    snap = IcebergSource("ns.parted", catalog=catalog).snapshot()
    assert snap.rows == len(live)
    _lockstep_exactly_once_and_exact_resume(catalog, live, batch_size=3, seed=5)


def _lockstep_exactly_once_and_exact_resume(catalog: Any, live: list[int], *, batch_size: int,
                                            seed: int) -> list[list[list[int]]]:
    """Two ranks read ``ns.parted``: equal batch counts, every live id once, and rank 1
    resumed after two batches gives the rest of its uninterrupted run. Returns the runs."""
    def dataset(rank: int) -> LakeDataset:
        return LakeDataset(IcebergSource("ns.parted", catalog=catalog), columns=["id"],
                           batch_size=batch_size, rank=rank, world_size=2, seed=seed)

    runs = [[b["id"].tolist() for b in loader_for(dataset(r), 0)] for r in range(2)]
    assert len(runs[0]) == len(runs[1])
    assert sorted(i for run in runs for b in run for i in b) == live
    loader = loader_for(dataset(1), 0)
    head = [b["id"].tolist() for b in itertools.islice(loader, 2)]
    resumed = loader_for(dataset(1), 0)
    resumed.load_state_dict(loader.state_dict())
    assert head + [b["id"].tolist() for b in resumed] == runs[1]
    return runs


def test_equality_deletes_are_refused_up_front_naming_the_file(tmp_path: Path) -> None:
    from pyiceberg.manifest import DataFileContent
    from pyiceberg.typedef import Record

    catalog, _table = _partitioned(tmp_path)
    data = tmp_path / "eu.parquet"
    _write_data_file(data, {"id": (1, pa.array(range(8), pa.int64()))})
    _add_file(catalog.load_table("ns.parted"), data, 8, Record("eu"))
    eq = tmp_path / f"eq-{uuid.uuid4().hex}.parquet"
    _write_data_file(eq, {"id": (1, pa.array([3], pa.int64()))})
    _add_file(catalog.load_table("ns.parted"), eq, 1, Record("eu"),
              DataFileContent.EQUALITY_DELETES, equality_ids=[1])
    with pytest.raises(UnsupportedTableError, match=rf"equality delete.*{eq.name}") as info:
        LakeDataset(IcebergSource("ns.parted", catalog=catalog))
    assert "at snapshot" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError | NotImplementedError)


def test_an_iceberg_reader_crosses_into_workers_by_pickle(tmp_path: Path) -> None:
    import pickle

    catalog, table = _partitioned(tmp_path)
    table.append(pa.table({"id": pa.array(np.arange(5), pa.int64()),
                           "region": pa.array(["x"] * 5, pa.large_string())}))
    snap = IcebergSource("ns.parted", catalog=catalog).snapshot()
    reader = pickle.loads(pickle.dumps(snap.row_reader()))
    assert reader.read(snap.units[0], ["region", "id"]).to_pydict() == {
        "region": ["x"] * 5, "id": [0, 1, 2, 3, 4]}


def test_a_follower_pinned_before_the_first_snapshot_reads_appends_by_field_id(
        tmp_path: Path) -> None:
    from pyiceberg.typedef import Record

    catalog, _table = _partitioned(tmp_path)
    ds = LakeDataset(IcebergSource("ns.parted", catalog=catalog), columns=["id", "region"],
                     output="arrow", batch_size=3, shuffle=False, follow=True, max_idle=2,
                     poll_interval=0.05)
    assert ds.snapshot.version == -1
    path = tmp_path / "eu.parquet"
    _write_data_file(path, {"id": (1, pa.array(range(6), pa.int64()))})  # no region column
    _add_file(catalog.load_table("ns.parted"), path, 6, Record("eu"))
    got = pa.Table.from_batches(list(ds))
    assert sorted(zip(got["id"].to_pylist(), got["region"].to_pylist(), strict=True)) == [
        (i, "eu") for i in range(6)]


def test_a_followed_append_with_equality_deletes_is_a_named_error(tmp_path: Path) -> None:
    from pyiceberg.manifest import DataFileContent
    from pyiceberg.typedef import Record

    from lakeckpt_tables.errors import LakeckptError

    catalog, _ = _partitioned(tmp_path)
    data = tmp_path / "eu.parquet"
    _write_data_file(data, {"id": (1, pa.array(range(8), pa.int64()))})
    _add_file(catalog.load_table("ns.parted"), data, 8, Record("eu"))
    ds = LakeDataset(IcebergSource("ns.parted", catalog=catalog), columns=["id"],
                     batch_size=4, shuffle=False, follow=True, max_idle=2, poll_interval=0.05)
    eq = tmp_path / "eq.parquet"
    _write_data_file(eq, {"id": (1, pa.array([3], pa.int64()))})
    _add_file(catalog.load_table("ns.parted"), eq, 1, Record("eu"),
              DataFileContent.EQUALITY_DELETES, equality_ids=[1])
    with pytest.raises(LakeckptError, match=r"equality|delete") as info:
        list(ds)
    assert "snapshot" in str(info.value)


def _puffin_deletion_vector(path: Path, data_file: str, deleted: list[int]) -> None:
    """A Puffin file holding one ``deletion-vector-v1`` blob, as Iceberg v3 writers store a
    data file's deleted rows: length (big-endian), magic, 64-bit roaring bitmap, CRC-32."""
    import struct
    import zlib

    from pyroaring import BitMap

    body = (bytes([0xD1, 0xD3, 0x39, 0x64]) + struct.pack("<qi", 1, 0)
            + BitMap(deleted).serialize())
    blob = struct.pack(">i", len(body)) + body + struct.pack(">I", zlib.crc32(body))
    footer = ('{"blobs": [{"type": "deletion-vector-v1", "fields": [2147483645], '
              '"snapshot-id": -1, "sequence-number": -1, "offset": 4, '
              f'"length": {len(blob)}, "properties": {{"referenced-data-file": '
              f'"{data_file}", "cardinality": "{len(deleted)}"}}}}]}}').encode()
    path.write_bytes(b"PFA1" + blob + b"PFA1" + footer + struct.pack("<i", len(footer))
                     + bytes(4) + b"PFA1")


def test_puffin_deletion_vectors_are_applied_as_pyiceberg_applies_them(tmp_path: Path) -> None:
    """The deletion vectors of format v3 (Puffin ``deletion-vector-v1`` blobs) go through
    pyiceberg's ``_read_deletes`` like positional delete files. pyiceberg 0.12 writes no v3
    manifests, so the Puffin file is registered in a v2 table: the delete file is what is
    tested, not v3 table metadata."""
    from pyiceberg.manifest import DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    catalog, _table = _partitioned(tmp_path)
    data = tmp_path / "eu.parquet"
    _write_data_file(data, {"id": (1, pa.array(range(40), pa.int64()))})
    _add_file(catalog.load_table("ns.parted"), data, 40, Record("eu"))
    deleted = [1, 2, 8, 21, 22, 38]
    puffin = tmp_path / "eu-dv.puffin"
    _puffin_deletion_vector(puffin, f"file://{data}", deleted)
    _add_file(catalog.load_table("ns.parted"), puffin, len(deleted), Record("eu"),
              DataFileContent.POSITION_DELETES, file_format=FileFormat.PUFFIN)
    live = [i for i in range(40) if i not in deleted]
    reference = catalog.load_table("ns.parted").scan().to_arrow()
    assert sorted(reference["id"].to_pylist()) == live  # pyiceberg applies the vector
    assert _every_snapshot_reads_as_pyiceberg_reads_it(catalog, "ns.parted") == 2
    assert IcebergSource("ns.parted", catalog=catalog).snapshot().rows == len(live)
    runs = _lockstep_exactly_once_and_exact_resume(catalog, live, batch_size=4, seed=3)
    assert len(runs[0]) == 5  # 34 live rows, 17 a rank, batches of 4


def test_pyiceberg_is_pinned_to_the_minor_version_whose_internals_are_called() -> None:
    """sources/iceberg.py calls pyiceberg's private ``_read_deletes`` and
    ``_to_requested_schema``: a new minor version may change them, so the dependency stops
    before it, and the installed version is inside the pin."""
    import importlib.metadata
    import tomllib

    from packaging.requirements import Requirement

    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    (pin,) = [Requirement(d) for d in deps if Requirement(d).name == "pyiceberg"]
    installed = importlib.metadata.version("pyiceberg")
    major, minor = (int(v) for v in installed.split(".")[:2])
    assert installed in pin.specifier
    assert f"{major}.{minor + 1}.0" not in pin.specifier
    assert any(s.operator == "<" for s in pin.specifier)
