"""``lakeckpt bench read --uri`` and ``bench planning``: their figures on the local S3 server."""

from __future__ import annotations

import json
from pathlib import Path

import _s3server
import pytest
from _s3server import S3Server

from lakeckpt_tables import DeltaSource
from lakeckpt_tables.cli import main
from lakeckpt_tables.sources import footers
from lakeckpt_tables.tools.bench.planning import TARGET_REMOTE_S, TARGET_S
from lakeckpt_tables.tools.bench.storage import format_report, run_store_read_bench

s3 = _s3server.s3  # the fixture of the module


def test_the_object_store_bench_counts_one_get_per_row_group_and_one_footer_per_file(
        s3: S3Server) -> None:
    uri = f"s3://{s3.bucket('bench')}/table"
    report = run_store_read_bench(uri, s3.options(), rows=40_000, rounds=1)
    assert report.rows == 40_000 and report.files == 4 and report.row_groups == 4
    assert report.requests_per_row_group == 1.0  # id and x: one coalesced range
    assert report.heads_per_file == 0.0  # the files opened for their footers are reused
    assert (report.footer_reads_first, report.footer_reads_again) == (4, 0)
    assert "requests per row group read  1.00" in format_report(report)


def test_the_object_store_bench_pairs_rounds_and_counts_requests_in_flight_with_latency(
        s3: S3Server) -> None:
    uri = f"s3://{s3.bucket('latency')}/table"
    report = run_store_read_bench(uri, s3.options(), rows=40_000, rounds=2, latency_ms=30)
    assert len(report.ratios) == len(report.latency_ratios) == 2
    assert report.latency_ratio is not None and report.in_flight_mean is not None
    assert report.in_flight_peak == report.row_groups == 4  # all four fetched at once
    text = format_report(report)
    assert "median of 2 paired rounds" in text and "requests in flight then" in text
    s3.reset()
    assert s3._control("faults")["faults"]["latency_ms"] == 0  # the latency is taken off


def test_the_cli_runs_the_object_store_bench(s3: S3Server,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"s3://{s3.bucket('cli')}/table"
    code = main(["bench", "read", "--uri", uri, "--rows", "20000", "--rounds", "1", "--json",
                 "--storage-options", json.dumps(s3.options())])
    out = json.loads(capsys.readouterr().out)
    assert out["uri"] == uri and out["rows"] == 20_000 and out["requests_per_row_group"] == 1.0
    assert code == (0 if out["passed"] else 1)
    assert s3.secret not in json.dumps(out)


def test_the_planning_bench_pins_a_table_of_many_files_locally_and_on_s3(
        s3: S3Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"s3://{s3.bucket('planning')}/many"
    code = main(["bench", "planning", "--files", "60", "--dir", str(tmp_path), "--uri", uri,
                 "--storage-options", json.dumps(s3.options()), "--row-groups", "--json"])
    out = json.loads(capsys.readouterr().out)
    local, remote = out["figures"]
    assert (local["uri"], remote["uri"]) == (str(tmp_path / "many"), uri)
    assert local["files"] == remote["files"] == 60
    assert local["footer_reads"] == remote["footer_reads"] == 0  # whole files: the log's counts
    assert local["footer_reads_row_groups"] == remote["footer_reads_row_groups"] == 60
    assert (local["target_s"], remote["target_s"]) == (TARGET_S, TARGET_REMOTE_S)
    assert code == (0 if out["passed"] else 1)
    assert s3.secret not in json.dumps(out)
    footers.forget()
    s3.reset()
    s3.faults(latency_ms=100)  # requests overlap for sure only when each one takes a while
    try:
        assert len(DeltaSource(uri, storage_options=s3.options()).snapshot().units) == 60
    finally:
        s3.faults()
    assert s3.peak() >= 8  # the footers are read in parallel
