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


def test_compaction_holds_a_bounded_number_of_rows_and_keeps_every_row_in_order(
        table: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files of at most COMPACT_FILE_ROWS rows, read in slices: the same rows, in (record,
    run, step) order across the files, each file summarized, progress unchanged; a ledger
    already in that shape is not rewritten."""
    from deltalake import DeltaTable

    from lakeckpt_tables.ledger import compaction

    root = tmp_path / "_ledger"
    ledger = DeltaLedger(str(root))
    _two_runs(table, ledger)
    before = ledger.to_arrow()
    progress = _progress(f"delta:{root}")
    # three commit files of 8-9 rows, each under half a compacted file: fragmented
    monkeypatch.setattr(compaction, "FILE_ROWS", 20)
    monkeypatch.setattr(compaction, "SLICE_ROWS", 3)
    ledger.compact()
    files = [Path(p.removeprefix("file://")) for p in DeltaTable(str(root)).file_uris()]
    parts = [pq.read_table(f) for f in files]
    assert len(files) == 2 and all(p.num_rows <= 20 for p in parts)
    keys = sorted(list(zip(p["record"].to_pylist(), p["run_id"].to_pylist(),
                            p["step"].to_pylist(), strict=True)) for p in parts)
    assert [k for part in keys for k in part] == sorted(k for part in keys for k in part)
    assert ledger.to_arrow().sort_by("checksum").equals(before.sort_by("checksum"))
    for f in files:
        assert pq.read_table(root / SUMMARY_DIR / f.name).schema.metadata[
            b"lakeckpt.summary.of"] == f.name.encode()
    assert _progress(f"delta:{root}") == progress
    version = DeltaTable(str(root)).version()
    ledger.compact()
    assert DeltaTable(str(root)).version() == version  # in shape already: nothing rewritten


def test_an_iceberg_ledger_is_read_lazily_and_its_compaction_is_bounded_and_summarized(
        table: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Iceberg ledger as the Delta one: audits scan its files lazily (progress and
    verify unchanged by the way it is read), and a compaction writes files of at most
    FILE_ROWS rows, sorted, each with a summary that progress then reads."""
    from conftest import sql_catalog

    from lakeckpt_tables.audit import verify
    from lakeckpt_tables.ledger import compaction
    from lakeckpt_tables.ledger.iceberg import IcebergLedger
    from lakeckpt_tables.ledger.iceberg_files import IcebergFiles, snapshot_files

    catalog = sql_catalog(tmp_path)
    ledger = IcebergLedger("ml.ledger", catalog=catalog)
    _two_runs(table, ledger)
    target = "iceberg:ml.ledger"
    assert read_ledger(target, catalog=catalog).dataset is not None  # lazy
    progress = [tuple(r) for r in connect(target, catalog=catalog).sql(
        "SELECT run_id, rows_consumed, checkpoints FROM progress ORDER BY run_id").fetchall()]
    assert [(r[0], r[1]) for r in progress] == [("a", 140), ("b", 70)]
    before = ledger.to_arrow()
    monkeypatch.setattr(compaction, "FILE_ROWS", 20)
    monkeypatch.setattr(compaction, "SLICE_ROWS", 3)
    ledger.compact()
    iceberg = catalog.load_table("ml.ledger")
    files = snapshot_files(iceberg, iceberg.current_snapshot().snapshot_id)
    lazy = IcebergFiles.of(iceberg)
    parts = [lazy.dataset([f]).to_table() for f in files]
    assert len(parts) == 2 and all(p.num_rows <= 20 for p in parts)
    keys = [k for p in sorted(parts, key=lambda p: (p["record"][0].as_py(), p["run_id"][0].as_py()))
            for k in zip(p["record"].to_pylist(), p["run_id"].to_pylist(),
                         p["step"].to_pylist(), strict=True)]
    assert keys == sorted(keys)
    assert ledger.to_arrow().sort_by("checksum").equals(before.sort_by("checksum"))
    summaries = (tmp_path / "warehouse" / "ml" / "ledger" / SUMMARY_DIR)
    assert sorted(p.name for p in summaries.iterdir()) == sorted(
        f.rsplit("/", 1)[-1] for f, _ in files)
    assert [tuple(r) for r in connect(target, catalog=catalog).sql(
        "SELECT run_id, rows_consumed, checkpoints FROM progress ORDER BY run_id").fetchall()
            ] == progress
    assert all(v.ok for v in verify(target, catalog=catalog))
    for path in summaries.iterdir():  # progress reads the summaries: a changed one shows
        kept = pq.read_table(path)
        pq.write_table(kept.set_column(kept.schema.get_field_index("rows"), "rows",
                                       pc.multiply(kept["rows"], 10)), path)
    assert [tuple(r)[:2] for r in connect(target, catalog=catalog).sql(
        "SELECT run_id, rows_consumed FROM progress ORDER BY run_id").fetchall()
            ] == [("a", 1400), ("b", 700)]


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
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from lakeckpt_tables.ledger import delta
    from lakeckpt_tables.tools.bench.audit import _build

    where = tmp_path / "ledger"
    monkeypatch.setattr(delta, "_ROW_GROUP_ROWS", 1_000)
    # 2,600 rows: consumption fills row groups 1 and 2
    _build(DeltaLedger(str(where)), 40, 64, 10, lambda _: None)
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
