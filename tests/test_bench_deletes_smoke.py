"""``lakeckpt bench deletes`` runs on small tables: its figures name both shapes, the pass
with deletes='honor' delivers every row as 'pin' does (interleaved_rounds checks the rows),
and a deletion of 1% of the rows is applied and counted per deleted row."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakeckpt_tables.tools.bench.deletes import format_report, run_deletes_bench


@pytest.mark.timeout(180)
def test_bench_deletes_reports_both_shapes_and_the_cost_per_deleted_row(tmp_path: Path) -> None:
    report = run_deletes_bench(rows=40_000, root=tmp_path, rounds=1)
    names = [f.name for f in report.figures]
    assert names == ["narrow: deletes='honor', no deletion / 'pin' (wall)",
                     "tokens: deletes='honor', no deletion / 'pin' (wall)",
                     "narrow: applying a deletion, per deleted row",
                     "tokens: applying a deletion, per deleted row"]
    assert report.deleted == {"narrow": 400, "tokens": 400}  # 1% of each file's rows
    assert all(len(r) == 1 and r[0] > 0 for r in report.ratios.values())
    assert all(ms > 0 for ms in report.apply_ms.values())
    assert "per deleted row" in format_report(report)
