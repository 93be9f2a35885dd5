"""One behaviour suite for every ledger backend: Delta, Iceberg on SQLite, Iceberg on PostgreSQL.

The PostgreSQL backend runs when LAKECKPT_TEST_PG_URI is set
(``export LAKECKPT_TEST_PG_URI="$(scripts/postgres.sh | tail -n 1)"``) and is skipped otherwise.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException

import lakeckpt_tables.sources.iceberg as iceberg_sources
from lakeckpt_tables.errors import (
    CommitConflictError,
    CommitStateUnknownError,
    LedgerError,
    RunFencedError,
)
from lakeckpt_tables.ledger import (
    LEDGER_FORMAT_VERSION,
    LEDGER_SCHEMA,
    CheckpointRecord,
    ConsumptionRecord,
    DeltaLedger,
    IcebergLedger,
    Ledger,
    LedgerEvent,
    open_ledger,
)
from lakeckpt_tables.ledger.records import SealedConsumption, commit_rows
from lakeckpt_tables.ledger.schema import CONSUMPTION_COLUMNS, FORMAT_PROPERTY
from lakeckpt_tables.types import TableIdentity

# -- backends ---------------------------------------------------------------------------------

# Receives the real commit as a thunk, and fails before it, after it, or not at all.
CommitFault = Callable[[Callable[[], Any]], Any]


@dataclass
class Backend:
    """One ledger table, and what the suite needs to reach behind the contract."""

    open: Callable[[], Ledger]
    """A new handle on the same ledger table (a separate object, as another process has)."""
    storage: Path
    """Directory under which the backend writes its data files."""
    inject_commit_fault: Callable[[pytest.MonkeyPatch, CommitFault], None]
    """Route the backend's phase-2 commit call through a fault."""
    stamp_format: Callable[[str], None]
    """Overwrite the format version stored in the table's properties."""
    race_lost: Exception
    """What the format's commit call raises when a concurrent commit took the version."""

    def parquet_files(self) -> set[Path]:
        return set(self.storage.rglob("*.parquet"))


def _delta_backend(tmp_path: Path) -> Backend:
    uri = str(tmp_path / "ledger")

    def inject(monkeypatch: pytest.MonkeyPatch, fault: CommitFault) -> None:
        real = DeltaTable.create_write_transaction

        def faulty(self: DeltaTable, *args: Any, **kwargs: Any) -> Any:
            return fault(lambda: real(self, *args, **kwargs))

        monkeypatch.setattr(DeltaTable, "create_write_transaction", faulty)

    def stamp(version: str) -> None:
        DeltaTable(uri).alter.set_table_properties({FORMAT_PROPERTY: version}, False)

    lost = CommitFailedError("injected: version already exists")
    return Backend(lambda: DeltaLedger(uri), tmp_path / "ledger", inject, stamp, lost)


def _iceberg_backend(tmp_path: Path, catalog_uri: str, identifier: str) -> Backend:
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir(exist_ok=True)

    def catalog() -> SqlCatalog:
        return SqlCatalog("lakeckpt_test", uri=catalog_uri, warehouse=warehouse.as_uri())

    def inject(monkeypatch: pytest.MonkeyPatch, fault: CommitFault) -> None:
        # pyiceberg retries a failed commit with back-off; keep the back-off short here.
        fast_retries = {"commit.retry.min-wait-ms": "1", "commit.retry.max-wait-ms": "1"}
        catalog().load_table(identifier).transaction().set_properties(
            fast_retries
        ).commit_transaction()
        real = SqlCatalog.commit_table

        def faulty(self: SqlCatalog, *args: Any, **kwargs: Any) -> Any:
            return fault(lambda: real(self, *args, **kwargs))

        monkeypatch.setattr(SqlCatalog, "commit_table", faulty)

    def stamp(version: str) -> None:
        catalog().load_table(identifier).transaction().set_properties(
            {FORMAT_PROPERTY: version}
        ).commit_transaction()

    lost = CommitFailedException("injected: table has been updated by another process")
    return Backend(
        lambda: IcebergLedger(identifier, catalog=catalog()), warehouse, inject, stamp, lost
    )


@pytest.fixture(
    params=[
        "delta",
        "iceberg-sqlite",
        pytest.param("iceberg-postgres", marks=pytest.mark.postgres),
    ]
)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "delta":
        yield _delta_backend(tmp_path)
    elif request.param == "iceberg-sqlite":
        yield _iceberg_backend(tmp_path, f"sqlite:///{tmp_path}/catalog.db", "ml.ledger")
    else:
        yield from _postgres_backend(tmp_path)


