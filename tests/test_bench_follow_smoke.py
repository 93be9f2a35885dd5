"""``lakeckpt bench follow`` end to end at tiny sizes: structure and correctness, not timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltalake import DeltaTable

from lakeckpt_tables.cli import main
from lakeckpt_tables.tools.bench.follow import (
    ensure_backlog_table,
    format_report,
    measure_latency,
    measure_segment_cost,
    run_follow_bench,
)


@pytest.mark.parametrize("workers", [0, 1])
def test_latency_counts_every_appended_row_once(tmp_path: Path, workers: int) -> None:
    result = measure_latency(tmp_path, workers=workers, commits=3, interval=0.02,
                             poll_interval=0.01)
    assert result.exactly_once and result.delivered == 3 and result.duplicates == 0
    assert len(result.latency_ms) == len(result.from_write_ms) == len(result.write_ms) == 3
    assert all(w > 0 for w in result.write_ms)
    assert result.mode == ("in-process" if workers == 0 else "DataLoader, 1 worker(s)")


def test_the_backlog_table_is_built_resumed_and_reused(tmp_path: Path) -> None:
    first = ensure_backlog_table(tmp_path, 30)
    assert not first.reused and DeltaTable(first.uri).version() == 30
    log = Path(first.uri) / "_delta_log"
    for version in range(26, 31):  # an interrupted build: the last commits are missing
        (log / f"{version:020d}.json").unlink()
    resumed = ensure_backlog_table(tmp_path, 30)
    assert not resumed.reused and DeltaTable(resumed.uri).version() == 30
    again = ensure_backlog_table(tmp_path, 30)
    assert again.reused and again.uri == first.uri
    ids = DeltaTable(again.uri).to_pyarrow_table(columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == list(range(31))


def test_one_segment_spans_the_whole_backlog(tmp_path: Path) -> None:
    table = ensure_backlog_table(tmp_path, 25)
    result = measure_segment_cost(table, rounds=1)
    assert result.verified and result.rows == 25 and result.commits == 25
    assert len(result.first_batch_s) == len(result.scan_s) == 1
    assert result.per_commit_ms > 0


def test_run_follow_bench_reports_every_figure(tmp_path: Path) -> None:
    report = run_follow_bench(root=tmp_path, backlog=20, workers=(0,), segment_rounds=1,
                              commits=3, interval=0.02, poll_interval=0.01)
    data = report.to_json()
    assert json.loads(json.dumps(data)) == data  # JSON-clean
    assert data["passed"] and data["backlog"]["commits"] == 20
    assert [r["mode"] for r in data["latency"]] == ["in-process"]
    names = [f["name"] for f in data["figures"]]
    assert "append -> batch p50, in-process" in names
    assert "append -> batch p99, in-process" in names
    assert "segment over 20 commits: first batch" in names
    assert {f["verdict"] for f in data["figures"] if f["target"]} == {"PASS"}
    text = format_report(report)
    assert "append -> batch p99, in-process" in text and "exactly once" in text


def test_the_cli_prints_the_report_as_json(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "follow", "--commits", "3", "--interval", "0.02", "--poll-interval",
                 "0.01", "--backlog", "20", "--dir", str(tmp_path), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["passed"]
    assert [r["workers"] for r in data["latency"]] == [0, 1]
    assert data["segment"]["rows"] == 20
