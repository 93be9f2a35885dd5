"""``lakeckpt bench peers`` and ``bench workers`` on tiny tables: every loop reads every row,
the reports are whole and name their table's shape.

The figures themselves come from the benchmarks, not from tests; these tests prove that the
loops being compared read the same rows and that the naive skip-ahead peer resumes exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lakeckpt_tables.cli import main
from lakeckpt_tables.tools.bench.peers import (
    PlainParquetDataset,
    format_peers,
    hf_available,
    run_peers_bench,
)
from lakeckpt_tables.tools.bench.raw import raw_batches, units_of
from lakeckpt_tables.tools.bench.shapes import SHAPES, ShapeTable, ensure_shape_table
from lakeckpt_tables.tools.bench.workers import format_workers, run_workers_bench

ROWS = 6_000


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("peers")


@pytest.fixture(scope="module")
def tables(root: Path) -> dict[str, ShapeTable]:
    return {shape: ensure_shape_table(root, shape, ROWS, files=2, row_groups=6)
            for shape in SHAPES}


def test_each_shape_has_every_id_once_and_is_reused(root: Path, tables) -> None:
    for shape, table in tables.items():
        batches = list(raw_batches(units_of(table.files), table.columns, 1000))
        assert sorted(int(i) for b in batches for i in b["id"]) == list(range(ROWS))
        assert (len(table.files), table.row_groups) == (2, 6)
        assert ensure_shape_table(root, shape, ROWS, files=2, row_groups=6) == table
        assert table.describe().startswith(f"{shape} table (id int64")
    tokens = next(iter(raw_batches(units_of(tables["tokens"].files), SHAPES["tokens"], 10)))
    assert sorted(tokens) == ["id", "tokens_offsets", "tokens_values", "x"]
    assert int(tokens["tokens_offsets"][-1]) == len(tokens["tokens_values"])
    with pytest.raises(ValueError, match="unknown table shape 'wide'"):
        ensure_shape_table(root, "wide", ROWS)


def test_naive_skip_ahead_resumes_at_the_exact_row(tables) -> None:
    table = tables["tokens"]
    full = [int(i) for b in PlainParquetDataset(table.files, table.columns, 128)
            for i in b["id"]]
    resumed = PlainParquetDataset(table.files, table.columns, 128)
    resumed.load_state_dict({"delivered": 1000})
    assert [int(i) for b in resumed for i in b["id"]] == full[1000:]


@pytest.mark.timeout(300)
def test_peers_report_covers_every_loop_ratio_and_resume_point_of_both_shapes(root) -> None:
    report = run_peers_bench(root, rows=ROWS, files=2, row_groups=6, batch_size=256,
                             rounds=2, workers=(0,))
    hf = {"hf@0"} if hf_available() else set()
    for shape in SHAPES:
        result = report.shapes[shape]
        assert set(result.passes) == {"raw", "plain@0", "library@0", "inline@0", "shuffled@0",
                                      "deleted@0"} | hf
        assert all(len(p) == 2 and all(t.wall_s > 0 for t in p)
                   for p in result.passes.values())
        assert {t.rows for name, p in result.passes.items() for t in p
                if name != "deleted@0"} == {ROWS}
        live = {t.rows for t in result.passes["deleted@0"]}  # 1% of each file deleted
        assert len(live) == 1 and ROWS * 0.98 < live.pop() < ROWS
        peers = {"library", "naive-skip"} | ({"hf"} if hf else set())
        assert set(result.resume_s) == {f"{p}@{f}" for p in peers for f in ("0%", "50%", "90%")}
    ratios = report.ratios()
    assert ratios["narrow: library / plain loader, 0 workers"] is not None
    assert ratios["tokens: library / raw read, 0 workers"] is not None
    assert ratios["tokens: library shuffle on / off, 0 workers"] is not None
    assert ratios["tokens: deletion vectors / none, 0 workers"] is not None
    assert ratios["narrow: read-ahead / read_ahead=0, 0 workers"] is not None
    assert (ratios["tokens: library / HF datasets, 0 workers"] is None) is not hf
    text = format_peers(report)
    assert "narrow table (id int64, x/y/z float32): 6,000 rows, 2 files, 6 row groups" in text
    assert "| library / plain loader, 0 workers |" in text
    data = json.loads(json.dumps(report.to_json()))
    assert data["bench"] == "peers" and data["ratios"] == ratios


@pytest.mark.timeout(120)
def test_the_workers_bench_prints_the_grid_and_the_per_batch_costs(root) -> None:
    report = run_workers_bench(root, shape="narrow", rows=ROWS, files=2, row_groups=6,
                               workers=(0, 2), batch_sizes=(512,), rounds=1)
    assert set(report.passes) == {"raw@512", "library 0@512", "library 2@512", "chunked 2@512"}
    costs = report.costs[512]
    assert costs.decode_us > 0 and costs.library_us > 0 and costs.copy_us > 0
    assert set(costs.handoff_us) == set(costs.chunked_handoff_us) == {2}
    assert costs.model(0, 2) == 1.0 and costs.model(2, 2) > 0
    assert set(report.ratios()) == {"batch 512: library 0 workers / raw read",
                                    "batch 512: library 2 workers / raw read",
                                    "batch 512: library 2 workers / 0 workers",
                                    "batch 512: chunked 2 workers / library 0 workers"}
    text = format_workers(report)
    assert text.startswith("narrow table (id int64, x/y/z float32): 6,000 rows")
    row = next(line for line in text.splitlines() if line.startswith("| 512 | ") and
               line.count("|") == 8)
    assert row.endswith("x |")  # decode, library, copy, hand-off 2w, model 2w, measured 2w
    assert json.loads(json.dumps(report.to_json()))["costs_us"]["512"]["model"]["2"] > 0


@pytest.mark.timeout(120)
def test_the_cli_writes_a_report_that_bench_compare_reads(
        root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "peers", "--rows", str(ROWS), "--files", "2", "--row-groups", "6",
                 "--shapes", "narrow", "--rounds", "1", "--no-resume", "--dir", str(root),
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bench"] == "peers" and "narrow table" in report["shape"]
    (tmp_path / "new.json").write_text(json.dumps(report))
    assert main(["bench", "compare", str(tmp_path / "new.json"), "--baseline",
                 str(tmp_path / "new.json")]) == 0
    assert "no ratio fell" in capsys.readouterr().out
    assert main(["bench", "workers", "--shape", "narrow", "--rows", str(ROWS), "--files", "2",
                 "--row-groups", "6", "--workers", "0", "--batch-sizes", "512,2048", "--rounds",
                 "1", "--no-chunked", "--dir", str(root), "--json"]) == 0
    workers = json.loads(capsys.readouterr().out)
    assert workers["bench"] == "workers" and sorted(workers["costs_us"]) == ["2048", "512"]
    with pytest.raises(SystemExit):
        main(["bench", "workers", "--workers", "0,-2"])
    assert "expected comma-separated counts >= 0, got '0,-2'" in capsys.readouterr().err
