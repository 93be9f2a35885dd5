"""``lakeckpt bench audit`` runs end to end at a small size and reports its four figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakeckpt_tables.tools.bench.audit import run_audit_bench


@pytest.mark.timeout(180)
def test_bench_audit_builds_maintains_and_times_a_ledger(tmp_path: Path) -> None:
    report = run_audit_bench(checkpoints=200, root=str(tmp_path))
    figures = report.to_json()
    assert (figures["checkpoints"], figures["records"]) == (200, 64)
    assert figures["ledger_rows"] == 200 * 65
    assert set(figures) >= {"maintain_s", "progress_s", "verify_s", "commit_p50_ms", "passed"}
    assert figures["commit_p50_ms"] > 0 and figures["verify_s"] > 0
