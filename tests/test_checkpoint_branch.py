"""Branching a run from another run's checkpoint (issue 32, item 3): one call, the lineage in
the ledger, and every audit following it; a rewind inside a run is refused up front.

One module fixture trains run "p" to step 9 (of 12), then branches run "c" from p's step 3
with its reader going on from p's position (a rewind), and run "w" from p's newest with a
fresh reader (a warm start on a second pass of the table); the tests read what they left.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from deltalake import WriterProperties, write_deltalake
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.audit import connect, rows, verify
from lakeckpt_tables.audit.where import exposure, trained_on
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.cli import main
from lakeckpt_tables.errors import CheckpointRestoreError
from lakeckpt_tables.ledger import CheckpointRecord, DeltaLedger

ROWS, BATCH = 48, 4


@dataclass
class Lineage:
    root: Path
    table: str
    p: list[int]  # ids p trained, in order (to step 9)
    c: list[int]  # ids c trained after branching from p's step 3
    w: list[int]  # ids w trained (steps 10-15) after branching from p's step 9, reader afresh
    events_of_p: int  # p's ledger rows when c and w had branched
    owner_of_p: str


def _loader(table: str) -> StatefulDataLoader:
    return StatefulDataLoader(LakeDataset(DeltaSource(table), batch_size=BATCH, seed=7,
                                          shuffle_window=2), batch_size=None)


def _train(root: Path, table: str, run_id: str, *, stop: int | None = None,
           continued: bool = True, **branch: Any) -> tuple[CheckpointManager, list[int]]:
    model, loader = torch.nn.Linear(1, 1), _loader(table)
    manager = CheckpointManager(root, run_id)
    step = manager.restore(model=model, dataloader=loader if continued else None,
                           **branch) or 0
    ids: list[int] = []
    for batch in loader:
        step += 1
        ids += batch["id"].tolist()
        if step % 3 == 0:
            manager.save(step, model=model, dataloader=loader)
        if step == stop:
            break
    return manager, ids


@pytest.fixture(scope="module")
def lineage(tmp_path_factory: pytest.TempPathFactory) -> Lineage:
    base = tmp_path_factory.mktemp("branch")
    table = str(base / "t")
    write_deltalake(table, pa.table({"id": np.arange(ROWS), "user": np.arange(ROWS) % 5}),
                    writer_properties=WriterProperties(max_row_group_size=8))
    root = base / "ckpt"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LAKECKPT_REGISTRY", "off")
        p, p_ids = _train(root, table, "p", stop=9)
        _, c_ids = _train(root, table, "c", from_run="p", step=3)
        _, w_ids = _train(root, table, "w", stop=15, continued=False, from_run="p")
    ledger = DeltaLedger(str(root / "_ledger"))
    mine = ledger.to_arrow().filter(pa.compute.field("run_id") == "p").num_rows
    return Lineage(root, table, p_ids, c_ids, w_ids, mine, p.owner)


@pytest.fixture(autouse=True)
def _no_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKECKPT_REGISTRY", "off")


def _records(root: Path, run_id: str) -> list[CheckpointRecord]:
    return DeltaLedger(str(root / "_ledger")).checkpoints(run_id)


def test_a_branch_goes_on_from_the_parents_checkpoint_and_records_its_lineage(
        lineage: Lineage) -> None:
    uninterrupted = [i for b in _loader(lineage.table) for i in b["id"].tolist()]
    assert lineage.p == uninterrupted[:9 * BATCH]
    assert lineage.p[:3 * BATCH] + lineage.c == uninterrupted  # exactly once, from step 3
    assert [r.step for r in _records(lineage.root, "c")] == [6, 9, 12]
    assert [r.step for r in _records(lineage.root, "w")] == [12, 15]
    assert _records(lineage.root, "c")[0].parent_id is None  # its run's first
    ledger = DeltaLedger(str(lineage.root / "_ledger"))
    (branch,) = [e.detail for e in ledger.events("c", "branch")]
    at_3 = _records(lineage.root, "p")[0]
    assert (branch["parent_run"], branch["parent_checkpoint_id"], branch["parent_step"],
            branch["reader"]) == ("p", at_3.checkpoint_id, 3, "continued")
    (fresh,) = [e.detail for e in ledger.events("w", "branch")]
    assert (fresh["parent_step"], fresh["reader"]) == (9, "fresh")
    assert lineage.w == uninterrupted[:6 * BATCH]  # its own reader, from the start
    # the parent was only read: no event, no owner change
    p_rows = ledger.to_arrow().filter(pa.compute.field("run_id") == "p").num_rows
    assert (p_rows, ledger.owner("p")) == (lineage.events_of_p, lineage.owner_of_p)


def test_audits_follow_the_lineage_across_runs(lineage: Lineage) -> None:
    root = lineage.root
    c_last = _records(root, "c")[-1]
    whole = rows(root, checkpoint=c_last.checkpoint_id, cumulative=True)
    keys = list(zip(whole["file"].to_pylist(), whole["row_group"].to_pylist(),
                    whole["row"].to_pylist(), strict=True))
    assert len(keys) == len(set(keys)) == ROWS  # p's rows to step 3, then c's: each once
    assert rows(root, checkpoint=_records(root, "c")[0].checkpoint_id).num_rows == 3 * BATCH
    (verdict,) = verify(root, run="c")
    assert verdict.violations == [] and verdict.rows == ROWS and verdict.checkpoints == 4
    w_first = _records(root, "w")[0]
    carried = rows(root, checkpoint=w_first.checkpoint_id, cumulative=True)
    assert carried.num_rows == 9 * BATCH + 3 * BATCH  # p's three checkpoints, then w's own
    (w_verdict,) = verify(root, run="w")  # its reader's own: p's rows are not its pass
    assert w_verdict.violations == [] and w_verdict.rows == 6 * BATCH

    matches = trained_on(root, "user = 3")
    by_run = {e.run_id: e for e in exposure(root, matches)}
    assert by_run["c"].inherited_from == ["p"] and by_run["w"].inherited_from == ["p"]
    assert len(by_run["c"].exposed) == 3 and len(by_run["w"].exposed) == 2


def test_the_runs_view_the_report_and_the_audit_command_show_the_tree(
        lineage: Lineage, capsys: pytest.CaptureFixture[str]) -> None:
    from lakeckpt_tables.audit.report import render_report

    con = connect(str(lineage.root))
    assert con.sql("SELECT run_id, parent_run, parent_step FROM runs ORDER BY run_id"
                   ).fetchall() == [("c", "p", 3), ("p", None, None), ("w", "p", 9)]
    # c's reader went on from p's step 3 to the end: with p's rows up to there, its pass is
    # done and it is finished; w's fresh reader has its own pass half read
    assert con.sql("SELECT run_id, state, rows_consumed FROM progress ORDER BY run_id"
                   ).fetchall() == [("c", "done", ROWS), ("p", "running", 9 * BATCH),
                                    ("w", "running", 6 * BATCH)]
    assert con.sql("SELECT state FROM runs WHERE run_id = 'c'").fetchall() == [("finished",)]
    page = render_report(con, title="t")
    runs = page[page.index('id="runs-table"'):page.index('id="progress"')]
    assert runs.index("<td>p</td>") < runs.index("<td>└ c</td>") < runs.index("<td>└ w</td>")
    assert "<td>p @ step 3</td>" in runs
    assert main(["audit", str(lineage.root), "--where", "user = 3", "--output", "json"]) == 0
    shown = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert shown["w"]["inherited_from"] == ["p"]


def test_a_rewind_inside_a_run_is_refused_up_front_with_the_fix_named(
        lineage: Lineage) -> None:
    ledger = DeltaLedger(str(lineage.root / "_ledger"))
    before = ledger.to_arrow().num_rows
    with pytest.raises(CheckpointRestoreError,
                       match=r"run p: step 3 .* is not the run's newest checkpoint \(step 9\)"
                             r".*read_only=True.*from_run='p', step=3"):
        CheckpointManager(lineage.root, "p").restore(model=torch.nn.Linear(1, 1), step=3)
    with pytest.raises(CheckpointRestoreError, match=r"run c already has checkpoints .* not "
                       r"branched from run 'w'"):
        CheckpointManager(lineage.root, "c").restore(model=torch.nn.Linear(1, 1),
                                                     from_run="w")
    assert ledger.to_arrow().num_rows == before
    # asked for by step, the newest is a restore like any other: no fallback recorded
    again = CheckpointManager(lineage.root, "p")
    assert again.restore(model=torch.nn.Linear(1, 1), step=9) == 9
    (restore,) = [e.detail for e in ledger.events("p", "restore")]
    assert (restore["explicit"], restore["fallback"]) == (True, False)
    assert connect(str(lineage.root)).sql(
        "SELECT fallback FROM recoveries WHERE run_id = 'p'").fetchall() == [(False,)]


def test_a_branched_run_relaunched_with_the_same_call_goes_on_from_its_own_checkpoint(
        lineage: Lineage, tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "ckpt"
    shutil.copytree(lineage.root, root)
    model = torch.nn.Linear(1, 1)
    loader = _loader(lineage.table)
    assert CheckpointManager(root, "w").restore(model=model, dataloader=loader,
                                                from_run="p") == 15
    assert [i for b in loader for i in b["id"].tolist()] == \
        [i for b in _loader(lineage.table) for i in b["id"].tolist()][6 * BATCH:]


def test_lakeckpt_runs_lists_a_branched_run_under_its_parent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from lakeckpt_tables.checkpoint import registration

    monkeypatch.setenv("LAKECKPT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LAKECKPT_REGISTRY")
    model = torch.nn.Linear(1, 1)
    for run_id in ("a-parent", "z-other"):
        CheckpointManager(tmp_path / "ckpt", run_id).save(1, model=model)
    child = CheckpointManager(tmp_path / "ckpt", "b-child")
    assert child.restore(model=model, from_run="z-other") == 1
    child.save(2, model=model)
    assert registration.flush()
    assert main(["runs", "--output", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(r["run_id"], r["parent"]) for r in shown] == [
        ("a-parent", ""), ("z-other", ""), ("b-child", "z-other@1")]
    assert main(["runs"]) == 0
    table = capsys.readouterr().out
    assert table.index("z-other") < table.index("└ b-child")
