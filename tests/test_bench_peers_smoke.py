"""``lakeckpt bench peers`` on a tiny table: every peer reads every row, the report is whole.

The figures themselves come from the benchmark, not from tests; these tests prove that the
loaders being compared read the same rows and that the naive skip-ahead peer resumes exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lakeckpt_tables.bench.peers import (
    PlainParquetDataset,
    ensure_token_table,
    format_peers,
    hf_available,
    raw_batches,
    run_peers_bench,
)

ROWS = 6_000


@pytest.fixture(scope="module")
def token_table(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    return ensure_token_table(tmp_path_factory.mktemp("peers"), ROWS)


def test_token_table_has_every_id_once_and_is_reused(token_table, tmp_path: Path) -> None:
    uri, files = token_table
    ids = [int(i) for f in files for b in raw_batches([(f, 0)], 10_000) for i in b["id"]]
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
                             workers=(0,))
    expected = {"raw", "plain@0", "library@0"} | ({"hf@0"} if hf_available() else set())
    assert set(report.throughput) == expected
    assert all(v > 0 for v in report.throughput.values())
    peers = {"library", "naive-skip"} | ({"hf"} if hf_available() else set())
    assert set(report.resume_s) == {f"{p}@{f}" for p in peers for f in ("0%", "50%", "90%")}
    assert report.ratios()["library/plain, 0 workers"] is not None
    text = format_peers(report)
    assert "| library | 0 |" in text and "library/plain, 0 workers" in text
