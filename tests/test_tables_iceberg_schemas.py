"""Which Iceberg schema is read: with no ``version=`` the table's current schema when pinned,
with ``version=S`` snapshot S's own, as pyiceberg's ``scan()`` and ``scan(snapshot_id=S)`` read
them; and a reader state resumes with the schema it was pinned with, whatever the table's
schema became since."""

from __future__ import annotations

import decimal
import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from conformance import compare, read_all
from conftest import sql_catalog

from lakeckpt_tables import IcebergSource, LakeDataset
from lakeckpt_tables.errors import StateMismatchError


def _evolved_after_its_last_snapshot(tmp_path: Path) -> tuple[Any, int]:
    """A table whose schema changed after its only snapshot: ``a`` (int) and ``b`` (string)
    swapped names, ``g`` dropped and re-added (a new field: null in the old file), ``n``
    promoted int -> long, ``f`` float -> double, ``d`` decimal(9, 2) -> decimal(12, 2).
    Returns the catalog and the snapshot id."""
    from pyiceberg.types import DecimalType, DoubleType, LongType, StringType

    catalog = sql_catalog(tmp_path)
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", schema=pa.schema([
        pa.field("id", pa.int64()), pa.field("a", pa.int32()), pa.field("b", pa.string()),
        pa.field("g", pa.string()), pa.field("n", pa.int32()), pa.field("f", pa.float32()),
        pa.field("d", pa.decimal128(9, 2))]))
    table.append(pa.table({"id": pa.array(range(6), pa.int64()),
                           "a": pa.array(range(10, 16), pa.int32()),
                           "b": [f"s{i}" for i in range(6)], "g": [f"g{i}" for i in range(6)],
                           "n": pa.array(range(100, 106), pa.int32()),
                           "f": pa.array([i + 0.5 for i in range(6)], pa.float32()),
                           "d": pa.array([decimal.Decimal(i) / 4 for i in range(6)],
                                         pa.decimal128(9, 2))},
                          schema=table.schema().as_arrow()))
    snapshot_id = table.current_snapshot().snapshot_id
    for rename in (("a", "tmp"), ("b", "a"), ("tmp", "b")):
        with table.update_schema() as update:
            update.rename_column(*rename)
    with table.update_schema() as update:
        update.delete_column("g")
    with table.update_schema() as update:
        update.add_column("g", StringType())
        update.update_column("n", LongType())
        update.update_column("f", DoubleType())
        update.update_column("d", DecimalType(12, 2))
    return catalog, snapshot_id


def test_latest_reads_the_current_schema_by_field_id_and_version_reads_the_snapshots(
        tmp_path: Path) -> None:
    catalog, snapshot_id = _evolved_after_its_last_snapshot(tmp_path)
    table = catalog.load_table("ns.t")
    source = IcebergSource("ns.t", catalog=catalog)
    latest = read_all(source.snapshot())
    reference = table.scan().to_arrow()
    assert not compare(latest, reference, types=True), compare(latest, reference, types=True)
    row = {r["id"]: r for r in latest.to_pylist()}[2]
    assert (row["a"], row["b"], row["g"], row["n"]) == ("s2", 12, None, 102)
    assert latest.schema.field("n").type == pa.int64()
    assert latest.schema.field("f").type == pa.float64()
    assert latest.schema.field("d").type == pa.decimal128(12, 2)
    assert (row["f"], row["d"]) == (2.5, decimal.Decimal("0.50"))
    pinned = read_all(source.snapshot(snapshot_id))  # the snapshot's own schema
    reference = table.scan(snapshot_id=snapshot_id).to_arrow()
    assert not compare(pinned, reference, types=True), compare(pinned, reference)
    assert {r["id"]: r for r in pinned.to_pylist()}[2]["g"] == "g2"
    # both stay right however often and in whichever order they are pinned
    assert read_all(source.snapshot()).column("a").to_pylist()[0].startswith("s")
    assert source.snapshot().schema_id is not None
    assert source.snapshot(snapshot_id).schema_id is None


