"""``lakeckpt bench read`` end to end on a tiny table: structure, not timings."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.cli import main
from lakeckpt_tables.reader.state import decode_state, encode_state
from lakeckpt_tables.tools.bench import read as read_bench
from lakeckpt_tables.tools.bench.data import ensure_synthetic_table
from lakeckpt_tables.tools.bench.raw import raw_batches
from lakeckpt_tables.tools.bench.read import (
    ReadBenchReport,
    format_report,
    interleaved_pass,
    measure_throughput,
)
from lakeckpt_tables.tools.bench.state import STATE_TARGET_BYTES, measure_state_size

ROWS = 50_000


@pytest.fixture(scope="module")
def bench_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench")


@pytest.fixture(scope="module")
def cli_run(bench_root: Path) -> tuple[int, str, dict[str, Any], ReadBenchReport]:
    """One ``lakeckpt bench read --json`` on the reused table (the bench is the file's slowest
    part: run once): its exit status, what it printed, and the arguments and report of the
    ``run_read_bench`` it called (a spy that keeps the call real)."""
    ensure_synthetic_table(bench_root, ROWS)
    calls: list[tuple[dict[str, Any], ReadBenchReport]] = []
    real = read_bench.run_read_bench

    def spy(**kwargs: Any) -> ReadBenchReport:
        report = real(**kwargs)
        calls.append((kwargs, report))
        return report

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setattr(read_bench, "run_read_bench", spy)
        code = main(["bench", "read", "--rows", str(ROWS), "--dir", str(bench_root),
                     "--rounds", "1", "--min-seconds", "0", "--resume-rounds", "1",
                     "--state-tb", "0.01", "--loader-rounds", "1", "--json"])
    ((kwargs, report),) = calls
    return code, out.getvalue(), kwargs, report


def test_the_synthetic_table_is_built_once_and_then_reused(bench_root: Path) -> None:
    first = ensure_synthetic_table(bench_root, ROWS)
    again = ensure_synthetic_table(bench_root, ROWS)
    assert (first.rows, first.files) == (ROWS, 2)
    assert again.reused and again.uri == first.uri
    assert DeltaSource(first.uri).snapshot().rows == ROWS


def test_the_raw_loop_and_the_reader_deliver_the_same_rows_in_the_same_order(
        bench_root: Path) -> None:
    table = ensure_synthetic_table(bench_root, ROWS)
    dataset = LakeDataset(DeltaSource(table.uri), columns=["id", "x"], batch_size=8192,
                          shuffle=False)
    units = [(u.path, u.row_group) for u in dataset.snapshot.units]
    handles = {p: pq.ParquetFile(p) for p, _ in units}
    raw = torch.cat([b["id"] for b in raw_batches(units, ["id", "x"], 8192, handles=handles)])
    ours = torch.cat([b["id"] for b in dataset])
    assert torch.equal(raw, ours) and len(ours) == ROWS
    times = interleaved_pass({"raw": raw_batches(units, ["id", "x"], 8192, handles=handles),
                              "reader": dataset}, "id")
    assert {t.rows for t in times.values()} == {ROWS}
    assert all(t.wall_s > 0 and t.cpu_s >= 0 for t in times.values())


def test_every_measured_reader_pass_decodes_every_row_group(
        bench_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A dataset reused across passes serves later passes from its row-group cache, and
    # "reader / raw" then read 3.5x: the throughput figure would measure the cache, not the
    # reader. Counted, not timed: the reads of the warm-up pass and one measured round.
    from lakeckpt_tables.sources.base import RowGroupReader

    table = ensure_synthetic_table(bench_root, ROWS)
    row_groups = len(LakeDataset(DeltaSource(table.uri), columns=["id"]).snapshot.units)
    reads = 0
    original = RowGroupReader.read

    def counted(self: RowGroupReader, unit: Any, columns: Any) -> Any:
        nonlocal reads
        reads += 1
        return original(self, unit, columns)

    monkeypatch.setattr(RowGroupReader, "read", counted)
    result = measure_throughput(table.uri, rounds=1, min_seconds=0, max_rounds=1)
    assert result.rounds == 1
    # two passes (warm-up and round 1) of two loops (shuffle off and on), each decoding all
    assert reads == 2 * 2 * row_groups


def test_run_read_bench_reports_every_figure_with_its_target(
        bench_root: Path, cli_run: tuple[int, str, dict[str, Any], ReadBenchReport]) -> None:
    _, _, kwargs, report = cli_run
    assert {k: v for k, v in kwargs.items() if k != "progress"} == {
        "rows": ROWS, "root": str(bench_root), "rounds": 1, "min_seconds": 0,
        "resume_rounds": 1, "state_bytes": 10**10, "loader_rounds": 1}
    data = report.to_json()
    assert json.loads(json.dumps(data)) == data  # JSON-clean
    assert data["table"]["rows"] == ROWS
    throughput = data["throughput"]
    assert throughput["rows"] == ROWS and throughput["rounds"] == 1
    assert throughput["raw"] > 0 and throughput["reader"] > 0 and throughput["shuffled"] > 0
    assert [r["shuffle"] for r in data["resume"]] == [False, True]
    for resume in data["resume"]:
        assert resume["fractions"] == [0.0, 0.5, 0.9]
        assert resume["positions"][0] == 0 < resume["positions"][1] < resume["positions"][2]
        assert resume["verified"], "a resumed first batch differs from the full pass"
    steady, elastic = data["state_size"]
    assert (steady["ranks"], steady["workers"]) == (128, 8)
    assert (elastic["ranks"], elastic["workers"]) == (64, 8) and elastic["layout_pieces"] > 0
    with_target = [f for f in data["figures"] if f["target"]]
    assert [f["verdict"] for f in with_target] and all(
        f["verdict"] in ("PASS", "MISS") for f in with_target)
    names = [f["name"] for f in data["figures"]]
    assert "reader / raw, shuffle off" in names
    assert any(n.startswith("reader state, 0.01 TB, steady") for n in names)
    features = data["table_features"]
    assert (features["rows"], features["deleted_rows"], features["rounds"]) == (ROWS, 500, 1)
    assert {"deletion vectors / plain read", "partition column from the log / same column "
            "stored"} <= set(names)
    assert [f["target"] for f in data["figures"]
            if f["name"] == "deletion vectors / plain read"] == [">= 0.95x"]
    loaders = data["loaders"]
    assert loaders["rows"] == ROWS and loaders["bench"] == "workers"
    assert sorted(loaders["rows_per_s"]) == ["library 0@1024", "library 0@8192",
                                             "library 2@1024", "library 2@8192", "raw@1024",
                                             "raw@8192"]
    assert "StatefulDataLoader grid: batch 1024: library 2 workers / raw read" in names
    assert data["bench"] == "read" and "narrow table (id int64, x float32)" in data["shape"]
    assert data["ratios"]["reader / raw, shuffle off"] == throughput["ratio"]
    assert "batch 8192: library 2 workers / 0 workers" in data["ratios"]
    text = format_report(report)
    assert "reader / raw, shuffle off" in text and ">= 0.9x" in text and "<= 64 KB" in text


def test_reader_state_for_128_ranks_by_8_workers_is_under_64_kb() -> None:
    size = measure_state_size(ranks=128, workers=8)
    assert size.encoded_bytes <= STATE_TARGET_BYTES, size
    assert size.json_bytes > size.encoded_bytes  # compressed


def test_the_simulated_state_round_trips_through_its_encoding() -> None:
    from lakeckpt_tables.reader.state import ReaderState
    from lakeckpt_tables.tools.bench.state import simulated_state

    state, _ = simulated_state()
    assert ReaderState.from_dict(decode_state(encode_state(state))) == state


def test_the_cli_prints_the_report_as_json(
        cli_run: tuple[int, str, dict[str, Any], ReadBenchReport]) -> None:
    code, printed, _, report = cli_run
    data = json.loads(printed)
    expected = json.loads(json.dumps(report.to_json()))
    # the machine line holds the load average when it was printed, which moves after
    machine = r"\d+ CPUs, load average [\d.]+ at the end, pyarrow memory pool \w+"
    assert re.fullmatch(machine, data.pop("machine")) and expected.pop("machine")
    assert data == expected
    assert code == (0 if data["passed"] else 1)
    assert data["table"]["reused"] and data["table"]["rows"] == ROWS
    assert data["resume"][0]["total_s"] and len(data["resume"][0]["total_s"]) == 3
    assert data["state_size"][0]["table_bytes"] == 10**10
    assert data["loaders"]["rounds"] == 1
