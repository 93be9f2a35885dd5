"""Progress at scale: a compacted Delta ledger is sorted, cut in small row groups and
summarized, and ``connect`` reads consumption totals from the summaries (NOTE [ consumption
summaries ] in ``lakeckpt_tables/ledger/summary.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from audit_helpers import SimulatedRun, write_table

from lakeckpt_tables.audit import connect
from lakeckpt_tables.audit.target import read_ledger
from lakeckpt_tables.cli import main
from lakeckpt_tables.errors import LedgerCorruptError
from lakeckpt_tables.ledger import DeltaLedger
from lakeckpt_tables.ledger.summary import SUMMARY_DIR, summarize


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("src") / "t"
    write_table(path)
    return path


def _two_runs(table: Path, ledger: DeltaLedger) -> list[SimulatedRun]:
    """Run a: 2 x (2 ranks x 7 rows x 5 steps) = 140 rows; run b: 1 x 70 rows."""
    runs = [SimulatedRun(table, ledger, run, world=2, batch=7, window=3) for run in "ab"]
    for run, checkpoints in zip(runs, (2, 1), strict=True):
        for _ in range(checkpoints):
            run.train(5)
            run.checkpoint()
    return runs


def _live_file(root: Path) -> Path:
    from deltalake import DeltaTable

    (path,) = DeltaTable(str(root)).file_uris()
    return Path(path.removeprefix("file://"))


def _progress(target: str) -> list[tuple[Any, ...]]:
    con = connect(target)
    return [tuple(r) for r in con.sql(
        "SELECT run_id, rows_consumed, checkpoints FROM progress ORDER BY run_id").fetchall()]


def test_compaction_sorts_by_kind_run_and_step_and_writes_the_consumption_summary(
        table: Path, tmp_path: Path) -> None:
    root = tmp_path / "_ledger"
    ledger = DeltaLedger(str(root))
    _two_runs(table, ledger)
    ledger.compact()
    data = _live_file(root)
    rows = pq.read_table(data)
    keys = list(zip(rows["record"].to_pylist(), rows["run_id"].to_pylist(),
                    rows["step"].to_pylist(), strict=True))
    assert keys == sorted(keys)
    summary = pq.read_table(root / SUMMARY_DIR / data.name)
    assert summary.schema.metadata[b"lakeckpt.summary.of"] == data.name.encode()
    assert summary.replace_schema_metadata(None).sort_by("step").equals(
        summarize(rows).sort_by("step"))
    assert sorted(zip(summary["run_id"].to_pylist(), summary["rows"].to_pylist(),
                      strict=True)) == [("a", 70), ("a", 70), ("b", 70)]


def test_progress_adds_commits_after_the_summary_to_it(table: Path, tmp_path: Path) -> None:
    root = tmp_path / "_ledger"
    ledger = DeltaLedger(str(root))
    a, _ = _two_runs(table, ledger)
    ledger.compact()
    a.train(5)
    a.checkpoint()  # a file without a summary: its rows are summed
    assert _progress(str(tmp_path)) == [("a", 210, 3), ("b", 70, 1)]
    con = connect(str(tmp_path))
    assert con.sql("SELECT run_id, sum(rows) FROM checkpoints GROUP BY ALL ORDER BY 1"
                   ).fetchall() == [("a", 210), ("b", 70)]


def test_a_summary_of_another_file_or_a_damaged_one_is_ignored(table: Path,
                                                               tmp_path: Path) -> None:
    root = tmp_path / "_ledger"
    ledger = DeltaLedger(str(root))
    _two_runs(table, ledger)
    ledger.compact()
    data = _live_file(root)
    summary = root / SUMMARY_DIR / data.name
    good = pq.read_table(summary)
    # a valid summary claiming 1,000 rows per checkpoint, but stamped for another file
    forged = good.set_column(good.schema.get_field_index("rows"), "rows",
                             pc.multiply(good["rows"], 0).cast("int64"))
    pq.write_table(forged.replace_schema_metadata(
        {**good.schema.metadata, b"lakeckpt.summary.of": b"lakeckpt-other.parquet"}), summary)
    assert _progress(str(tmp_path)) == [("a", 140, 2), ("b", 70, 1)]
    summary.write_bytes(summary.read_bytes()[:-20])  # truncated: not readable
    assert _progress(str(tmp_path)) == [("a", 140, 2), ("b", 70, 1)]
    # the honest summary is what is read when it matches its file
    pq.write_table(forged.replace_schema_metadata(good.schema.metadata), summary)
    assert _progress(str(tmp_path)) == [("a", 0, 2), ("b", 0, 1)]


def test_a_truncated_ledger_file_is_named_before_any_view_is_read(table: Path,
                                                                  tmp_path: Path) -> None:
    root = tmp_path / "_ledger"
    ledger = DeltaLedger(str(root))
    _two_runs(table, ledger)
    ledger.compact()
    data = _live_file(root)
    data.write_bytes(data.read_bytes()[:-100])
    with pytest.raises(LedgerCorruptError, match=rf"{data.name} is missing, truncated or damaged"):
        read_ledger(str(tmp_path))


def test_a_damaged_page_met_inside_a_query_is_a_named_error_naming_the_file(
        table: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "_ledger"
    ledger = DeltaLedger(str(root))
    _two_runs(table, ledger)
    ledger.compact()
    data = _live_file(root)
    damaged = bytearray(data.read_bytes())
    footer = len(damaged) - 8 - int.from_bytes(damaged[-8:-4], "little")
    for k in range(8, footer, 97):  # pages, not the footer: the file still opens
        damaged[k] ^= 0x10
    data.write_bytes(bytes(damaged))
    read_ledger(str(tmp_path))  # the footer is intact: the damage is met by the scan
    capsys.readouterr()
    assert main(["checkpoints", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"data file {data} is missing, truncated or damaged" in err
    assert "The way out: move the file aside" in err and "Traceback" not in err


def test_damage_met_by_duckdb_inside_a_view_is_named_too(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lakeckpt_tables.tools.bench.audit import _build

    where = tmp_path / "ledger"
    _build(where, 1_100, lambda _: None)  # 71,500 rows: consumption spills into row group 1
    DeltaLedger(str(where)).compact()
    data = _live_file(where)
    chunk = pq.read_metadata(data).row_group(1).column(
        pq.read_schema(data).get_field_index("row_start"))
    damaged = bytearray(data.read_bytes())
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    for k in (1, 2, 3):
        damaged[start + chunk.total_compressed_size * k // 4] ^= 0x10
    data.write_bytes(bytes(damaged))
    capsys.readouterr()
    assert main(["progress", f"delta:{where}", "--output", "json"]) == 0  # summaries: unharmed
    assert main(["sql", f"delta:{where}", "SELECT max(row_start) FROM consumption"]) == 2
    err = capsys.readouterr().err
    assert f"data file {data} is missing, truncated or damaged" in err, err
    assert "Traceback" not in err
