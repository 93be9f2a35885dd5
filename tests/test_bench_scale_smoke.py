"""``lakeckpt bench scale --quick`` simulates a small job end to end and its figures add up."""

from __future__ import annotations

import pytest

from lakeckpt_tables.tools.bench.scale import QUICK, TARGETS, run_scale_bench


@pytest.mark.timeout(120)
def test_bench_scale_reports_every_figure_and_they_add_up() -> None:
    data = run_scale_bench(**{**QUICK, "saves": 2, "ledger_saves": 3}).to_json()
    assert set(data["met"]) == set(TARGETS)
    assert (data["ranks"], data["workers"], data["units"]) == (8, 2, 8_000)
    assert len(data["plan_s_each"]) == len(data["plan_mib_each"]) == 3  # first, middle, last
    assert data["plan_s"] == max(data["plan_s_each"]) > 0 and data["plan_mib"] > 0
    assert 0 < data["state_bytes_p50"] <= data["state_bytes_max"] < data["merged_state_bytes"]
    # a worker's state after the re-plan carries the layout of every old slice's rest
    assert data["replanned_state_bytes"] > data["state_bytes_max"]
    assert data["state_kib"] * 1024 == data["replanned_state_bytes"]
    assert len(data["commit_ms"]) == 2 and all(c > g > 0 for c, g in
                                                zip(data["commit_ms"], data["gather_ms"],
                                                    strict=True))
    assert data["commit_p50_ms"] <= data["commit_p99_ms"]
    # the slowest rank's sealing counts in the commit, beside the gather
    assert len(data["seal_ms"]) == 2 and all(
        c > g + s and s > 0 for c, g, s in zip(data["commit_ms"], data["gather_ms"],
                                               data["seal_ms"], strict=True))
    # 3 saves of 3 batches of 1,024 rows by each of 16 slices, every row accounted once
    assert data["consumed_rows"] == 16 * 3 * 3 * 1024 == data["recorded_rows"]
    assert data["records_per_save"] >= 16  # at least a record per slice
    # the re-planned round of the smaller world holds exactly the rows not consumed
    assert data["restore_rows"] == data["rows"] - data["consumed_rows"]
    assert len(data["restore_s_each"]) == 2 and data["restore_s"] > 0
    assert data["ledger_saves"] == 3 and data["ledger_bytes"] > 0 and data["ledger_files"] > 3
    assert data["ledger_bytes_at_goal"] == int(data["ledger_bytes"] / 3 * 10_000)


@pytest.mark.timeout(120)
def test_bench_scale_commits_to_an_iceberg_ledger_too() -> None:
    data = run_scale_bench(**{**QUICK, "saves": 2, "ledger_saves": 3},
                           ledger_format="iceberg").to_json()
    assert data["ledger_format"] == "iceberg"
    # every row consumed was recorded; the restore read the last checkpoint back from the ledger
    assert data["consumed_rows"] == 16 * 3 * 3 * 1024 == data["recorded_rows"]
    assert data["restore_rows"] == data["rows"] - data["consumed_rows"]
    assert len(data["commit_ms"]) == 2 and data["ledger_bytes"] > 0