def _postgres_backend(tmp_path: Path) -> Iterator[Backend]:
    uri = os.environ.get("LAKECKPT_TEST_PG_URI")
    if not uri:
        pytest.skip("LAKECKPT_TEST_PG_URI is not set (see scripts/postgres.sh)")
    # A namespace per test, so that runs and concurrent sessions never share a table.
    namespace = f"t_{uuid.uuid4().hex[:12]}"
    backend = _iceberg_backend(tmp_path, uri, f"{namespace}.ledger")
    yield backend
    catalog = SqlCatalog("lakeckpt_test", uri=uri, warehouse=(tmp_path / "warehouse").as_uri())
    if catalog.table_exists(f"{namespace}.ledger"):
        catalog.drop_table(f"{namespace}.ledger")
    catalog.drop_namespace(namespace)


@pytest.fixture
def ledger(backend: Backend) -> Ledger:
    return backend.open()


# -- records ----------------------------------------------------------------------------------

SOURCE = TableIdentity(format="delta", location="/data/tokens", table_id="0f1e2d")


def checkpoint(
    step: int, checkpoint_id: str | None = None, run_id: str = "run-a"
) -> CheckpointRecord:
    return CheckpointRecord(
        run_id=run_id,
        checkpoint_id=checkpoint_id or f"{run_id}-ckpt-{step}",
        step=step,
        parent_id="run-0-ckpt-9",
        model_location=f"/ckpt/{run_id}/step-{step}",
        manifest={"__0_0.distcp": {"sha256": "ab" * 32, "bytes": 1234}},
        reader_state="eJyrVkpJLElUslIqS8wpTtVRSsvMS1GyMqoFAF1gB5Y=",
        source=SOURCE,
        source_version=7,
        world_size=8,
        tags=("nightly", "bf16"),
        config_hash="c0ffee",
        wall_time_s=12.5,
    )


def consumption(ranks: int = 8, offset: int = 0) -> list[ConsumptionRecord]:
    return [
        ConsumptionRecord(
            rank=r,
            worker=0,
            segment=0,
            epoch=1,
            file=f"part-{r}.parquet",
            row_group=2,
            row_start=offset,
            row_end=offset + 100,
        )
        for r in range(ranks)
    ]


def rows_of(ledger: Ledger, checkpoint_id: str) -> pa.Table:
    table = ledger.to_arrow()
    return table.filter(pc.field("checkpoint_id") == checkpoint_id)


def sorted_rows(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=repr)


# -- round trip -------------------------------------------------------------------------------


def test_a_committed_checkpoint_reads_back_with_every_field(ledger: Ledger) -> None:
    sent = checkpoint(10)
    events = [LedgerEvent("segment_formed", {"segment": 0, "rows": 800})]
    committed = ledger.commit(sent, consumption(), events)

    assert committed.committed_at is not None and committed.committed_at.utcoffset() is not None
    assert committed == replace(sent, committed_at=committed.committed_at)
    assert ledger.checkpoints() == [committed]
    assert ledger.latest("run-a") == committed

    table = ledger.to_arrow()
    assert table.schema.equals(LEDGER_SCHEMA)
    assert sorted(table["record"].to_pylist()) == ["checkpoint"] + ["consumption"] * 8 + ["event"]
    event = table.filter(pc.field("record") == "event").to_pylist()[0]
    assert (event["event"], event["checkpoint_id"], event["step"]) == (
        "segment_formed",
        sent.checkpoint_id,
        10,
    )
    assert event["detail"] == '{"segment": 0, "rows": 800}'

    used = ledger.consumption("run-a", sent.checkpoint_id)
    assert used.column_names == list(CONSUMPTION_COLUMNS)
    assert used["rank"].to_pylist() == list(range(8))
    assert used["rows"].to_pylist() == [100] * 8
    assert used["row_group"].to_pylist() == [2] * 8
    assert set(used["committed_at"].to_pylist()) == {committed.committed_at}


def test_a_checkpoint_without_source_or_parent_reads_back_as_none(ledger: Ledger) -> None:
    sent = replace(checkpoint(1), source=None, source_version=None, parent_id=None, tags=())
    committed = ledger.commit(sent)
    assert ledger.latest("run-a") == committed
    assert (committed.source, committed.source_version, committed.parent_id) == (None, None, None)


