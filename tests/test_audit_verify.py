"""``audit.verify``: exactly-once proved from the ledger; damaged ledgers fail by name."""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest
from audit_helpers import ROWS, SimulatedRun, write_table
from deltalake import DeltaTable, write_deltalake

from lakeckpt_tables.audit import verify
from lakeckpt_tables.ledger import DeltaLedger


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("src") / "t"
    write_table(path)
    return path


def _finished_run(table: Path, root: Path, run_id: str = "done",
                  window: int = 3) -> SimulatedRun:
    run = SimulatedRun(table, DeltaLedger(str(root / "_ledger")), run_id, world=2, batch=7,
                       window=window, epochs=2)
    while run.train(6):
        run.checkpoint()
    run.checkpoint()
    return run


def test_a_finished_shuffled_run_of_two_ranks_verifies(table: Path, tmp_path: Path) -> None:
    run = _finished_run(table, tmp_path)
    (verdict,) = verify(str(tmp_path))
    assert verdict.violations == []
    assert verdict.ok
    assert verdict.finished_passes == [(0, 0), (0, 1)]
    assert verdict.rows == 2 * ROWS
    assert verdict.checkpoints == len(run.run.records)


def test_a_duplicated_consumption_record_is_an_overlap(table: Path, tmp_path: Path) -> None:
    _finished_run(table, tmp_path, window=1)
    uri = str(tmp_path / "_ledger")
    rows = DeltaTable(uri).to_pyarrow_dataset().to_table()
    consumption = rows.filter(pc.field("record") == "consumption")
    exact = consumption.filter(pc.equal(consumption["rows"],
                                        pc.subtract(consumption["row_end"],
                                                    consumption["row_start"])))
    assert exact.num_rows > 0  # whole windows were consumed between checkpoints
    copy = exact.slice(0, 1)
    write_deltalake(uri, copy, mode="append")
    (verdict,) = verify(str(tmp_path))
    assert not verdict.ok
    (rec,) = copy.to_pylist()
    assert verdict.violations[0].startswith(
        f"overlap: run done segment {rec['segment']} epoch {rec['epoch']}: {rec['file']} "
        f"row group {rec['row_group']} rows [{rec['row_start']}, {rec['row_end']}) consumed at "
        f"step {rec['step']} and again at step {rec['step']}")


def test_a_duplicated_partial_record_is_an_overlap(table: Path, tmp_path: Path) -> None:
    _finished_run(table, tmp_path)
    uri = str(tmp_path / "_ledger")
    rows = DeltaTable(uri).to_pyarrow_dataset().to_table()
    consumption = rows.filter(pc.field("record") == "consumption")
    partial = consumption.filter(pc.less(consumption["rows"],
                                         pc.subtract(consumption["row_end"],
                                                     consumption["row_start"])))
    assert partial.num_rows > 0  # checkpoints fell inside shuffled windows
    write_deltalake(uri, partial.slice(0, 1), mode="append")
    (verdict,) = verify(str(tmp_path))
    assert verdict.violations and verdict.violations[0].startswith("overlap: run done")


def test_a_missing_consumption_record_is_a_gap(table: Path, tmp_path: Path) -> None:
    _finished_run(table, tmp_path)
    uri = str(tmp_path / "_ledger")
    rows = DeltaTable(uri).to_pyarrow_dataset().to_table()
    rec = rows.filter(pc.field("record") == "consumption").slice(5, 1).to_pylist()[0]
    DeltaTable(uri).delete(
        f"record = 'consumption' AND file = '{rec['file']}' AND row_group = {rec['row_group']} "
        f"AND row_start = {rec['row_start']} AND step = {rec['step']} AND rank = {rec['rank']}")
    (verdict,) = verify(str(tmp_path))
    assert verdict.violations == [
        f"gap: run done segment {rec['segment']} epoch {rec['epoch']}: {rec['file']} row group "
        f"{rec['row_group']} gave {30 - rec['rows'] if rec['row_group'] < 3 else 10 - rec['rows']}"
        f" of its {30 if rec['row_group'] < 3 else 10} rows in a finished pass"]


def test_a_run_half_way_has_no_finished_pass_and_verifies(table: Path, tmp_path: Path) -> None:
    run = SimulatedRun(table, DeltaLedger(str(tmp_path / "_ledger")), "half", world=2,
                       batch=7, window=3)
    run.train(5)
    first = run.checkpoint()
    run.train(5)
    run.checkpoint()
    (verdict,) = verify(str(tmp_path), run="half")
    assert (verdict.ok, verdict.finished_passes, verdict.rows) == (True, [], 140)
    (upto,) = verify(str(tmp_path), checkpoint=first.checkpoint_id)
    assert (upto.ok, upto.step, upto.rows, upto.checkpoints) == (True, 5, 70, 1)


def test_training_lost_by_a_restore_to_an_older_checkpoint_is_not_an_overlap(
        table: Path, tmp_path: Path) -> None:
    run = SimulatedRun(table, DeltaLedger(str(tmp_path / "_ledger")), "lost", world=2,
                       batch=7, window=3)
    run.train(5)
    first = run.checkpoint()
    run.train(5)
    run.checkpoint()  # its rows are read again after the restore below
    run.restore(first)
    while run.train(6):
        run.checkpoint()
    if run.pending:
        run.checkpoint()
    (verdict,) = verify(str(tmp_path))
    assert verdict.violations == []
    assert verdict.rows == ROWS
    assert verdict.finished_passes == [(0, 0)]
