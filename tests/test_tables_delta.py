"""Delta tables written by Spark, Databricks and delta-rs read exactly as deltalake reads them:
deletion vectors, partition columns, column mapping, INT96 timestamps, checkpoints; features
that cannot be read refused by name (tests/data/NOTICE says where the tables come from)."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conformance import classify_delta, compare, delta_references, read_all
from conftest import loader_for

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.errors import (
    DataFileError,
    SourceFileChangedError,
    UnsupportedTableError,
)
from lakeckpt_tables.sources._deletes import Deletes
from lakeckpt_tables.sources.base import DataFile, RowGroupReader, units_from_files
from lakeckpt_tables.types import TableIdentity

DATA = Path(__file__).parent / "data" / "delta"

READ_RIGHT = [
    "table-with-dv-small", "table_with_deletion_logs", "delta-0.8.0-null-partition",
    "delta-0.8.0-special-partition", "delta-2.2.0-partitioned-types", "partition-type-primitives",
    "table_with_column_mapping", "table_with_partitioning_mapping", "checkpoint-v2-table",
    "simple_table_with_checkpoint", "spark-variant-checkpoint",
]


def _versions(table: Path) -> list[int]:
    log = table / "_delta_log"
    return sorted({int(p.name.split(".")[0]) for p in log.iterdir()
                   if p.name.split(".")[0].isdigit() and p.name.endswith(".json")})


@pytest.mark.parametrize("name", READ_RIGHT)
def test_every_version_of_a_real_table_reads_as_deltalake_reads_it(name: str) -> None:
    table = DATA / name
    versions = _versions(table)
    assert versions, name
    outcomes = {v: classify_delta(str(table), v) for v in versions}
    wrong = {v: o for v, o in outcomes.items() if o[0] != "right"}
    assert not wrong, wrong


def test_deletion_vectors_drop_the_deleted_rows() -> None:
    snap = DeltaSource(str(DATA / "table-with-dv-small")).snapshot()
    assert snap.rows == 8  # the plan counts live rows: 10 in the file, 2 deleted
    assert sorted(read_all(snap).column("value").to_pylist()) == list(range(1, 9))
    before = DeltaSource(str(DATA / "table-with-dv-small")).snapshot(0)
    assert sorted(read_all(before).column("value").to_pylist()) == list(range(10))


def _ids(batches: list[dict[str, Any]]) -> list[int]:
    return [i for b in batches for i in b["id"].tolist()]


@pytest.mark.parametrize("workers", [0, 2])
def test_deletion_vectors_keep_lockstep_exactly_once_and_exact_resume(workers: int) -> None:
    path = str(DATA / "table_with_deletion_logs")
    live = sorted(pa.table(__import__("deltalake").DeltaTable(path).scan())["id"].to_pylist())
    assert len(live) == 98
    runs = []
    for rank in range(2):
        ds = LakeDataset(DeltaSource(path), columns=["id"], batch_size=5, rank=rank,
                         world_size=2, shuffle=True, seed=3)
        runs.append(list(loader_for(ds, workers)))
    assert len(runs[0]) == len(runs[1])  # lockstep: equal batch counts per rank
    assert sorted(_ids(runs[0]) + _ids(runs[1])) == live  # deleted rows never delivered
    # exact resume: stop rank 0 after 4 batches, resume from its state: the same rows follow
    ds = LakeDataset(DeltaSource(path), columns=["id"], batch_size=5, rank=0, world_size=2,
                     shuffle=True, seed=3)
    loader = loader_for(ds, workers)
    head = list(itertools.islice(loader, 4))
    state = loader.state_dict()
    again = LakeDataset(DeltaSource(path), columns=["id"], batch_size=5, rank=0, world_size=2,
                        shuffle=True, seed=3)
    resumed = loader_for(again, workers)
    resumed.load_state_dict(state)
    assert _ids(head) + _ids(list(resumed)) == _ids(runs[0])


def test_deletes_across_row_groups_count_and_mask_each_row_group(tmp_path: Path) -> None:
    path = str(tmp_path / "f.parquet")
    pq.write_table(pa.table({"id": np.arange(50, dtype=np.int64)}), path, row_group_size=16)
    deleted = [0, 15, 16, 17, 31, 32, 49]
    data_file = DataFile(path, None, 50, Deletes.from_positions(deleted))
    identity = TableIdentity("delta", str(tmp_path), "t")
    units, _ = units_from_files(identity, 0, [data_file])
    assert [u.rows for u in units] == [14, 13, 15, 1]
    reader = RowGroupReader(identity, 0)
    got = [i for u in units for i in reader.read(u, ["id"]).column("id").to_pylist()]
    assert got == [i for i in range(50) if i not in deleted]


def test_a_row_group_the_vector_spares_is_not_filtered(tmp_path: Path) -> None:
    """Only row groups holding a deleted row are filtered (a copy of every column): the
    others come back as decoded, and the mask of the filtered one is exact."""
    path = str(tmp_path / "f.parquet")
    pq.write_table(pa.table({"id": np.arange(48, dtype=np.int64)}), path, row_group_size=16)
    data_file = DataFile(path, None, 48, Deletes.from_positions([16, 20, 31]))
    identity = TableIdentity("delta", str(tmp_path), "t")
    units, _ = units_from_files(identity, 0, [data_file])
    reader = RowGroupReader(identity, 0)
    handle = reader._handle(path, units[0].file)
    masks = [reader._keep(u, data_file, handle) for u in units]
    assert masks[0] is None and masks[2] is None
    assert masks[1] is not None and masks[1].tolist() == [
        i not in (0, 4, 15) for i in range(16)]
    got = [i for u in units for i in reader.read(u, ["id"]).column("id").to_pylist()]
    assert got == [i for i in range(48) if i not in (16, 20, 31)]


def test_deletes_are_compact_and_survive_pickling() -> None:
    import pickle

    deletes = Deletes.from_selection([True] * 1000 + [False] * 3 + [True])
    assert deletes is not None and len(deletes) == 3 and len(deletes.data) == 12
    assert pickle.loads(pickle.dumps(deletes)).positions().tolist() == [1000, 1001, 1002]
    assert Deletes.from_selection([True, True]) is None


def test_int96_timestamps_past_2262_are_microseconds_not_wrapped() -> None:
    path = str(DATA / "table_with_edge_timestamps")
    table = read_all(DeltaSource(path).snapshot())
    assert sorted(table.column("BIG_DATE").to_pylist()) == [
        dt.datetime(9999, 12, 30, tzinfo=dt.UTC), dt.datetime(9999, 12, 31, tzinfo=dt.UTC)]
    batch = next(iter(LakeDataset(DeltaSource(path), batch_size=2, shuffle=False)))
    micros = {int(v) for v in batch["BIG_DATE"]}
    assert micros == {253402128000000000, 253402214400000000}  # int64 us since the epoch
    assert {int(v) for v in batch["NORMAL_DATE"]} == {1640995200000000, 1643673600000000}


def test_partition_values_are_typed_constant_columns() -> None:
    path = str(DATA / "delta-2.2.0-partitioned-types")
    table = read_all(DeltaSource(path).snapshot())
    assert table.schema.field("c1").type == pa.int32()
    assert sorted(zip(table["c1"].to_pylist(), table["c2"].to_pylist(),
                      table["c3"].to_pylist(), strict=True)) == [(4, "c", 5), (5, "b", 6),
                                                                 (6, "a", 4)]
    nulls = read_all(DeltaSource(str(DATA / "delta-0.8.0-null-partition")).snapshot())
    assert sorted(nulls["k"].to_pylist(), key=str) == ["A", None]
    special = read_all(DeltaSource(str(DATA / "delta-0.8.0-special-partition")).snapshot())
    assert sorted(special["x"].to_pylist()) == ["A/A", "B B"]


def test_column_mapping_reads_logical_names_from_physical_columns() -> None:
    table = read_all(DeltaSource(str(DATA / "table_with_column_mapping")).snapshot())
    assert table.column_names == ["Company Very Short", "Super Name"]
    assert table["Super Name"].null_count == 0
    assert "Timothy Lamb" in table["Super Name"].to_pylist()


def test_a_delta_table_with_column_mapping_written_by_delta_rs_reads_right(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    uri = str(tmp_path / "mapped")
    write_deltalake(uri, pa.table({"id": [1, 2, 3], "s": ["a", "b", "c"]}),
                    configuration={"delta.columnMapping.mode": "name"})
    ours = read_all(DeltaSource(uri).snapshot())
    assert not compare(ours, delta_references(uri, 0)[0])


def test_files_lacking_a_later_added_column_give_nulls(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    uri = str(tmp_path / "evolved")
    write_deltalake(uri, pa.table({"id": pa.array([1, 2], pa.int64())}))
    write_deltalake(uri, pa.table({"id": pa.array([3], pa.int64()),
                                   "extra": pa.array([7.5])}),
                    mode="append", schema_mode="merge")
    table = read_all(DeltaSource(uri).snapshot())
    assert sorted(zip(table["id"].to_pylist(), table["extra"].to_pylist(), strict=True),
                  key=lambda r: r[0]) == [(1, None), (2, None), (3, 7.5)]
    batch = next(iter(LakeDataset(DeltaSource(uri), columns=["id", "extra"], batch_size=3,
                                  shuffle=False)))
    assert int(np.isnan(batch["extra"].numpy()).sum()) == 2  # float nulls are NaN


def test_an_unknown_reader_feature_is_refused_up_front_by_name() -> None:
    with pytest.raises(UnsupportedTableError, match=r"variantShredding-preview") as info:
        DeltaSource(str(DATA / "spark-shredded-variant-preview-delta")).snapshot()
    assert "at version 2" in str(info.value)


def _copy(name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(DATA / name, target)
    return target


def test_a_data_file_rewritten_in_place_is_refused_before_its_rows(tmp_path: Path) -> None:
    table = _copy("table_with_deletion_logs", tmp_path)
    ds = LakeDataset(DeltaSource(str(table)), columns=["id"], batch_size=10, shuffle=False)
    data = next(table.glob("*.parquet"))
    foreign = pq.read_table(data)
    pq.write_table(foreign.slice(0, 50), data)  # other rows, other size
    with pytest.raises(SourceFileChangedError, match=rf"{data.name}.*rewritten|replaced") as info:
        next(iter(ds))
    assert "at version 20" in str(info.value)


def test_a_data_file_with_the_same_size_but_other_row_groups_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "f.parquet")
    pq.write_table(pa.table({"id": np.arange(40, dtype=np.int64)}), path, row_group_size=20)
    identity = TableIdentity("delta", str(tmp_path), "t")
    size = Path(path).stat().st_size
    units, _ = units_from_files(identity, 3, [DataFile(path, size, 40)])
    pinned = units[0].file
    assert pinned.row_group_rows == (20, 20)
    forged = DataFile(path, size, 40, row_group_rows=(30, 10))
    with pytest.raises(SourceFileChangedError, match=r"row groups of \[20, 20\] rows, \[30, 10\]"):
        RowGroupReader(identity, 3).read(type(units[0])(path, 0, 30, forged), ["id"])


def test_a_garbage_data_file_is_a_named_error(tmp_path: Path) -> None:
    table = _copy("table-with-dv-small", tmp_path)
    ds = LakeDataset(DeltaSource(str(table)), columns=["value"], batch_size=4, shuffle=False)
    data = next(table.glob("*.parquet"))
    size = data.stat().st_size
    data.write_bytes(b"\0" * size)
    with pytest.raises(DataFileError, match=rf"data file .*{data.name}") as info:
        next(iter(ds))
    assert isinstance(info.value.__cause__, pa.ArrowException | OSError)


def test_follow_mode_appended_partitioned_files_carry_their_partition_values(
        tmp_path: Path) -> None:
    from deltalake import write_deltalake

    uri = str(tmp_path / "parted")

    def rows(lo: int, hi: int, day: str | None, label: str) -> pa.Table:
        n = hi - lo
        return pa.table({
            "id": pa.array(range(lo, hi), pa.int64()),
            "day": pa.array([None if day is None else dt.date.fromisoformat(day)] * n,
                            pa.date32()),
            "label": pa.array([label] * n, pa.string()),
            "at": pa.array([dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.UTC)] * n,
                           pa.timestamp("us", "UTC")),
        })

    write_deltalake(uri, rows(0, 4, "2024-01-02", "a/b c"), partition_by=["day", "label", "at"])
    ds = LakeDataset(DeltaSource(uri), columns=["id", "day", "label", "at"], batch_size=2,
                     shuffle=False, follow=True, until_version=2, max_idle=30,
                     poll_interval=0.05)
    write_deltalake(uri, rows(4, 7, "2262-04-12", "x=y%z"), mode="append",
                    partition_by=["day", "label", "at"])
    write_deltalake(uri, rows(7, 9, "1999-12-31", ""), mode="append",
                    partition_by=["day", "label", "at"])
    got = []
    for batch in ds:
        for i in range(len(batch["id"])):
            got.append((int(batch["id"][i]), int(batch["day"][i]), batch["label"][i],
                        int(batch["at"][i])))
    ref = delta_references(uri, 2)[0]
    expected = sorted(zip(ref["id"].to_pylist(), ref["day"].cast(pa.int32()).to_pylist(),
                          ref["label"].to_pylist(), ref["at"].cast(pa.int64()).to_pylist(),
                          strict=True))
    assert sorted(got) == expected
    assert json.dumps(sorted(r[0] for r in got)) == json.dumps(list(range(9)))


def test_a_garbage_file_at_pin_time_is_a_named_error_naming_it(tmp_path: Path) -> None:
    table = _copy("table-with-dv-small", tmp_path)
    data = next(table.glob("*.parquet"))
    data.write_bytes(b"garbage" * 10)
    with pytest.raises(DataFileError, match=rf"Parquet footer of data file .*{data.name}"):
        DeltaSource(str(table)).snapshot()


def test_an_unopenable_data_file_is_a_named_error(tmp_path: Path) -> None:
    table = _copy("table-with-dv-small", tmp_path)
    ds = LakeDataset(DeltaSource(str(table)), columns=["value"], batch_size=4, shuffle=False)
    data = next(table.glob("*.parquet"))
    data.unlink()
    data.mkdir()  # a directory where the file was: opening it fails with an OSError
    with pytest.raises(DataFileError, match=rf"cannot open data file .*{data.name}") as info:
        next(iter(ds))
    assert isinstance(info.value.__cause__, OSError)


def _id_mapped_table(root: Path) -> Path:
    """A Delta table in column mapping mode ``id``, written as Spark writes one: physical
    names ``col-<uuid>`` and Parquet field ids. Version 0: one file; version 1: ``score``
    renamed ``points`` (the log changes, the files do not); version 2: a file that holds the
    columns under other names with the same field ids, as files converted from Iceberg do."""
    log = root / "_delta_log"
    log.mkdir(parents=True)

    def schema(score: str) -> str:
        fields = [(n, t, i, p) for n, t, i, p in (("id", "long", 1, "col-5f4c"),
                                                  (score, "double", 2, "col-9a1e"))]
        return json.dumps({"type": "struct", "fields": [
            {"name": n, "type": t, "nullable": True,
             "metadata": {"delta.columnMapping.id": i, "delta.columnMapping.physicalName": p}}
            for n, t, i, p in fields]})

    def data_file(name: str, columns: dict[str, tuple[int, pa.Array]]) -> dict[str, Any]:
        fields = [pa.field(n, a.type, metadata={b"PARQUET:field_id": str(i).encode()})
                  for n, (i, a) in columns.items()]
        pq.write_table(pa.table([a for _, a in columns.values()], schema=pa.schema(fields)),
                       root / name, row_group_size=2)
        rows = len(next(iter(columns.values()))[1])
        return {"add": {"path": name, "partitionValues": {}, "size": (root / name).stat().st_size,
                        "modificationTime": 0, "dataChange": True,
                        "stats": json.dumps({"numRecords": rows})}}

    def metadata(score: str) -> dict[str, Any]:
        return {"metaData": {"id": "7d1b3c1e-5a7f-4c4e-9f0e-2f6d6c1a0b11",
                             "format": {"provider": "parquet", "options": {}},
                             "schemaString": schema(score), "partitionColumns": [],
                             "configuration": {"delta.columnMapping.mode": "id",
                                               "delta.columnMapping.maxColumnId": "2"},
                             "createdTime": 0}}

    commits = [
        [{"protocol": {"minReaderVersion": 2, "minWriterVersion": 5}}, metadata("score"),
         data_file("a.parquet", {"col-5f4c": (1, pa.array([1, 2, 3], pa.int64())),
                                 "col-9a1e": (2, pa.array([0.5, 1.5, 2.5]))})],
        [metadata("points")],
        [data_file("b.parquet", {"id": (1, pa.array([10, 11], pa.int64())),
                                 "score": (2, pa.array([9.0, 8.0]))})],
    ]
    for version, actions in enumerate(commits):
        info = {"commitInfo": {"timestamp": version, "operation": "WRITE"}}
        (log / f"{version:020d}.json").write_text(
            "".join(json.dumps(a) + "\n" for a in [info, *actions]))
    return root


def test_column_mapping_id_mode_resolves_columns_by_parquet_field_id(tmp_path: Path) -> None:
    table = _id_mapped_table(tmp_path / "id-mapped")
    for version in (0, 1):  # Spark-written files: deltalake's kernel scan is the reference
        ours = read_all(DeltaSource(str(table)).snapshot(version))
        assert not compare(ours, delta_references(str(table), version)[0]), version
    assert read_all(DeltaSource(str(table)).snapshot(1)).to_pylist() == [
        {"id": 1, "points": 0.5}, {"id": 2, "points": 1.5}, {"id": 3, "points": 2.5}]
    # b.parquet holds the columns under other names with the same field ids. The protocol
    # resolves them by id; deltalake 1.6.6's scan matches physical names only and reads nulls.
    dataset = LakeDataset(DeltaSource(str(table)), columns=["id", "points"], batch_size=5,
                          shuffle=False)
    (batch,) = list(dataset)
    assert batch["id"].tolist() == [1, 2, 3, 10, 11]
    assert batch["points"].tolist() == [0.5, 1.5, 2.5, 9.0, 8.0]


def _id(i: int, name: str, kind: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, kind, nullable=nullable,
                    metadata={b"PARQUET:field_id": str(i).encode()})


def _nested_id_mapped_table(root: Path) -> Path:
    """A Delta table in column mapping mode ``id`` with nested columns: a struct ``s`` of
    ``a``, ``b``; a list ``l`` of structs of ``x``, ``y``; a map ``m`` of string keys to
    structs of ``p``, ``q``. Every nested struct field has its own id and physical name
    (Spark's ``col-<uuid>``). Version 0: a Spark-written file (physical names, field ids).
    Version 1: a file whose nested struct fields carry the same ids under each other's names
    (the two children of every struct swapped): matched by name, each would read its
    sibling's values; the protocol matches them by id."""
    log = root / "_delta_log"
    log.mkdir(parents=True)

    def field(name: str, kind: Any, i: int, physical: str) -> dict[str, Any]:
        return {"name": name, "type": kind, "nullable": True,
                "metadata": {"delta.columnMapping.id": i,
                             "delta.columnMapping.physicalName": physical}}

    def struct(*fields: dict[str, Any]) -> dict[str, Any]:
        return {"type": "struct", "fields": list(fields)}

    schema = struct(
        field("id", "long", 1, "col-id"),
        field("s", struct(field("a", "long", 2, "col-a"), field("b", "long", 3, "col-b")),
              4, "col-s"),
        field("l", {"type": "array", "containsNull": True, "elementType": struct(
            field("x", "long", 5, "col-x"), field("y", "long", 6, "col-y"))}, 7, "col-l"),
        field("m", {"type": "map", "keyType": "string", "valueContainsNull": True,
                    "valueType": struct(field("p", "long", 8, "col-p"),
                                        field("q", "long", 9, "col-q"))}, 10, "col-m"),
    )

    def data_file(name: str, n: dict[str, str], rows: list[dict[str, Any]]) -> dict[str, Any]:
        """``n``: the name each nested field has in this file (same ids as the log's)."""
        s = pa.struct([_id(2, n["a"], pa.int64()), _id(3, n["b"], pa.int64())])
        e = pa.struct([_id(5, n["x"], pa.int64()), _id(6, n["y"], pa.int64())])
        v = pa.struct([_id(8, n["p"], pa.int64()), _id(9, n["q"], pa.int64())])
        arrow = pa.schema([
            _id(1, n["id"], pa.int64()), _id(4, n["s"], s),
            _id(7, n["l"], pa.list_(_id(11, "element", e))),
            _id(10, n["m"], pa.map_(_id(12, "key", pa.string(), False), _id(13, "value", v))),
        ])

        def renamed(value: Any, kind: pa.DataType) -> Any:  # logical row -> this file's names
            if value is None:
                return None
            if pa.types.is_struct(kind):
                logical = {2: "a", 3: "b", 5: "x", 6: "y", 8: "p", 9: "q"}
                return {kind.field(i).name: value[logical[int(kind.field(i).metadata[
                    b"PARQUET:field_id"])]] for i in range(kind.num_fields)}
            if pa.types.is_map(kind):
                return [(k, renamed(v, kind.item_type)) for k, v in value]
            return [renamed(v, kind.value_type) for v in value]

        columns = {"id": pa.array([r["id"] for r in rows], pa.int64())}
        for col, kind in (("s", s), ("l", arrow.field(2).type), ("m", arrow.field(3).type)):
            columns[col] = pa.array([renamed(r[col], kind) for r in rows], kind)
        pq.write_table(pa.table(list(columns.values()), schema=arrow), root / name,
                       row_group_size=2)
        return {"add": {"path": name, "partitionValues": {},
                        "size": (root / name).stat().st_size, "modificationTime": 0,
                        "dataChange": True, "stats": json.dumps({"numRecords": len(rows)})}}

    spark = {k: f"col-{k}" for k in ("id", "s", "a", "b", "l", "x", "y", "m", "p", "q")}
    swapped = {**spark, "a": "col-b", "b": "col-a", "x": "col-y", "y": "col-x",
               "p": "col-q", "q": "col-p"}
    metadata = {"metaData": {"id": "5b0c6c57-4d7e-4a60-8f5e-0a1d2c3b4e5f",
                             "format": {"provider": "parquet", "options": {}},
                             "schemaString": json.dumps(schema), "partitionColumns": [],
                             "configuration": {"delta.columnMapping.mode": "id",
                                               "delta.columnMapping.maxColumnId": "13"},
                             "createdTime": 0}}
    commits = [
        [{"protocol": {"minReaderVersion": 2, "minWriterVersion": 5}}, metadata,
         data_file("a.parquet", spark, NESTED_ROWS[:3])],
        [data_file("b.parquet", swapped, NESTED_ROWS[3:])],
    ]
    for version, actions in enumerate(commits):
        info = {"commitInfo": {"timestamp": version, "operation": "WRITE"}}
        (log / f"{version:020d}.json").write_text(
            "".join(json.dumps(a) + "\n" for a in [info, *actions]))
    return root


NESTED_ROWS: list[dict[str, Any]] = [
    {"id": 1, "s": {"a": 10, "b": 11}, "l": [{"x": 12, "y": 13}, {"x": 14, "y": 15}],
     "m": [("k1", {"p": 16, "q": 17})]},
    {"id": 2, "s": None, "l": [], "m": None},
    {"id": 3, "s": {"a": None, "b": 31}, "l": None,
     "m": [("k3", None), ("k4", {"p": 34, "q": 35})]},
    {"id": 4, "s": {"a": 40, "b": 41}, "l": [{"x": 42, "y": 43}, None],
     "m": [("k5", {"p": 44, "q": 45})]},
    {"id": 5, "s": {"a": 50, "b": None}, "l": [{"x": None, "y": 53}], "m": []},
]


def test_column_mapping_id_mode_resolves_nested_fields_by_parquet_field_id(
        tmp_path: Path) -> None:
    table = _nested_id_mapped_table(tmp_path / "nested-id-mapped")
    # version 0 (Spark-written names): deltalake's own scan is the reference
    ours = read_all(DeltaSource(str(table)).snapshot(0))
    assert not compare(ours, delta_references(str(table), 0)[0])
    # version 1 adds a file whose nested fields have swapped names and the same ids: the
    # protocol resolves by id, so every value is where the log's schema puts it
    ours = read_all(DeltaSource(str(table)).snapshot(1))
    assert sorted(ours.to_pylist(), key=lambda r: r["id"]) == NESTED_ROWS
    # and the same rows through the dataset's Arrow output, in table order
    dataset = LakeDataset(DeltaSource(str(table)), columns=["id", "s", "l", "m"],
                          batch_size=5, shuffle=False, output="arrow")
    (batch,) = list(dataset)
    assert pa.Table.from_batches([batch]).to_pylist() == NESTED_ROWS
