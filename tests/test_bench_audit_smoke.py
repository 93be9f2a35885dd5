"""``lakeckpt bench audit`` runs end to end at a small size and reports its figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakeckpt_tables.tools.bench.audit import run_audit_bench


@pytest.mark.timeout(180)
def test_bench_audit_builds_maintains_and_times_a_ledger(tmp_path: Path) -> None:
    report = run_audit_bench(checkpoints=200, root=str(tmp_path), cli=False, commits=5)
    figures = report.to_json()
    assert (figures["checkpoints"], figures["records"]) == (200, 64)
    assert figures["ledger_rows"] == 200 * 65
    assert set(figures) >= {"maintain_s", "progress_s", "verify_s", "commit_p50_ms", "passed"}
    assert figures["commit_p50_ms"] > 0 and figures["verify_s"] > 0


@pytest.mark.timeout(180)
def test_bench_audit_times_the_cli_on_an_iceberg_ledger(tmp_path: Path) -> None:
    report = run_audit_bench(checkpoints=20, records=10, ledger="iceberg", batch=10,
                             root=str(tmp_path), commits=3)
    figures = report.to_json()
    assert figures["ledger"] == "iceberg" and figures["ledger_rows"] == 20 * 11
    assert figures["files_before"] == 10  # 10 runs of 2 checkpoints, one commit each
    commands = figures["commands"]
    assert set(commands) == {"progress_before", "maintain", "progress", "verify"}
    for name, command in commands.items():
        assert command["wall_s"] > 0 and command["cpu_s"] > 0, name
        # the child's own peak: a Python with pyarrow is tens of MB, not the bench's
        assert 30 < command["peak_mb"] < 2048, name
