"""Batches hold the table's values as torch types: numeric columns zero-copy, fixed-length lists
as 2-D tensors, variable-length lists as Ragged (values, offsets), strings as lists of str."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from conftest import Table, loader_for, rows_table
from deltalake import write_deltalake

from lakeckpt_tables import DeltaSource, LakeDataset, Ragged
from lakeckpt_tables.errors import UnsupportedTableError
from lakeckpt_tables.reader.convert import to_tensors

ALL = ["id", "x", "vec", "tokens", "name"]


def batches(table: Table, workers: int = 0, **kwargs: Any) -> list[dict[str, Any]]:
    args = {"columns": ALL, "batch_size": 24, "seed": 6, **kwargs}
    return list(loader_for(table.dataset(**args), workers))


def tokens_of(i: int) -> list[int]:
    return list(range(i, i + i % 4))  # as rows_table writes them: 0 to 3 tokens


@pytest.mark.parametrize("workers", [0, 2])
def test_numeric_columns_are_tensors_of_the_column_type(source: Table, workers: int) -> None:
    seen = []
    for batch in batches(source, workers):
        assert list(batch) == ALL
        ids, x = batch["id"], batch["x"]
        assert ids.dtype == torch.int64 and x.dtype == torch.float64
        assert ids.shape == x.shape == (len(batch["name"]),)
        assert torch.equal(x, ids.to(torch.float64) * 0.5)
        seen.extend(ids.tolist())
    assert sorted(seen) == source.ids.tolist()


def test_numeric_columns_reach_torch_without_a_copy() -> None:
    table = rows_table(0, 100)
    tensors = to_tensors(table.select(["id", "x"]))
    for name in ("id", "x"):
        values = table.column(name).chunk(0).buffers()[1]
        assert tensors[name].data_ptr() == values.address, f"{name} was copied"
    sliced = to_tensors(table.slice(10, 20).select(["id"]))["id"]
    assert sliced.tolist() == list(range(10, 30))
    assert sliced.data_ptr() == table.column("id").chunk(0).buffers()[1].address + 10 * 8


def test_a_fixed_length_list_column_is_a_2d_tensor(source: Table) -> None:
    for batch in batches(source):
        vec, ids = batch["vec"], batch["id"]
        assert isinstance(vec, torch.Tensor) and vec.dtype == torch.float32
        assert vec.shape == (len(ids), 3)
        expected = ids.to(torch.float32)[:, None] + torch.tensor([0.0, 0.25, 0.5])
        assert torch.equal(vec, expected)


def test_a_variable_length_list_column_is_ragged_values_and_offsets(source: Table) -> None:
    ragged = 0
    for batch in batches(source):
        ids = batch["id"].tolist()
        tokens = batch["tokens"]
        if isinstance(tokens, Ragged):
            ragged += 1
            values, offsets = tokens
            assert offsets.dtype == torch.int64 and len(offsets) == len(ids) + 1
            assert offsets[0] == 0 and offsets[-1] == len(values)
            rows = [values[offsets[i]:offsets[i + 1]].tolist() for i in range(len(ids))]
        else:  # every row of this batch happens to hold as many tokens
            assert tokens.dim() == 2 and tokens.shape[0] == len(ids)
            rows = tokens.tolist()
        assert rows == [tokens_of(i) for i in ids]
    assert ragged > 0


def test_a_list_column_with_equal_lengths_in_a_batch_comes_back_2d() -> None:
    table = pa.table({"t": pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.int64()))})
    assert torch.equal(to_tensors(table)["t"], torch.tensor([[1, 2], [3, 4], [5, 6]]))
    sliced = to_tensors(pa.table({"t": pa.array([[9], [1, 2], [3, 4, 5]],
                                                 pa.list_(pa.int64()))}).slice(1, 2))["t"]
    assert isinstance(sliced, Ragged)
    assert sliced.values.tolist() == [1, 2, 3, 4, 5] and sliced.offsets.tolist() == [0, 2, 5]


def test_string_columns_are_lists_of_str(source: Table) -> None:
    for batch in batches(source):
        assert batch["name"] == [f"row-{i}" for i in batch["id"].tolist()]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_transform_is_applied_to_every_batch(source: Table, workers: int) -> None:
    def transform(batch: dict[str, Any]) -> dict[str, Any]:
        return {"id": batch["id"], "twice": batch["x"] * 2, "n": len(batch["name"])}

    got = batches(source, workers, transform=transform)
    assert all(set(b) == {"id", "twice", "n"} for b in got)
    for b in got:
        assert torch.equal(b["twice"], b["id"].to(torch.float64))
        assert b["n"] == len(b["id"])
    assert sorted(i for b in got for i in b["id"].tolist()) == source.ids.tolist()


def test_columns_come_in_the_order_asked_and_only_those(source: Table) -> None:
    for batch in batches(source, columns=["name", "id"]):
        assert list(batch) == ["name", "id"]


def test_null_floats_become_nan_and_null_ints_are_refused_naming_the_column(
    tmp_path: Path,
) -> None:
    uri = str(tmp_path / "nulls")
    write_deltalake(uri, pa.table({
        "id": pa.array(np.arange(6), pa.int64()),
        "score": pa.array([1.0, None, 3.0, None, 5.0, 6.0], pa.float64()),
        "label": pa.array([1, 2, None, 4, 5, 6], pa.int32()),
    }))
    source = DeltaSource(uri)
    got = list(LakeDataset(source, columns=["id", "score"], batch_size=6, shuffle=False))
    assert np.isnan(got[0]["score"].numpy()).tolist() == [False, True, False, True, False,
                                                         False]
    with pytest.raises(UnsupportedTableError, match=r"column 'label'.*null"):
        list(LakeDataset(source, columns=["id", "label"], batch_size=6))
