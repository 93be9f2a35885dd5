"""The tables ``lakeckpt bench read`` measures deletion vectors and partition columns on."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.tools.bench.tables import (
    FeatureTables,
    ensure_feature_tables,
    feature_figures,
    measure_feature_cost,
)

ROWS = 30_000


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> FeatureTables:
    return ensure_feature_tables(tmp_path_factory.mktemp("features"), ROWS)


def _ours(uri: str, columns: list[str]) -> list[tuple[object, ...]]:
    dataset = LakeDataset(DeltaSource(uri), columns=columns, batch_size=4096, shuffle=False)
    rows: list[tuple[object, ...]] = []
    for batch in dataset:
        rows.extend(zip(*(batch[c].tolist() for c in columns), strict=True))
    return rows


def _theirs(uri: str, columns: list[str]) -> list[tuple[object, ...]]:
    table = pa.table(DeltaTable(uri).scan())  # deltalake's own reader, deletion vectors applied
    return list(zip(*(table.column(c).to_pylist() for c in columns), strict=True))


def test_the_written_deletion_vectors_delete_one_percent_as_deltalake_reads_them(
        tables: FeatureTables) -> None:
    theirs = pa.table(DeltaTable(tables.deleted).scan())
    assert tables.deleted_rows == ROWS // 100 * 1  # 1% of each of the 2 files' 15,000 rows
    assert theirs.num_rows == ROWS - tables.deleted_rows == 29_700
    ids = theirs.column("id").to_pylist()
    assert len(set(ids)) == len(ids) and set(ids) < set(range(ROWS))
    assert Counter(_ours(tables.deleted, ["id", "x"])) == Counter(
        _theirs(tables.deleted, ["id", "x"]))


def test_the_partitioned_and_stored_tables_hold_the_plain_rows_with_one_day_per_file(
        tables: FeatureTables) -> None:
    plain = sorted(_ours(tables.plain, ["id", "x"]))
    assert [r[0] for r in plain] == list(range(ROWS))
    for uri in (tables.partitioned, tables.stored):
        rows = sorted(_ours(uri, ["id", "x", "day"]))
        assert [r[:2] for r in rows] == plain
        assert Counter(r[2] for r in rows) == {20_000: ROWS // 2, 20_001: ROWS // 2}
        assert Counter(rows) == Counter(_theirs(uri, ["id", "x", "day"]))
    assert DeltaTable(tables.partitioned).metadata().partition_columns == ["day"]
    assert DeltaTable(tables.stored).metadata().partition_columns == []


def test_the_tables_are_reused_on_a_second_call(tables: FeatureTables) -> None:
    again = ensure_feature_tables(Path(tables.plain).parent, ROWS)
    assert again == tables


def test_the_cost_figures_pair_every_read_with_the_plain_one(tables: FeatureTables) -> None:
    cost = measure_feature_cost(tables, batch_size=4096, rounds=2, min_seconds=0)
    assert cost.rounds == 2 and len(cost.dv_ratios) == 2 and len(cost.layer_dv_ratios) == 2
    assert (cost.rows, cost.deleted_rows) == (ROWS, 300)
    figures = {f.name: f for f in feature_figures(cost)}
    dv = figures["deletion vectors / plain read"]
    assert dv.value == cost.dv_ratio and dv.passed == (cost.dv_ratio >= 0.95)
    part = figures["partition column from the log / same column stored"]
    assert part.value == cost.partition_vs_stored and part.target == ">= 0.95x"
    data = cost.to_json()
    assert data["dv_cost"] == pytest.approx(1 - cost.dv_ratio)
    assert data["partition_cost"] == pytest.approx(1 - cost.partition_vs_stored)


def test_the_cli_measures_the_table_features_alone(tables: FeatureTables,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from lakeckpt_tables.cli import main

    code = main(["bench", "tables", "--rows", str(ROWS), "--dir",
                 str(Path(tables.plain).parent), "--rounds", "1", "--min-seconds", "0",
                 "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == (0 if data["passed"] else 1)
    assert data["tables"] == asdict(tables)  # the module's tables, reused
    assert data["table_features"]["rounds"] == 1
    assert [f["name"] for f in data["figures"] if f["target"]] == [
        "deletion vectors / plain read", "partition column from the log / same column stored"]
