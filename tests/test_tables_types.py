"""Nulls, decimals and every type: the null policy decided at construction, the Arrow output
with the same state and resume as tensors."""

from __future__ import annotations

import decimal
import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conformance import compare, delta_references, read_all
from conftest import loader_for, sql_catalog

from lakeckpt_tables import DeltaSource, IcebergSource, LakeDataset
from lakeckpt_tables.errors import NullValuesError, UnsupportedTableError
from lakeckpt_tables.sources.base import DataFile, RowGroupReader, units_from_files
from lakeckpt_tables.types import TableIdentity


def _nulls_table(tmp_path: Path) -> str:
    from deltalake import write_deltalake

    uri = str(tmp_path / "nulls")
    write_deltalake(uri, pa.table({"id": pa.array(range(6), pa.int64()),
                                   "label": pa.array([1, 2, 3, 4, 5, 6], pa.int32())}))
    write_deltalake(uri, pa.table({"id": pa.array(range(6, 10), pa.int64()),
                                   "label": pa.array([7, None, 9, None], pa.int32())}),
                    mode="append")
    return uri


def test_nulls_in_an_integer_column_are_refused_at_construction_naming_file_and_count(
        tmp_path: Path) -> None:
    uri = _nulls_table(tmp_path)
    with pytest.raises(NullValuesError) as info:
        LakeDataset(DeltaSource(uri), columns=["id", "label"])
    message = str(info.value)
    assert "2 null(s) in column 'label' (int32)" in message
    assert "at version 1" in message and ".parquet" in message
    newest = max(Path(uri).glob("*.parquet"), key=lambda p: p.stat().st_mtime_ns)
    assert newest.name in message
    LakeDataset(DeltaSource(uri), columns=["id"])  # other columns read


def test_fill_gives_zero_and_mask_says_which_were_null(tmp_path: Path) -> None:
    uri = _nulls_table(tmp_path)
    expected = {0: 1, 1: 2, 2: 3, 3: 4, 4: 5, 5: 6, 6: 7, 7: None, 8: 9, 9: None}
    for nulls in ("fill", "mask"):
        ds = LakeDataset(DeltaSource(uri), columns=["id", "label"], nulls=nulls, batch_size=4,
                         shuffle=False)
        got: dict[int, Any] = {}
        for batch in ds:
            assert batch["label"].dtype.is_floating_point is False
            flags = batch.get("label__is_null")
            assert (flags is not None) == (nulls == "mask")
            for j, i in enumerate(batch["id"].tolist()):
                value = int(batch["label"][j])
                if flags is not None and bool(flags[j]):
                    value = None
                got[i] = value
        if nulls == "fill":
            assert got == {i: (0 if v is None else v) for i, v in expected.items()}
        else:
            assert got == expected


def test_a_file_lacking_a_later_added_integer_column_is_refused_with_its_row_count(
        tmp_path: Path) -> None:
    from deltalake import write_deltalake

    uri = str(tmp_path / "added")
    write_deltalake(uri, pa.table({"id": pa.array(range(5), pa.int64())}))
    write_deltalake(uri, pa.table({"id": pa.array([5], pa.int64()),
                                   "n": pa.array([3], pa.int64())}),
                    mode="append", schema_mode="merge")
    with pytest.raises(NullValuesError, match=r"5 null\(s\) in column 'n'"):
        LakeDataset(DeltaSource(uri), columns=["id", "n"])


def test_a_file_without_statistics_is_counted_by_reading_it(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"v": pa.array([1, None, 3, None, None, 6], pa.int64())}), path,
                   row_group_size=3, write_statistics=False)
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).statistics is None
    units, _ = units_from_files(TableIdentity("delta", str(tmp_path), "t"), 0,
                                [DataFile(str(path), None, 6)])
    reader = RowGroupReader(TableIdentity("delta", str(tmp_path), "t"), 0)
    assert reader.null_counts(units, ["v"]) == {"v": 3}
    assert reader.null_counts(units[1:], ["v"]) == {"v": 2}


def test_an_iceberg_file_lacking_an_added_column_is_refused_and_reads_null_as_arrow(
        tmp_path: Path) -> None:
    from pyiceberg.types import LongType

    catalog = sql_catalog(tmp_path)
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", schema=pa.schema([pa.field("id", pa.int64())]))
    table.append(pa.table({"id": pa.array([0, 1, 2], pa.int64())}))
    with table.update_schema() as up:
        up.add_column("n", LongType())
    table = catalog.load_table("ns.t")
    table.append(pa.table({"id": pa.array([3], pa.int64()), "n": pa.array([30], pa.int64())},
                          schema=table.schema().as_arrow()))
    with pytest.raises(NullValuesError, match=r"3 null\(s\) in column 'n'"):
        LakeDataset(IcebergSource("ns.t", catalog=catalog), columns=["id", "n"])
    ds = LakeDataset(IcebergSource("ns.t", catalog=catalog), columns=["id", "n"],
                     output="arrow", batch_size=10, shuffle=False)
    (batch,) = list(ds)
    assert isinstance(batch, pa.RecordBatch)
    assert sorted(zip(batch["id"].to_pylist(), batch["n"].to_pylist(), strict=True)) == [
        (0, None), (1, None), (2, None), (3, 30)]


