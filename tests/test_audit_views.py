"""``audit.connect``: the ledger's views, on Delta and Iceberg ledgers, empty or compacted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from audit_helpers import ROWS, SimulatedRun, write_table
from pyiceberg.catalog.sql import SqlCatalog

from lakeckpt_tables.audit import connect
from lakeckpt_tables.audit.views import VIEWS
from lakeckpt_tables.errors import LedgerError
from lakeckpt_tables.ledger import DeltaLedger, IcebergLedger, LedgerEvent

COLUMNS = {
    "checkpoints": ["run_id", "checkpoint_id", "step", "status", "retired_reason", "parent_id",
                    "tags", "world_size", "source_format", "source_location", "source_table_id",
                    "source_version", "rows", "config_hash", "model_location", "removed_at",
                    "removed_reason", "wall_time_s",
                    "committed_at"],
    "consumption": ["run_id", "checkpoint_id", "step", "status", "committed_at", "rank",
                    "worker", "segment", "epoch", "file", "row_group", "row_start", "row_end",
                    "rows", "exact", "source_key", "tokens", "source_location",
                    "source_table_id", "source_version"],
    "events": ["run_id", "checkpoint_id", "step", "committed_at", "event", "segment", "epoch",
               "rows", "detail"],
    "progress": ["run_id", "segment", "epoch", "state", "rows_consumed", "rows_in_pass",
                 "live_rows", "percent", "rows_per_s", "eta_s", "from_version", "to_version",
                 "checkpoints", "first_step", "last_step", "first_at", "last_at", "source_key",
                 "tokens_consumed", "tokens_in_pass", "share"],
    "recoveries": ["run_id", "restored_at", "checkpoint_id", "step", "newest_step",
                   "reached_step", "steps_lost", "fallback", "source_event"],
    "runs": ["run_id", "state", "follow", "checkpoints", "last_step", "last_commit_at",
             "save_interval_s", "idle_s", "stale_after_s", "passes", "passes_done",
             "rows_consumed", "source_format", "source_location", "parent_run", "parent_step",
             "parent_checkpoint"],
    "follow_lag": ["run_id", "source_format", "source_location", "follow", "committed_version",
                   "table_version", "versions_behind", "last_step", "last_commit_at",
                   "checked_at"],
    "deletions": ["run_id", "applied_by_checkpoint", "applied_at_step", "committed_at",
                  "version", "operation", "how", "file", "row_group", "row_start", "row_end",
                  "rows", "excluded_rows"],
}


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("src") / "t"
    write_table(path)
    return path


def _catalog(tmp_path: Path) -> SqlCatalog:
    return SqlCatalog("audit", uri=f"sqlite:///{tmp_path}/cat.db",
                      warehouse=f"file://{tmp_path}/wh")


def _half_run(table: Path, ledger: Any, run_id: str = "half") -> SimulatedRun:
    """Two checkpoints: 2 ranks x 7 rows x (5 + 5) steps = 140 of the 400 rows."""
    run = SimulatedRun(table, ledger, run_id, world=2, batch=7, window=3)
    for _ in range(2):
        run.train(5)
        run.checkpoint(tags=("best",) if run.step == 10 else ())
    return run


def _all(con: Any, sql: str) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in con.sql(sql).fetchall()]


@pytest.mark.parametrize("backend", ["delta", "iceberg"])
def test_progress_checkpoints_and_consumption_of_a_run_half_way(
        backend: str, table: Path, tmp_path: Path) -> None:
    if backend == "delta":
        ledger: Any = DeltaLedger(str(tmp_path / "_ledger"))
        target, kwargs = str(tmp_path), {}
    else:
        catalog = _catalog(tmp_path)
        ledger = IcebergLedger("ml.ledger", catalog=catalog)
        target, kwargs = "iceberg:ml.ledger", {"catalog": catalog}
    run = _half_run(table, ledger)
    con = connect(target, **kwargs)
    assert _all(con, "SELECT step, status, tags, world_size, rows FROM checkpoints") == [
        (5, "committed", [], 2, 70), (10, "committed", ["best"], 2, 70)]
    assert _all(con, "SELECT source_version FROM checkpoints") == [(3,), (3,)]
    assert _all(con, "SELECT run_id, segment, epoch, rows_consumed, rows_in_pass, percent, "
                     "checkpoints, first_step, last_step FROM progress") == [
        ("half", 0, 0, 140, ROWS, 35.0, 2, 5, 10)]
    ((rate, eta),) = con.sql("SELECT rows_per_s, eta_s FROM progress").fetchall()
    assert rate > 0 and eta == pytest.approx((ROWS - 140) / rate)
    assert _all(con, "SELECT sum(rows), count(DISTINCT rank) FROM consumption") == [(140, 2)]
    ids = [r.checkpoint_id for r in run.run.records]
    assert _all(con, "SELECT checkpoint_id FROM checkpoints ORDER BY step") == [(i,) for i in ids]
    assert _all(con, "SELECT committed_version, table_version, versions_behind "
                     "FROM follow_lag") == [(3, 3, 0)]


@pytest.mark.parametrize("backend", ["delta", "iceberg"])
def test_an_empty_ledger_gives_empty_views_with_their_columns(backend: str,
                                                              tmp_path: Path) -> None:
    if backend == "delta":
        DeltaLedger(str(tmp_path / "_ledger"))
        con = connect(str(tmp_path))
    else:
        catalog = _catalog(tmp_path)
        IcebergLedger("ml.ledger", catalog=catalog)
        con = connect("iceberg:ml.ledger", catalog=catalog)
    for view in VIEWS:
        result = con.sql(f"SELECT * FROM {view}")
        assert result.columns == COLUMNS[view], view
        assert result.fetchall() == []


def test_a_missing_root_is_an_error_and_nothing_is_created(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(LedgerError, match="does not exist"):
        connect(str(missing))
    assert not missing.exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(LedgerError, match="no ledger under"):
        connect(str(tmp_path / "empty"))
    assert list((tmp_path / "empty").iterdir()) == []
    catalog = _catalog(tmp_path)
    with pytest.raises(LedgerError, match=r"no ledger iceberg:ml\.ledger"):
        connect("iceberg:ml.ledger", catalog=catalog)
    assert catalog.list_namespaces() == []


@pytest.mark.parametrize("backend", ["delta", "iceberg"])
def test_after_compaction_no_row_is_counted_twice(backend: str, table: Path,
                                                  tmp_path: Path) -> None:
    if backend == "delta":
        ledger: Any = DeltaLedger(str(tmp_path / "_ledger"))
        target, kwargs = str(tmp_path), {}
    else:
        catalog = _catalog(tmp_path)
        ledger = IcebergLedger("ml.ledger", catalog=catalog)
        target, kwargs = "iceberg:ml.ledger", {"catalog": catalog}
    _half_run(table, ledger)
    ledger.compact()
    if backend == "delta":  # the replaced files are still there: a glob would double count
        files = list((tmp_path / "_ledger").glob("*.parquet"))
        assert len(files) == 3
    con = connect(target, **kwargs)
    assert _all(con, "SELECT sum(rows) FROM consumption") == [(140,)]
    assert _all(con, "SELECT count(*) FROM checkpoints") == [(2,)]
    assert _all(con, "SELECT rows_consumed FROM progress") == [(140,)]


def test_retired_and_abandoned_checkpoints_do_not_count(table: Path, tmp_path: Path) -> None:
    ledger = DeltaLedger(str(tmp_path / "_ledger"))
    run = SimulatedRun(table, ledger, "r", world=2, batch=7, window=3)
    for _ in range(3):
        run.train(5)
        run.checkpoint()
    first, _, third = run.run.records
    # restore fell back past the third (failed verification) to the first: the second's
    # training is lost too, and the run goes on from the first
    ledger.record_events("r", [
        LedgerEvent("retired", {"checkpoint_id": third.checkpoint_id, "step": 15,
                                "reason": "model.pt: checksum mismatch"}),
        LedgerEvent("restore", {"checkpoint_id": first.checkpoint_id, "step": 5,
                                "newest_step": 15, "steps_lost": 10})])
    run.restore(first)
    run.step = 20
    run.train(5)
    run.checkpoint()
    con = connect(str(tmp_path))
    assert _all(con, "SELECT step, status, retired_reason FROM checkpoints") == [
        (5, "committed", None), (10, "abandoned", None),
        (15, "retired", "model.pt: checksum mismatch"), (25, "committed", None)]
    assert _all(con, "SELECT rows_consumed FROM progress") == [(140,)]
    assert _all(con, "SELECT checkpoint_id, step, newest_step, steps_lost, fallback "
                     "FROM recoveries") == [(first.checkpoint_id, 5, 15, 10, True)]


def test_recoveries_of_older_ledgers_come_from_restore_fallback_events(tmp_path: Path) -> None:
    ledger = DeltaLedger(str(tmp_path / "_ledger"))
    ledger.record_events("old", [LedgerEvent("restore_fallback", {
        "restored": "abc", "step": 4,
        "skipped": [{"checkpoint_id": "x", "step": 9, "problems": ["gone"]},
                    {"checkpoint_id": "y", "step": 6, "problems": ["gone"]}]})])
    con = connect(str(tmp_path))
    assert _all(con, "SELECT run_id, checkpoint_id, step, newest_step, steps_lost, "
                     "source_event FROM recoveries") == [
        ("old", "abc", 4, 9, 5, "restore_fallback")]


def test_progress_takes_pass_sizes_from_round_events(table: Path, tmp_path: Path) -> None:
    ledger = DeltaLedger(str(tmp_path / "_ledger"))
    run = SimulatedRun(table, ledger, "rounds", world=2, batch=7, window=3)
    run.train(5)
    record = run.checkpoint()
    con = connect(str(tmp_path))
    # the checkpoint recorded its pass as a 'round' event: the pass size is the rows it delivers
    (delivered,), = _all(con, "SELECT CAST(detail ->> '$.delivered' AS BIGINT) FROM events "
                              "WHERE event = 'round'")
    assert _all(con, "SELECT rows_consumed, rows_in_pass, percent, to_version FROM progress") \
        == [(70, delivered, round(100 * 70 / delivered, 2), 3)]
    assert delivered == 400 - 400 % 2  # the table's rows, less a lockstep remainder
    assert record.step == 5


def test_a_ledger_object_is_read_at_one_version(table: Path, tmp_path: Path) -> None:
    ledger = DeltaLedger(str(tmp_path / "_ledger"))
    _half_run(table, ledger)
    con = connect(ledger)
    assert _all(con, "SELECT count(*) FROM checkpoints") == [(2,)]
    _half_run(table, ledger, "later")  # committed after connect(): not seen by it
    assert _all(con, "SELECT count(*) FROM checkpoints") == [(2,)]
    assert _all(connect(ledger), "SELECT count(*) FROM checkpoints") == [(4,)]


def test_catalog_readme_documents_every_column_of_every_view_and_every_event_kind(
        tmp_path: Path) -> None:
    import re

    readme = (Path(__file__).parent.parent / "catalog" / "README.md").read_text()
    sections = re.split(r"^## ", readme, flags=re.M)
    DeltaLedger(str(tmp_path / "_ledger"))
    con = connect(str(tmp_path))
    for view in VIEWS:
        (section,) = [s for s in sections if s.split("\n", 1)[0].strip() == view]
        documented = re.findall(r"^\| ([a-z_]+) \| [A-Z]", section, flags=re.M)
        assert documented == con.sql(f"SELECT * FROM {view}").columns, view
    (events,) = [s for s in sections if s.startswith("events")]
    kinds = set(re.findall(r"^\| `([a-z_]+)` \|", events, flags=re.M))
    # every event kind the library records, by name in its source
    source = "\n".join(p.read_text() for p in (Path(__file__).parent.parent /
                                               "lakeckpt_tables").rglob("*.py"))
    recorded = set(re.findall(r'LedgerEvent\(\s*"([a-z_]+)"', source))
    recorded |= set(re.findall(r'\("([a-z_]+)", \{', source)) & {
        "round", "segment", "skipped_commit", "undelivered", "policy_change"}
    recorded |= {"claim", "retired", "tag", "compaction_failed", "finished", "source"}
    assert recorded <= kinds, recorded - kinds