def _rows(dataset: LakeDataset, batches: int | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for batch in itertools.islice(iter(dataset), batches):
        out.extend(pa.Table.from_batches([batch]).to_pylist())
    return out


def test_a_resumed_reader_reads_the_schema_it_was_pinned_with(tmp_path: Path) -> None:
    """State taken reading the current schema (not the snapshot's own); then the table renames
    again and commits a new snapshot: a reader built without ``version=`` adopts the state's
    version and schema, and delivers the rest under the pinned names."""
    catalog, snapshot_id = _evolved_after_its_last_snapshot(tmp_path)
    expected = catalog.load_table("ns.t").scan().to_arrow().to_pylist()

    def dataset() -> LakeDataset:
        return LakeDataset(IcebergSource("ns.t", catalog=catalog), output="arrow",
                           batch_size=2, shuffle=False,
                           columns=["id", "a", "b", "g", "n", "f", "d"])

    first = dataset()
    head = _rows(first, 1)
    state = first.state_dict()
    table = catalog.load_table("ns.t")
    with table.update_schema() as update:  # a and b swap back; then a new snapshot
        update.rename_column("a", "tmp")
    with table.update_schema() as update:
        update.rename_column("b", "a")
    with table.update_schema() as update:
        update.rename_column("tmp", "b")
    table = catalog.load_table("ns.t")
    table.append(pa.table({"id": pa.array([99], pa.int64()), "a": pa.array([1], pa.int32()),
                           "b": ["late"], "g": ["x"], "n": pa.array([1], pa.int64()),
                           "f": pa.array([1.0]), "d": pa.array([decimal.Decimal(1)],
                                                                pa.decimal128(12, 2))},
                          schema=table.schema().as_arrow()))
    resumed = dataset()
    resumed.load_state_dict(state)
    assert resumed.snapshot.version == snapshot_id
    rest = _rows(resumed)
    assert len(head) == 2
    assert sorted(head + rest, key=lambda r: r["id"]) == sorted(expected, key=lambda r: r["id"])
    # pinned explicitly to the snapshot, the state of another schema is refused by name
    other = LakeDataset(IcebergSource("ns.t", catalog=catalog), output="arrow", batch_size=2,
                        shuffle=False, columns=["id", "a", "b", "g", "n", "f", "d"],
                        version=snapshot_id)
    with pytest.raises(StateMismatchError, match="schema"):
        other.load_state_dict(state)


def test_a_followed_append_after_a_swap_counts_nulls_under_the_pinned_names(
        tmp_path: Path) -> None:
    """A follower reads appended files with the schema it pinned: their null statistics are
    keyed by the pinned names too (after ``a`` <-> ``b`` swap, the nulls of field ``b`` stay
    under ``b``)."""
    catalog = sql_catalog(tmp_path)
    catalog.create_namespace("ns")
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("a", pa.int64()),
                        pa.field("b", pa.int64())])
    table = catalog.create_table("ns.f", schema=schema)
    table.append(pa.table({"id": [0, 1], "a": [1, 2], "b": [3, 4]}, schema=schema))
    source = IcebergSource("ns.f", catalog=catalog)
    pinned = source.snapshot()
    for rename in (("a", "tmp"), ("b", "a"), ("tmp", "b")):
        with table.update_schema() as update:
            update.rename_column(*rename)
    table = catalog.load_table("ns.f")  # field 2 is now "b", field 3 "a"; field 3 has nulls
    table.append(pa.table({"id": [2, 3], "b": [5, 6], "a": [None, None]},
                          schema=table.schema().as_arrow()))
    commit = source.commit_after(pinned.version, pinned, ["id", "a"])
    assert commit is not None and commit.kind == "append"
    assert dict(commit.files[0].null_counts or ()) == {"id": 0, "a": 0, "b": 2}