def _every_type(tmp_path: Path) -> str:
    from deltalake import write_deltalake

    n = 23
    ids = list(range(n))
    table = pa.table({
        "id": pa.array(ids, pa.int64()),
        "st": pa.array([{"a": i, "b": f"s{i}"} if i % 5 else None for i in ids],
                       pa.struct([("a", pa.int32()), ("b", pa.string())])),
        "mp": pa.array([[("k", i)] if i % 3 else None for i in ids],
                       pa.map_(pa.string(), pa.int64())),
        "words": pa.array([[f"w{i}", None] if i % 2 else [] for i in ids],
                          pa.list_(pa.string())),
        "dec": pa.array([decimal.Decimal(f"{i}.25") if i % 4 else None for i in ids],
                        pa.decimal128(12, 2)),
        "flag": pa.array([bool(i % 2) if i % 7 else None for i in ids], pa.bool_()),
        "raw": pa.array([bytes([i]) for i in ids], pa.binary()),
    })
    uri = str(tmp_path / "types")
    write_deltalake(uri, table.slice(0, 11))
    write_deltalake(uri, table.slice(11), mode="append")
    return uri


@pytest.mark.parametrize("workers", [0, 2])
def test_arrow_output_gives_every_type_with_the_same_state_and_exact_resume(
        tmp_path: Path, workers: int) -> None:
    uri = _every_type(tmp_path)
    def dataset() -> LakeDataset:
        return LakeDataset(DeltaSource(uri), output="arrow", batch_size=4, seed=7)

    full = list(loader_for(dataset(), workers))
    assert all(isinstance(b, pa.RecordBatch) for b in full)
    whole = pa.Table.from_batches(full)
    assert not compare(whole, delta_references(uri, 1)[0])
    assert sorted(whole["id"].to_pylist()) == list(range(23))
    loader = loader_for(dataset(), workers)
    head = list(itertools.islice(loader, 3))
    resumed = loader_for(dataset(), workers)
    resumed.load_state_dict(loader.state_dict())
    rest = list(resumed)
    assert [b["id"].to_pylist() for b in head + rest] == [b["id"].to_pylist() for b in full]


def test_decimals_are_refused_in_torch_unless_float64_is_asked(tmp_path: Path) -> None:
    uri = _every_type(tmp_path)
    with pytest.raises(UnsupportedTableError, match=r"column 'dec' is decimal128\(12, 2\)"):
        LakeDataset(DeltaSource(uri), columns=["id", "dec"], nulls="fill")
    ds = LakeDataset(DeltaSource(uri), columns=["id", "dec"], nulls="mask",
                     decimals="float64", batch_size=23, shuffle=False)
    (batch,) = list(ds)
    got = dict(zip(batch["id"].tolist(), batch["dec"].tolist(), strict=True))
    nulls = dict(zip(batch["id"].tolist(), batch["dec__is_null"].tolist(), strict=True))
    assert got[5] == 5.25 and got[4] == 0.0 and nulls[4] and not nulls[5]


def test_null_booleans_are_refused_by_default_and_named(tmp_path: Path) -> None:
    uri = _every_type(tmp_path)
    with pytest.raises(NullValuesError, match=r"null\(s\) in column 'flag' \(bool\)"):
        LakeDataset(DeltaSource(uri), columns=["id", "flag"])


def test_struct_and_map_columns_read_like_deltalake_through_the_row_reader(
        tmp_path: Path) -> None:
    uri = _every_type(tmp_path)
    ours = read_all(DeltaSource(uri).snapshot())
    assert not compare(ours, delta_references(uri, 1)[0])


def test_the_null_check_uses_the_logs_statistics_without_opening_files(tmp_path: Path) -> None:
    uri = _nulls_table(tmp_path)
    DeltaSource(uri).snapshot()  # footers now cached: pinning reads no file again
    for data in Path(uri).glob("*.parquet"):  # unreadable now, same size
        data.write_bytes(b"\0" * data.stat().st_size)
    with pytest.raises(NullValuesError, match=r"2 null\(s\) in column 'label'"):
        LakeDataset(DeltaSource(uri), columns=["id", "label"])
