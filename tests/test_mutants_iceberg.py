"""Iceberg null checks by field id that an injected bug showed no other test held (issue 8,
"the suite as proof"): a real pyiceberg table on local disk."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from conftest import sql_catalog

from lakeckpt_tables import IcebergSource, LakeDataset
from lakeckpt_tables.errors import NullValuesError


def test_footer_null_counts_are_read_by_field_id_after_two_columns_swap_names(
        tmp_path: Path) -> None:
    # Metrics mode "none": the manifest holds no null counts, so the footer's statistics
    # decide. After a swap of names, the file's column "a" is the table's "b": counting the
    # footer by name refuses the column without nulls and lets the one with nulls through.
    catalog = sql_catalog(tmp_path)
    catalog.create_namespace("db")
    schema = pa.schema([pa.field("a", pa.int32()), pa.field("b", pa.int32())])
    table = catalog.create_table("db.t", schema=schema,
                                 properties={"write.metadata.metrics.default": "none"})
    table.append(pa.table({"a": pa.array([1, None, 3], pa.int32()),
                           "b": pa.array([4, 5, 6], pa.int32())}, schema=schema))
    with table.update_schema() as update:
        update.rename_column("a", "tmp")
    with table.update_schema() as update:
        update.rename_column("b", "a")
    with table.update_schema() as update:
        update.rename_column("tmp", "b")
    swapped = pa.schema([pa.field("b", pa.int32()), pa.field("a", pa.int32())])
    table.append(pa.table({"b": pa.array([7, 8], pa.int32()), "a": pa.array([9, 10], pa.int32())},
                          schema=swapped))  # a snapshot of the swapped schema
    source = IcebergSource("db.t", catalog=catalog)
    dataset = LakeDataset(source, columns=["a"], batch_size=5, shuffle=False)
    assert sorted(i for batch in dataset for i in batch["a"].tolist()) == [4, 5, 6, 9, 10]
    with pytest.raises(NullValuesError, match=r"1 null\(s\) in column 'b'"):
        LakeDataset(IcebergSource("db.t", catalog=catalog), columns=["b"])