def test_events_recorded_outside_a_checkpoint_have_no_checkpoint_and_step_minus_one(
    ledger: Ledger,
) -> None:
    ledger.record_events("run-a", [LedgerEvent("restore_fallback", {"from": "c2", "to": "c1"})])
    rows = ledger.to_arrow().to_pylist()
    assert [(r["record"], r["checkpoint_id"], r["step"], r["event"]) for r in rows] == [
        ("event", "", -1, "restore_fallback")
    ]
    assert ledger.checkpoints("run-a") == []


# -- ordering and filters ---------------------------------------------------------------------


def test_checkpoints_are_ordered_by_run_then_step_and_latest_is_the_highest_step(
    ledger: Ledger,
) -> None:
    ledger.commit(checkpoint(3, run_id="run-b"))
    ledger.commit(checkpoint(5, run_id="run-a"))
    ledger.commit(checkpoint(10, run_id="run-a"))

    assert [(c.run_id, c.step) for c in ledger.checkpoints()] == [
        ("run-a", 5),
        ("run-a", 10),
        ("run-b", 3),
    ]
    assert [c.step for c in ledger.checkpoints("run-b")] == [3]
    latest = ledger.latest("run-a")
    assert latest is not None and latest.step == 10
    assert ledger.latest("run-z") is None


def test_consumption_is_filtered_by_run_and_by_checkpoint(ledger: Ledger) -> None:
    ledger.commit(checkpoint(1), consumption(ranks=2))
    ledger.commit(checkpoint(2), consumption(ranks=3, offset=100))
    ledger.commit(checkpoint(1, run_id="run-b"), consumption(ranks=4))

    assert ledger.consumption().num_rows == 9
    assert ledger.consumption("run-a").num_rows == 5
    second = ledger.consumption("run-a", "run-a-ckpt-2")
    assert second["row_start"].to_pylist() == [100] * 3
    assert ledger.consumption(checkpoint_id="run-b-ckpt-1").num_rows == 4


# -- idempotency and conflicts ----------------------------------------------------------------


def test_retrying_a_committed_checkpoint_returns_the_stored_record_and_writes_nothing(
    backend: Backend, ledger: Ledger
) -> None:
    first = ledger.commit(checkpoint(4), consumption())
    rows, files = ledger.to_arrow().num_rows, backend.parquet_files()

    again = backend.open().commit(checkpoint(4), consumption())

    assert again == first
    assert ledger.to_arrow().num_rows == rows
    assert backend.parquet_files() == files


def test_a_retry_of_an_older_step_is_still_recognised(ledger: Ledger) -> None:
    first = ledger.commit(checkpoint(4))
    ledger.commit(checkpoint(8))
    assert ledger.commit(checkpoint(4)) == first


def test_another_checkpoint_at_a_committed_step_is_a_conflict_naming_run_step_and_both_ids(
    ledger: Ledger,
) -> None:
    ledger.commit(checkpoint(4, "ckpt-original"))
    rows = ledger.to_arrow().num_rows
    with pytest.raises(CommitConflictError) as caught:
        ledger.commit(checkpoint(4, "ckpt-impostor"), consumption())
    message = str(caught.value)
    for part in ("'run-a'", "step 4", "ckpt-original", "ckpt-impostor"):
        assert part in message
    assert ledger.to_arrow().num_rows == rows


def test_a_step_not_after_the_runs_last_step_is_a_conflict(ledger: Ledger) -> None:
    ledger.commit(checkpoint(4))
    with pytest.raises(CommitConflictError, match=r"'run-a' step 3 .* last committed step 4"):
        ledger.commit(checkpoint(3), consumption())
    assert [c.step for c in ledger.checkpoints("run-a")] == [4]
    assert ledger.consumption().num_rows == 0


def test_steps_of_different_runs_do_not_conflict(ledger: Ledger) -> None:
    ledger.commit(checkpoint(9, run_id="run-a"))
    ledger.commit(checkpoint(1, run_id="run-b"))
    assert len(ledger.checkpoints()) == 2


# -- atomicity --------------------------------------------------------------------------------


