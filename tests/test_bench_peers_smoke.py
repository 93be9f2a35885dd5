"""``lakeckpt bench peers`` on a tiny table: every peer reads every row, the report is whole.

The figures themselves come from the benchmark, not from tests; these tests prove that the
loaders being compared read the same rows and that the naive skip-ahead peer resumes exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lakeckpt_tables.tools.bench.data import ensure_token_table
from lakeckpt_tables.tools.bench.peers import (
    PlainParquetDataset,
    format_peers,
    hf_available,
    run_peers_bench,
    write_json,
)
from lakeckpt_tables.tools.bench.raw import raw_batches

ROWS = 6_000


@pytest.fixture(scope="module")
def token_table(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    return ensure_token_table(tmp_path_factory.mktemp("peers"), ROWS)


def test_token_table_has_every_id_once_and_is_reused(token_table, tmp_path: Path) -> None:
    uri, files = token_table
    ids = [int(i) for f in files for b in raw_batches([(f, 0)], ["id"], 10_000) for i in b["id"]]
    assert sorted(ids) == list(range(ROWS))
    assert ensure_token_table(Path(uri).parent, ROWS) == (uri, files)


def test_naive_skip_ahead_resumes_at_the_exact_row(token_table) -> None:
    _, files = token_table
    full = [int(i) for b in PlainParquetDataset(files, 128) for i in b["id"]]
    resumed = PlainParquetDataset(files, 128)
    resumed.load_state_dict({"delivered": 1000})
    rest = [int(i) for b in resumed for i in b["id"]]
    assert rest == full[1000:]


@pytest.mark.timeout(300)
def test_peers_report_covers_every_loader_and_resume_point(token_table) -> None:
    uri, _ = token_table
    report = run_peers_bench(Path(uri).parent, rows=ROWS, batch_size=256, rounds=1,
                             workers=(0,), grid_batch_sizes=())
    assert report.grid is None
    expected = {"raw", "plain@0", "library@0"} | ({"hf@0"} if hf_available() else set())
    assert set(report.throughput) == expected
    assert all(v > 0 for v in report.throughput.values())
    peers = {"library", "naive-skip"} | ({"hf"} if hf_available() else set())
    assert set(report.resume_s) == {f"{p}@{f}" for p in peers for f in ("0%", "50%", "90%")}
    assert report.ratios()["library/plain, 0 workers"] is not None
    text = format_peers(report)
    assert "| library | 0 |" in text and "library/plain, 0 workers" in text


@pytest.mark.timeout(120)
def test_chunked_loader_runs_beside_the_per_batch_loader_across_batch_sizes(
    token_table, tmp_path: Path,
) -> None:
    uri, _ = token_table
    report = run_peers_bench(Path(uri).parent, rows=ROWS, batch_size=512, rounds=1,
                             workers=(0, 2), grid_batch_sizes=(256, 2048))
    # every pass delivered every row (a short pass raises), ChunkedLoader only with workers
    assert {"library@0", "library@2", "chunked@2"} <= set(report.throughput)
    assert "chunked@0" not in report.throughput
    grid = report.grid
    assert grid is not None and grid.rows == ROWS
    assert sorted(grid.library) == ["0@2048", "0@256", "2@2048", "2@256"]
    assert sorted(grid.chunked) == ["2@2048", "2@256"]
    assert grid.chunked_speedup(2, 256) == grid.chunked["2@256"] / grid.library["0@256"]
    text = format_peers(report)
    assert ("| batch | raw | 0 workers | 2 workers, per batch | 2 workers, chunked "
            "| chunked 2 / 0 workers |") in text
    assert "| chunked | 2 |" in text and "chunked 2 workers / library 0 workers" in text
    write_json(report, tmp_path / "peers.json")
    data = json.loads((tmp_path / "peers.json").read_text())
    assert sorted(data["grid"]["chunked_over_0_workers"]) == ["2@2048", "2@256"]


@pytest.mark.timeout(120)
def test_the_worker_grid_runs_alone_from_the_command_line(
    token_table, capsys: pytest.CaptureFixture[str],
) -> None:
    from lakeckpt_tables.tools.bench.workers import main

    uri, _ = token_table
    assert main(["--rows", str(ROWS), "--rounds", "1", "--batch-sizes", "512,3000",
                 "--dir", str(Path(uri).parent)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("| 512 |", "| 3000 |"))]
    assert len(rows) == 2 and all(line.count("|") == 7 and line.endswith("x |") for line in rows)
    assert f"whole passes of {ROWS:,} rows" in out
