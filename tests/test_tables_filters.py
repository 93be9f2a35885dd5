"""Row filters decided at pin time: the plan counts only kept rows, so lockstep, exactly-once
and exact resume hold; partitions decide whole files unread; the filter is part of the run."""

from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import loader_for

from lakeckpt_tables import DeltaSource, IcebergSource, LakeDataset
from lakeckpt_tables.errors import FilterError, StateMismatchError
from lakeckpt_tables.sources.filters import filter_columns, filtered

DATA = Path(__file__).parent / "data" / "delta"


def _table(tmp_path: Path) -> str:
    from deltalake import WriterProperties, write_deltalake

    uri = str(tmp_path / "t")
    props = WriterProperties(max_row_group_size=7, write_batch_size=7)
    for part in ("a", "b", "c"):
        lo = {"a": 0, "b": 100, "c": 200}[part]
        write_deltalake(uri, pa.table({"id": pa.array(range(lo, lo + 40), pa.int64()),
                                       "part": pa.array([part] * 40)}),
                        mode="append", partition_by=["part"], writer_properties=props)
    return uri


def _ids(batches: list[dict]) -> list[int]:  # type: ignore[type-arg]
    return [i for b in batches for i in b["id"].tolist()]


def test_a_filter_keeps_exactly_its_rows_with_lockstep_and_exact_resume(tmp_path: Path) -> None:
    uri = _table(tmp_path)
    expr = (pc.bit_wise_and(pc.field("id"), 1) == 0) & (pc.field("part") != "b")
    expected = [i for i in list(range(40)) + list(range(200, 240)) if i % 2 == 0]

    def dataset(rank: int) -> LakeDataset:
        return LakeDataset(DeltaSource(uri), columns=["id"], batch_size=4, rank=rank,
                           world_size=2, seed=1, filter=expr)

    assert dataset(0).snapshot.rows == len(expected)
    runs = [list(loader_for(dataset(r), 0)) for r in range(2)]
    assert len(runs[0]) == len(runs[1])
    assert sorted(_ids(runs[0]) + _ids(runs[1])) == expected
    loader = loader_for(dataset(1), 0)
    head = list(itertools.islice(loader, 2))
    resumed = loader_for(dataset(1), 0)
    resumed.load_state_dict(loader.state_dict())
    assert _ids(head) + _ids(list(resumed)) == _ids(runs[1])


def test_a_partition_only_filter_drops_whole_files_without_reading_them(tmp_path: Path) -> None:
    uri = _table(tmp_path)
    snap = DeltaSource(uri).snapshot()
    dropped = {u.path for u in snap.units if dict(u.file.partition)["part"] != "c"}
    for path in dropped:
        Path(path).write_bytes(b"not parquet")  # would fail if read
    kept = filtered(snap, pc.field("part") == "c")
    assert kept.rows == 40 and {u.path for u in kept.units}.isdisjoint(dropped)


def test_a_filter_composes_with_deletion_vectors() -> None:
    snap = DeltaSource(str(DATA / "table-with-dv-small")).snapshot()
    kept = filtered(snap, pc.field("value") > 4)
    assert kept.rows == 4  # 5..8: 9 is deleted by the deletion vector
    from conformance import read_all

    assert sorted(read_all(kept)["value"].to_pylist()) == [5, 6, 7, 8]


def test_a_state_taken_under_another_filter_is_refused_by_name(tmp_path: Path) -> None:
    uri = _table(tmp_path)
    ds = LakeDataset(DeltaSource(uri), columns=["id"], batch_size=4, filter=pc.field("id") > 5)
    loader = loader_for(ds, 0)
    next(iter(loader))
    other = LakeDataset(DeltaSource(uri), columns=["id"], batch_size=4,
                        filter=pc.field("id") > 6)
    with pytest.raises(StateMismatchError, match=r"filter: state has '\(id > 5\)'"):
        other.load_state_dict(loader.state_dict())


def test_a_filter_on_an_unknown_column_is_a_named_error(tmp_path: Path) -> None:
    uri = _table(tmp_path)
    with pytest.raises(FilterError, match=r"version 2: filter .* names column 'nope'"):
        LakeDataset(DeltaSource(uri), filter=pc.field("nope") > 1)
    with pytest.raises(ValueError, match="take no filter"):
        LakeDataset(DeltaSource(uri), filter=pc.field("id") > 1, follow=True, max_idle=1)
    snap = DeltaSource(uri).snapshot()
    assert filter_columns(snap.schema, (pc.field("part") == "a") | (pc.field("id") < 3),
                          "t") == ["part", "id"]


def test_a_filter_on_an_iceberg_table_reads_by_field_id(tmp_path: Path) -> None:
    from conftest import sql_catalog

    catalog = sql_catalog(tmp_path)
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.f", schema=pa.schema([pa.field("id", pa.int64())]))
    table.append(pa.table({"id": pa.array(range(30), pa.int64())}))
    with table.update_schema() as up:
        up.rename_column("id", "key")
    table = catalog.load_table("ns.f")
    table.append(pa.table({"key": pa.array(range(30, 33), pa.int64())},
                          schema=table.schema().as_arrow()))
    ds = LakeDataset(IcebergSource("ns.f", catalog=catalog), columns=["key"], batch_size=50,
                     filter=pc.field("key") >= 28, shuffle=False)
    (batch,) = list(ds)
    assert sorted(batch["key"].tolist()) == [28, 29, 30, 31, 32]