def test_a_commit_that_did_not_land_leaves_no_rows_and_no_files(
    backend: Backend, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger.commit(checkpoint(1), consumption())
    rows, files = ledger.to_arrow().num_rows, backend.parquet_files()

    def refuse(commit: Callable[[], Any]) -> Any:
        raise backend.race_lost

    backend.inject_commit_fault(monkeypatch, refuse)
    with pytest.raises(CommitConflictError, match=r"'run-a' step 2"):
        ledger.commit(checkpoint(2), consumption())
    monkeypatch.undo()

    assert ledger.to_arrow().num_rows == rows
    assert [c.step for c in ledger.checkpoints()] == [1]
    assert backend.parquet_files() == files


def test_a_commit_that_landed_but_reported_an_error_is_settled_by_retrying_it(
    backend: Backend, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    def land_then_fail(commit: Callable[[], Any]) -> Any:
        commit()
        raise OSError("injected: connection reset after the commit")

    backend.inject_commit_fault(monkeypatch, land_then_fail)
    with pytest.raises(CommitStateUnknownError, match=r"'run-a' step 2 .*may or may not"):
        ledger.commit(checkpoint(2), consumption())
    monkeypatch.undo()

    retried = backend.open().commit(checkpoint(2), consumption())
    assert ledger.checkpoints() == [retried]
    assert ledger.consumption().num_rows == 8


# -- one writer per run (owned commits, claims, retirement) ---------------------------------


def owned(step: int, parent: str | None, checkpoint_id: str | None = None) -> CheckpointRecord:
    return replace(checkpoint(step, checkpoint_id), parent_id=parent)


def test_a_claim_fences_the_previous_owner_and_the_new_owner_builds_on_its_head(
    ledger: Ledger,
) -> None:
    first = ledger.commit(owned(1, None), owner="111")
    ledger.commit(owned(2, first.checkpoint_id), owner="111")
    ledger.claim("run-a", "222", [LedgerEvent("restore", {"step": 2})],
                 head="run-a-ckpt-2")
    with pytest.raises(RunFencedError, match=r"run 'run-a' is owned by job 222 now"):
        ledger.commit(owned(3, "run-a-ckpt-2"), owner="111")
    third = ledger.commit(owned(3, "run-a-ckpt-2"), owner="222")
    assert [c.step for c in ledger.checkpoints("run-a")] == [1, 2, 3]
    assert third.parent_id == "run-a-ckpt-2"
    with pytest.raises(CommitConflictError, match=r"builds on checkpoint 'run-a-ckpt-1', but "
                       r"the run's newest checkpoint is 'run-a-ckpt-3' \(step 3\)"):
        ledger.commit(owned(4, "run-a-ckpt-1"), owner="222")


def test_a_claim_lands_only_while_its_checkpoint_is_the_runs_newest(ledger: Ledger) -> None:
    ledger.commit(owned(1, None), owner="111")
    ledger.commit(owned(2, "run-a-ckpt-1"), owner="111")
    with pytest.raises(CommitConflictError, match=r"moved on while job 222 was restoring "
                       r"checkpoint 'run-a-ckpt-1' \(its newest is now 'run-a-ckpt-2'\)"):
        ledger.claim("run-a", "222", [], head="run-a-ckpt-1")
    ledger.commit(owned(3, "run-a-ckpt-2"), owner="111")  # still the owner


def test_a_retired_checkpoint_is_not_committed_and_its_step_can_be_committed_again(
    ledger: Ledger,
) -> None:
    ledger.commit(owned(5, None), owner="111")
    ledger.commit(owned(10, "run-a-ckpt-5"), owner="111")
    retire = LedgerEvent("retired", {"checkpoint_id": "run-a-ckpt-10", "step": 10,
                                     "reason": "model files fail verification"})
    ledger.claim("run-a", "222", [retire], head="run-a-ckpt-5")
    assert [c.step for c in ledger.checkpoints("run-a")] == [5]
    again = ledger.commit(owned(10, "run-a-ckpt-5", "run-a-ckpt-10b"), owner="222")
    assert [c.checkpoint_id for c in ledger.checkpoints("run-a")] == [
        "run-a-ckpt-5", again.checkpoint_id]
    assert ledger.scan("run-a").retired == frozenset({"run-a-ckpt-10"})


# -- concurrency ------------------------------------------------------------------------------


def _settle_in_lockstep(monkeypatch: pytest.MonkeyPatch, ledgers: list[Ledger]) -> None:
    """Make every committer finish its check before any of them commits.

    Without this the second committer usually sees the first one's commit in its check, and
    the race that the commit condition exists for is never run.
    """
    barrier = threading.Barrier(len(ledgers), timeout=20)
    for handle in ledgers:
        real = handle._settle  # type: ignore[attr-defined]
        calls = iter(range(1_000))

        def gated(record: CheckpointRecord, owner: str | None = None, real: Any = real,
                  calls: Any = calls) -> Any:
            result = real(record, owner)
            if next(calls) == 0:
                barrier.wait()
            return result

        monkeypatch.setattr(handle, "_settle", gated)


def _commit_all(
    commits: list[tuple[Ledger, CheckpointRecord]],
) -> list[CheckpointRecord | CommitConflictError]:
    def run(job: tuple[Ledger, CheckpointRecord]) -> CheckpointRecord | CommitConflictError:
        handle, record = job
        try:
            return handle.commit(record, consumption())
        except CommitConflictError as e:
            return e

    with ThreadPoolExecutor(len(commits)) as pool:
        return list(pool.map(run, commits))


def test_two_committers_of_one_run_and_step_race_and_exactly_one_wins(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = backend.open(), backend.open()
    first.commit(checkpoint(1))
    _settle_in_lockstep(monkeypatch, [first, second])

    outcomes = _commit_all([(first, checkpoint(2, "ckpt-x")), (second, checkpoint(2, "ckpt-y"))])

    winners = [o for o in outcomes if isinstance(o, CheckpointRecord)]
    losers = [o for o in outcomes if isinstance(o, CommitConflictError)]
    assert len(winners) == 1 and len(losers) == 1
    assert "'run-a' step 2" in str(losers[0])
    assert "ckpt-x" in str(losers[0]) and "ckpt-y" in str(losers[0])
    fresh = backend.open()
    assert [c.checkpoint_id for c in fresh.checkpoints() if c.step == 2] == [
        winners[0].checkpoint_id
    ]
    assert set(fresh.consumption()["checkpoint_id"].to_pylist()) == {winners[0].checkpoint_id}


def test_two_committers_of_one_checkpoint_race_and_both_get_the_stored_record(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = backend.open(), backend.open()
    _settle_in_lockstep(monkeypatch, [first, second])

    outcomes = _commit_all([(first, checkpoint(2)), (second, checkpoint(2))])

    assert all(isinstance(o, CheckpointRecord) for o in outcomes)
    assert outcomes[0] == outcomes[1]
    assert backend.open().consumption().num_rows == 8


def test_committers_of_different_runs_race_and_both_land(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = backend.open(), backend.open()
    _settle_in_lockstep(monkeypatch, [first, second])

    outcomes = _commit_all(
        [(first, checkpoint(1, run_id="run-a")), (second, checkpoint(1, run_id="run-b"))]
    )

    assert all(isinstance(o, CheckpointRecord) for o in outcomes)
    assert [c.run_id for c in backend.open().checkpoints()] == ["run-a", "run-b"]


# -- format and maintenance -------------------------------------------------------------------


def test_a_ledger_of_another_format_version_is_refused_naming_both_versions(
    backend: Backend, ledger: Ledger
) -> None:
    backend.stamp_format("1")
    with pytest.raises(
        LedgerError, match=rf"format version 1, .* format version {LEDGER_FORMAT_VERSION}"
    ):
        backend.open()


def test_compact_keeps_every_row_and_conflicts_are_still_detected(ledger: Ledger) -> None:
    for step in range(1, 7):
        ledger.commit(checkpoint(step), consumption(ranks=2, offset=step * 100))
    ledger.record_events("run-b", [LedgerEvent("segment_formed", {"segment": 1})])
    before = sorted_rows(ledger.to_arrow())

    ledger.compact()

    assert sorted_rows(ledger.to_arrow()) == before
    with pytest.raises(CommitConflictError, match="step 5 is already committed"):
        ledger.commit(checkpoint(5, "ckpt-late"))
    assert ledger.commit(checkpoint(7)).step == 7


# -- open_ledger ------------------------------------------------------------------------------


def test_open_ledger_defaults_to_a_delta_ledger_under_the_checkpoint_root(tmp_path: Path) -> None:
    ledger = open_ledger(None, root=f"{tmp_path}/")
    assert ledger.describe() == f"delta:{tmp_path}/_ledger"
    assert DeltaTable.is_deltatable(f"{tmp_path}/_ledger")


def test_open_ledger_accepts_delta_and_iceberg_specs_and_ledgers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    delta = open_ledger(f"delta:{tmp_path}/elsewhere", root=str(tmp_path))
    assert delta.describe() == f"delta:{tmp_path}/elsewhere"
    assert open_ledger(delta, root=str(tmp_path)) is delta

    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=tmp_path.as_uri())
    monkeypatch.setattr(iceberg_sources, "default_catalog", lambda: catalog)
    iceberg = open_ledger("iceberg:ml.ledger", root=str(tmp_path))
    assert iceberg.describe().startswith("iceberg:ml.ledger")


def test_open_ledger_refuses_an_unknown_spec_naming_the_accepted_forms(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="'hudi:/x' is not understood: use 'delta:<uri>'"):
        open_ledger("hudi:/x", root=str(tmp_path))


# -- records ----------------------------------------------------------------------------------


def test_records_refuse_values_no_ledger_row_could_mean() -> None:
    with pytest.raises(ValueError, match="step must be >= 0"):
        checkpoint(-1)
    with pytest.raises(ValueError, match=r"range \[5, 4\) of f.parquet row group 0"):
        ConsumptionRecord(0, 0, 0, 0, "f.parquet", 0, row_start=5, row_end=4)
    with pytest.raises(ValueError, match=r"11 rows consumed of range \[0, 10\)"):
        ConsumptionRecord(0, 0, 0, 0, "f.parquet", 0, row_start=0, row_end=10, rows=11)


def test_consumption_rows_default_to_the_whole_range_and_may_be_a_subset(ledger: Ledger) -> None:
    whole = ConsumptionRecord(0, 0, 0, 0, "f.parquet", 3, row_start=10, row_end=20)
    part = ConsumptionRecord(1, 0, 0, 0, "f.parquet", 4, row_start=0, row_end=64, rows=17)
    assert whole.rows == 10
    ledger.commit(checkpoint(1), [whole, part])
    assert ledger.consumption()["rows"].to_pylist() == [10, 17]


# -- consumption sealed by the ranks (NOTE [ consumption sealed where made ]) ---------------------


def _sealed(records: list[ConsumptionRecord], at: datetime, step: int = 1,
            owner: str | None = "42") -> SealedConsumption:
    return SealedConsumption.of(records, run_id="run-a", checkpoint_id=f"run-a-ckpt-{step}",
                                step=step, committed_at=at, owner=owner)


def test_sealed_consumption_commits_the_rows_records_would(ledger: Ledger) -> None:
    at = datetime(2026, 11, 25, 20, 0, 0, 123456, tzinfo=UTC)
    records = [*consumption(3), ConsumptionRecord(0, 1, 0, 1, "dé\"jà.parquet", 0, 0, 9, rows=4,
                                                   source_key="web", tokens=2**40)]
    events = [LedgerEvent("round", {"round": 0})]
    parts = [_sealed(records[:2], at), _sealed([], at), _sealed(records[2:], at)]  # 3 ranks
    first = replace(checkpoint(1), parent_id=None)
    stored = ledger.commit(first, SealedConsumption.joined(parts), events, owner="42")
    assert stored.committed_at == at  # fixed before the ranks sealed, not at the commit
    assert [c.checkpoint_id for c in ledger.checkpoints("run-a")] == ["run-a-ckpt-1"]
    expected = commit_rows(replace(first, committed_at=at), records, events, owner="42")
    order = [("record", "ascending"), ("rank", "ascending"), ("worker", "ascending")]
    assert rows_of(ledger, "run-a-ckpt-1").sort_by(order).to_pylist() == \
        expected.sort_by(order).to_pylist()  # checksums included: byte for byte


def test_consumption_sealed_for_another_commit_is_refused_and_nothing_is_written(
        ledger: Ledger) -> None:
    at = datetime(2026, 11, 25, 20, 0, tzinfo=UTC)
    with pytest.raises(ValueError, match="consumption sealed for different commits"):
        SealedConsumption.joined([_sealed(consumption(1), at), _sealed(consumption(1), at, 2)])
    with pytest.raises(ValueError, match="consumption sealed for another commit"):
        ledger.commit(replace(checkpoint(1), parent_id=None),
                      _sealed(consumption(2), at, owner="7"), owner="42")
    assert ledger.checkpoints("run-a") == []
    assert ledger.to_arrow().num_rows == 0
