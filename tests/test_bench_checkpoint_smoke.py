"""``lakeckpt bench checkpoint`` on tiny inputs: structure and sanity, not timings."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from lakeckpt_tables.sources.delta import DeltaSource
from lakeckpt_tables.tools.bench import cli as bench_cli
from lakeckpt_tables.tools.bench.checkpoint import (
    COMMIT_TARGET_MS,
    CommitResult,
    OverheadResult,
    build_report,
    ensure_commit_table,
    format_report,
    measure_commit,
    measure_overhead,
)
from lakeckpt_tables.tools.bench.data import SyntheticTable, ensure_synthetic_table

SAVES, WARMUP = 3, 1


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench-ckpt")


@pytest.fixture(scope="module")
def commit_table(root: Path) -> str:
    return ensure_commit_table(root, rows=16_384, row_group_rows=256)


@pytest.fixture(scope="module")
def synthetic(root: Path) -> SyntheticTable:
    return ensure_synthetic_table(root, 20_000)


@pytest.fixture(scope="module")
def delta_one_rank(commit_table: str, root: Path) -> CommitResult:
    return measure_commit(commit_table, root, ranks=1, saves=SAVES, warmup=WARMUP)


@pytest.fixture(scope="module")
def overhead(synthetic: SyntheticTable, root: Path) -> OverheadResult:
    return measure_overhead(synthetic.uri, root / "overhead", steps=8, every=4, rounds=2,
                            capture_repeats=2)


def _check_commit(result: CommitResult, *, ranks: int, ledger: str) -> None:
    assert (result.ranks, result.ledger, result.workers) == (ranks, ledger, 2)
    assert (result.saves, result.committed) == (SAVES, SAVES + WARMUP)
    for series in (result.commit_ms, result.ledger_commit_ms, result.gather_ms,
                   result.broadcast_ms, result.save_ms, result.retire_ms, result.records):
        assert len(series) == SAVES
    assert all(v > 0 for v in result.commit_ms + result.ledger_commit_ms + result.save_ms)
    # phase 2 holds the ledger commit; a save holds phase 2
    assert all(c >= lc for c, lc in zip(result.commit_ms, result.ledger_commit_ms, strict=True))
    assert all(s >= c for s, c in zip(result.save_ms, result.commit_ms, strict=True))
    assert 0 < result.p("commit", 50) <= result.p("commit", 99)
    # every (rank, worker) consumed rows between two checkpoints, so every one has a record
    assert all(n >= ranks * 2 for n in result.records)
    assert result.reader_state_bytes > 0 and result.model_bytes > 0
    assert result.ledger_after["bytes"] > result.ledger_before["bytes"]
    assert result.bytes_per_checkpoint() > 0
    assert result.bytes_per_checkpoint("data_bytes") > 0
    assert result.ledger_compacted["bytes"] > 0
    data = result.to_json()
    assert json.loads(json.dumps(data)) == data
    assert set(data["percentiles_ms"]) >= {"commit", "ledger_commit", "save"}


def test_the_commit_table_has_small_row_groups_and_is_reused(commit_table: str,
                                                             root: Path) -> None:
    snapshot = DeltaSource(commit_table).snapshot()
    assert snapshot.rows == 16_384 and len(snapshot.units) == 64
    assert ensure_commit_table(root, rows=16_384, row_group_rows=256) == commit_table


def test_a_one_rank_delta_commit_job_reports_every_series(delta_one_rank: CommitResult) -> None:
    _check_commit(delta_one_rank, ranks=1, ledger="delta")
    assert delta_one_rank.live_after_compact is not None
    assert delta_one_rank.ledger_compacted["data_files"] > delta_one_rank.ledger_after[
        "data_files"]  # compact() writes a file; VACUUM, not compact, removes the old ones


def test_a_one_rank_iceberg_sqlite_commit_job(commit_table: str, root: Path) -> None:
    result = measure_commit(commit_table, root, ranks=1, ledger="iceberg-sqlite", saves=SAVES,
                            warmup=WARMUP)
    _check_commit(result, ranks=1, ledger="iceberg-sqlite")
    assert result.live_after_compact is None


@pytest.mark.postgres
def test_a_one_rank_iceberg_postgres_commit_job(commit_table: str, root: Path) -> None:
    uri = os.environ.get("LAKECKPT_TEST_PG_URI")
    if not uri:
        pytest.skip("LAKECKPT_TEST_PG_URI is not set (see scripts/postgres.sh)")
    result = measure_commit(commit_table, root, ranks=1, ledger="iceberg-postgres",
                            saves=SAVES, warmup=WARMUP, pg_uri=uri)
    _check_commit(result, ranks=1, ledger="iceberg-postgres")


@pytest.mark.slow
def test_a_two_rank_torchrun_commit_job(commit_table: str, root: Path) -> None:
    result = measure_commit(commit_table, root, ranks=2, saves=SAVES, warmup=WARMUP)
    _check_commit(result, ranks=2, ledger="delta")
    assert not list(root.glob("commit-delta-2-*")), "the job's checkpoint root is left behind"


def test_the_overhead_blocks_are_interleaved_and_timed(overhead: OverheadResult) -> None:
    assert (overhead.steps, overhead.every, overhead.rounds) == (8, 4, 2)
    assert set(overhead.block_s) == set(overhead.block_cpu_s) == {"none", "sync", "async"}
    assert all(len(v) == 2 and min(v) > 0 for v in overhead.block_s.values())
    assert overhead.saves_per_block == 2  # at steps 2 and 6
    assert {m: len(v) for m, v in overhead.save_s.items()} == {"sync": 4, "async": 4}
    assert len(overhead.wait_s) == 2 and len(overhead.capture_s) == 2
    assert overhead.step_ms > 0 and overhead.capture_ms > 0
    assert 0 < overhead.tracking_share() < overhead.tracking_share(overhead.every)
    assert overhead.model_params > 100_000 and overhead.checkpoint_bytes > 1_000_000
    data = overhead.to_json()
    assert json.loads(json.dumps(data)) == data
    assert set(data["overhead"]) == {"sync", "async"}


def test_the_report_has_every_figure_with_its_target(
        delta_one_rank: CommitResult, overhead: OverheadResult, commit_table: str,
        synthetic: SyntheticTable) -> None:
    report = build_report([delta_one_rank], overhead, commit_table, synthetic,
                          ["iceberg (PostgreSQL): not measured here"])
    data = report.to_json()
    assert json.loads(json.dumps(data)) == data
    names = [f["name"] for f in data["figures"]]
    assert names == [
        "ledger commit p50, 1 rank, delta",
        "save total p50, 1 rank, delta",
        "step time, no checkpoints",
        "sync save every 4 steps: step-time overhead",
        "async save every 4 steps: step-time overhead",
        "reader tracking at a checkpoint every 500 steps",
        "ledger bytes per checkpoint, 1 rank, delta",
    ]
    by_name = {f["name"]: f for f in data["figures"]}
    commit = by_name["ledger commit p50, 1 rank, delta"]
    assert commit["target"] == f"<= {COMMIT_TARGET_MS:g} ms"
    assert commit["verdict"] in ("PASS", "MISS") and commit["value"] > 0
    assert by_name["reader tracking at a checkpoint every 500 steps"]["verdict"] in ("PASS",
                                                                                     "MISS")
    assert by_name["ledger bytes per checkpoint, 1 rank, delta"]["value"] > 0
    assert data["passed"] == all(f["verdict"] != "MISS" for f in data["figures"])
    text = format_report(report)
    assert "ledger commit p50, 1 rank, delta" in text and "<= 100 ms" in text
    assert "skipped: iceberg (PostgreSQL)" in text


def test_the_cli_knows_the_checkpoint_bench() -> None:
    parser = argparse.ArgumentParser()
    bench_cli.register(parser)
    args = parser.parse_args(["checkpoint", "--quick", "--json", "--dir", "/tmp/x"])
    assert (args.bench, args.quick, args.json, args.dir) == ("checkpoint", True, True, "/tmp/x")
