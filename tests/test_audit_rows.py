"""``audit.rows`` recomputes, row for row, what each checkpoint of a real run trained on."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from audit_helpers import ROWS, SimulatedRun, id_of, write_table

from lakeckpt_tables.audit import rows
from lakeckpt_tables.errors import LedgerError
from lakeckpt_tables.ledger import DeltaLedger


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("src") / "t"
    write_table(path)
    return path


def _ids(table: object) -> list[int]:
    t = table.to_pylist()  # type: ignore[attr-defined]
    return [id_of(r["file"], r["row_group"], r["row"]) for r in t]


def test_rows_of_each_checkpoint_are_the_ids_its_ranks_yielded_inside_shuffled_windows(
        table: Path, tmp_path: Path) -> None:
    ledger = DeltaLedger(str(tmp_path / "_ledger"))
    run = SimulatedRun(table, ledger, "shuffled", world=2, batch=7, window=3, epochs=2)
    # checkpoints every 5 lockstep steps of 2 x 7 rows: they fall inside 3-row-group windows
    while run.train(5):
        run.checkpoint()
    run.checkpoint()
    assert len(run.run.records) >= 3
    for record in run.run.records:
        got = rows(tmp_path, checkpoint=record.checkpoint_id)
        assert Counter(_ids(got)) == Counter(run.run.ids[record.checkpoint_id])
    total = Counter(_ids(rows(tmp_path, checkpoint=run.run.records[-1].checkpoint_id,
                               cumulative=True)))
    assert total == Counter(list(range(ROWS)) * 2)


def test_rows_follow_the_emission_order_of_each_rank(table: Path, tmp_path: Path) -> None:
    ledger = DeltaLedger(str(tmp_path / "_ledger"))
    run = SimulatedRun(table, ledger, "order", world=2, batch=5, window=2)
    run.train(3)
    first = run.checkpoint()
    got = rows(tmp_path, checkpoint=first.checkpoint_id).to_pylist()
    by_rank = [[id_of(r["file"], r["row_group"], r["row"]) for r in got if r["rank"] == k]
               for k in (0, 1)]
    yielded = run.run.ids[first.checkpoint_id]
    # pending interleaves the ranks batch by batch: rank 0's 5 rows, then rank 1's
    assert by_rank[0] == [i for b in range(3) for i in yielded[10 * b:10 * b + 5]]
    assert by_rank[1] == [i for b in range(3) for i in yielded[10 * b + 5:10 * b + 10]]


def test_rows_after_an_elastic_resume_replay_the_replanned_remainder(
        table: Path, tmp_path: Path) -> None:
    ledger = DeltaLedger(str(tmp_path / "_ledger"))
    run = SimulatedRun(table, ledger, "elastic", world=2, batch=6, window=3)
    run.train(4)
    run.checkpoint()
    run.train(3)
    run.checkpoint()
    run.train(2)  # lost: never checkpointed
    run.resize(3)
    run.train(4)
    resumed = run.checkpoint()
    assert resumed.world_size == 3
    got = rows(tmp_path, checkpoint=resumed.checkpoint_id)
    assert Counter(_ids(got)) == Counter(run.run.ids[resumed.checkpoint_id])
    while run.train(10):
        pass
    last = run.checkpoint()
    everything = Counter(_ids(rows(tmp_path, checkpoint=last.checkpoint_id, cumulative=True)))
    assert everything == Counter(range(ROWS))


def test_an_unknown_checkpoint_is_named_and_a_prefix_is_enough(
        table: Path, tmp_path: Path) -> None:
    ledger = DeltaLedger(str(tmp_path / "_ledger"))
    run = SimulatedRun(table, ledger, "p")
    run.train(2)
    record = run.checkpoint()
    with pytest.raises(LedgerError, match="no checkpoint with id 'nope'"):
        rows(tmp_path, checkpoint="nope")
    assert rows(tmp_path, checkpoint=record.checkpoint_id[:10]).num_rows == 2 * 2 * 7


def test_rows_and_verify_of_a_follow_run_across_segments(tmp_path: Path) -> None:
    """Follow mode: the snapshot, then segments of appended rows, rows replayed per segment."""
    import numpy as np
    import pyarrow as pa
    from audit_helpers import SimulatedRun
    from deltalake import DeltaTable, WriterProperties, write_deltalake

    from lakeckpt_tables.audit import connect, verify

    source = tmp_path / "grows"
    props = WriterProperties(max_row_group_size=20)
    for lo in range(0, 300, 60):  # versions 0..4: 60 rows each
        ids = np.arange(lo, lo + 60, dtype=np.int64)
        write_deltalake(str(source), pa.table({"id": ids, "user_id": ids % 50}), mode="append",
                        writer_properties=props)
    run = SimulatedRun(source, DeltaLedger(str(tmp_path / "_ledger")), "follow", world=2, batch=5,
                 window=2, version=1, follow=True, until_version=4, min_segment_rows=60)
    while run.train(7):
        run.checkpoint()
    if run.pending:
        run.checkpoint()
    assert DeltaTable(str(source)).version() == 4
    for record in run.run.records:
        got = rows(tmp_path, checkpoint=record.checkpoint_id)
        assert Counter(_ids(got)) == Counter(run.run.ids[record.checkpoint_id])
    assert sorted(i for ids in run.run.ids.values() for i in ids) == list(range(300))
    con = connect(str(tmp_path))
    assert con.sql("SELECT segment, rows_consumed, rows_in_pass, from_version, to_version "
                   "FROM progress ORDER BY segment").fetchall() == [
        (0, 120, 120, None, 1), (1, 60, 60, 1, 2), (2, 60, 60, 2, 3), (3, 60, 60, 3, 4)]
    (verdict,) = verify(str(tmp_path))
    assert verdict.ok and verdict.finished_passes == [(0, 0), (1, 0), (2, 0), (3, 0)]


def test_rows_of_a_run_over_an_iceberg_table_with_an_iceberg_ledger(tmp_path: Path) -> None:
    """The source is found again in the ledger's catalog by its location."""
    import numpy as np
    import pyarrow as pa
    from audit_helpers import SimulatedRun
    from pyiceberg.catalog.sql import SqlCatalog

    from lakeckpt_tables import IcebergSource
    from lakeckpt_tables.ledger import IcebergLedger

    catalog = SqlCatalog("lakeckpt", uri=f"sqlite:///{tmp_path}/cat.db",
                         warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("data")
    ids = np.arange(300, dtype=np.int64)
    events = catalog.create_table("data.events", schema=pa.schema([("id", pa.int64())]),
                                  properties={"write.parquet.row-group-limit": "25"})
    for part in np.array_split(ids, 3):
        events.append(pa.table({"id": part}))
    run = SimulatedRun(lambda: IcebergSource("data.events", catalog=catalog),
                       IcebergLedger("ml.ledger", catalog=catalog), "ice", world=2, batch=6,
                       window=2)
    run.train(7)
    run.checkpoint()
    run.train(5)
    record = run.checkpoint()
    got = rows("iceberg:ml.ledger", checkpoint=record.checkpoint_id, catalog=catalog)
    assert Counter(_ids(got)) == Counter(run.run.ids[record.checkpoint_id])
