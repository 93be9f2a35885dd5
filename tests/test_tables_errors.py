"""A table the library cannot read, or a source named wrongly, is a named error that names the
cause: malformed identifiers and paths, malformed Iceberg metadata (name mapping, metadata
file), relative data-file locations resolved as pyiceberg resolves them or named as relative."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conformance import compare, read_all
from conftest import sql_catalog

from lakeckpt_tables import DeltaSource, IcebergSource
from lakeckpt_tables.errors import (
    PinnedFileMissingError,
    SourceArgumentError,
    SourceNotFoundError,
    TableMetadataError,
)


@pytest.mark.parametrize("identifier", ["tokens", "", "ns.", ".t", ("tokens",), (), 42, None,
                                        ("ns", "")])
def test_a_malformed_iceberg_identifier_names_the_expected_form(tmp_path: Path,
                                                                identifier: Any) -> None:
    with pytest.raises(SourceArgumentError, match=r"'namespace\.table'"):
        IcebergSource(identifier, catalog=sql_catalog(tmp_path))


def test_a_well_formed_identifier_of_no_table_is_not_found(tmp_path: Path) -> None:
    for identifier in ("ns.t", ("ns", "t"), "a.b.t"):
        with pytest.raises(SourceNotFoundError, match="no Iceberg table"):
            IcebergSource(identifier, catalog=sql_catalog(tmp_path)).snapshot()


@pytest.mark.parametrize("uri", [None, 42, "", "  ", ["t"]])
def test_a_delta_source_without_a_path_names_what_it_needs(uri: Any) -> None:
    with pytest.raises(SourceArgumentError, match=r"root directory.*IcebergSource"):
        DeltaSource(uri)


def _table(tmp_path: Path) -> tuple[Any, Any]:
    catalog = sql_catalog(tmp_path)
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", schema=pa.schema([pa.field("id", pa.int64())]))
    table.append(pa.table({"id": pa.array(range(5), pa.int64())}))
    return catalog, table


def test_a_name_mapping_not_in_the_specs_shape_is_named_with_table_and_property(
        tmp_path: Path) -> None:
    catalog, table = _table(tmp_path)
    with table.transaction() as tx:
        tx.set_properties({"schema.name-mapping.default": '{"field-id": 1, "names": "id"}'})
    with pytest.raises(TableMetadataError, match=r"schema\.name-mapping\.default") as info:
        IcebergSource("ns.t", catalog=catalog).snapshot()
    assert "at snapshot" in str(info.value) and "iceberg table" in str(info.value)


def test_a_metadata_file_pyiceberg_cannot_parse_is_named(tmp_path: Path) -> None:
    catalog, table = _table(tmp_path)
    metadata = Path(table.metadata_location.removeprefix("file://"))
    metadata.write_text('{"format-version": 2, "table-uuid": "not a uuid"}')
    with pytest.raises(TableMetadataError, match=r"ns\.t.*cannot read its metadata"):
        IcebergSource("ns.t", catalog=catalog).snapshot()
    metadata.unlink()
    with pytest.raises(SourceNotFoundError, match="metadata file is gone"):
        IcebergSource("ns.t", catalog=catalog).snapshot()


def _relative_table(tmp_path: Path) -> Any:
    """A table whose data file location is relative to ``tmp_path`` (as DuckDB's test data
    writes them)."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    catalog = sql_catalog(tmp_path)
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.rel", schema=pa.schema([pa.field("id", pa.int64())]))
    (tmp_path / "rel").mkdir()
    field = pa.field("id", pa.int64(), metadata={b"PARQUET:field_id": b"1"})
    pq.write_table(pa.table({"id": pa.array(range(7), pa.int64())},
                            schema=pa.schema([field])), str(tmp_path / "rel" / "d.parquet"))
    data_file = DataFile.from_args(
        content=DataFileContent.DATA, file_path="rel/d.parquet", file_format=FileFormat.PARQUET,
        partition={}, record_count=7,
        file_size_in_bytes=(tmp_path / "rel" / "d.parquet").stat().st_size)
    data_file.spec_id = table.metadata.default_spec_id
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        append.append_data_file(data_file)
    return catalog


def test_relative_data_file_locations_resolve_against_the_cwd_as_pyiceberg_resolves_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = _relative_table(tmp_path)
    monkeypatch.chdir(tmp_path)
    reference = catalog.load_table("ns.rel").scan().to_arrow()
    snapshot = IcebergSource("ns.rel", catalog=catalog).snapshot()
    assert not compare(read_all(snapshot), reference)
    assert snapshot.units[0].path == str(tmp_path / "rel" / "d.parquet")  # absolute once pinned
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(TableMetadataError, match=r"'rel/d\.parquet'.*relative") as info:
        IcebergSource("ns.rel", catalog=catalog).snapshot()
    assert not isinstance(info.value, PinnedFileMissingError) and "gone" not in str(info.value)
    assert os.getcwd() in str(info.value)


def test_a_delta_version_whose_log_deltalake_cannot_parse_is_named_not_missing(
        tmp_path: Path) -> None:
    from deltalake import write_deltalake

    for lo in (0, 3):
        write_deltalake(str(tmp_path), pa.table({"id": pa.array(range(lo, lo + 3), pa.int64())}),
                        mode="append")
    (tmp_path / "_delta_log" / f"{1:020d}.json").write_text('{"add": {"path": 5}}\n')
    for version in (1, None):
        with pytest.raises(TableMetadataError, match="cannot load its log") as info:
            DeltaSource(str(tmp_path)).snapshot(version)
        assert not isinstance(info.value, SourceNotFoundError)
        assert "<unknown>" not in str(info.value)  # the kernel's Rust backtrace is cut
        assert (version is None) or "at version 1" in str(info.value)
    assert DeltaSource(str(tmp_path)).snapshot(0).rows == 3
