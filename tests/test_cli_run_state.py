"""Runs told truthfully: stale runs, removed checkpoints, steps lost, as a user sees them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from audit_helpers import write_table
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.audit import connect
from lakeckpt_tables.checkpoint import CheckpointManager, registration
from lakeckpt_tables.cli import main
from lakeckpt_tables.ledger import DeltaLedger, LedgerEvent

NEVER = "1000000x"  # a threshold no run of a test reaches
AT_ONCE = "0.000001x"  # one every run with two saves has passed


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("src") / "t"
    write_table(path)
    return path


def _train(table: Path, root: Path, run_id: str, saves: int, *, batch: int = 10,
           **kwargs: Any) -> list[Any]:
    """A run saving every step, stopped after ``saves`` saves as a SIGKILL would stop it."""
    loader = StatefulDataLoader(LakeDataset(DeltaSource(str(table)), batch_size=batch, seed=1),
                                batch_size=None)
    manager = CheckpointManager(root, run_id, **kwargs)
    model = torch.nn.Linear(1, 1)
    records = []
    for step, _ in enumerate(loader, start=1):
        records.append(manager.save(step, model=model, dataloader=loader))
        if step == saves:
            break
    return records


def _json(args: list[str], capsys: pytest.CaptureFixture[str]) -> Any:
    code = main([*args, "--output", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_a_run_that_stopped_saving_is_stale_in_progress_runs_and_the_report(
        table: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("LAKECKPT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LAKECKPT_REGISTRY", raising=False)
    root = tmp_path / "root"
    _train(table, root, "killed", 4)
    assert registration.flush()

    alive = _json(["progress", str(root), "--stale-after", NEVER], capsys)
    assert [(p["state"], p["rows_consumed"], p["rows_in_pass"]) for p in alive] == [
        ("running", 40, 400)]
    assert alive[0]["eta_s"] is not None and alive[0]["eta_s"] > 0
    dead = _json(["progress", str(root), "--stale-after", AT_ONCE], capsys)
    assert [(p["state"], p["eta_s"]) for p in dead] == [("stale", None)]  # no ETA for ever
    # a duration works as well as a multiple of the cadence
    assert _json(["progress", str(root), "--stale-after", "0s"], capsys)[0]["state"] == "stale"
    assert _json(["progress", str(root), "--stale-after", "1h"], capsys)[0]["state"] == \
        "running"

    # the registry still says running (a killed process reports nothing): runs checks the ledger
    listed = _json(["runs", "--stale-after", AT_ONCE], capsys)
    assert [(r["run_id"], r["status"], r["registered_status"]) for r in listed] == [
        ("killed", "stale", "running")]
    assert [r["run_id"] for r in _json(["runs", "--status", "stale", "--stale-after", AT_ONCE],
                                       capsys)] == ["killed"]
    assert _json(["runs", "--stale-after", NEVER], capsys)[0]["status"] == "running"

    # the default: 3 times the median save interval, and at least a minute
    (row,) = connect(str(root)).sql(
        "SELECT state, save_interval_s, stale_after_s, idle_s, last_step FROM runs").fetchall()
    state, interval, after, idle, last = row
    assert after == max(3 * interval, 60.0) and last == 4
    assert state == ("stale" if idle > after else "running")

    out = tmp_path / "r.html"
    assert main(["report", str(root), "-o", str(out), "--stale-after", AT_ONCE]) == 0
    page = out.read_text()
    assert page.count("<td>stale</td>") == 2  # the run, and its pass


def test_a_bad_stale_threshold_is_one_line_naming_the_forms(
        table: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    _train(table, root, "r", 1)
    assert main(["progress", str(root), "--stale-after", "soon"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'soon'" in err and "3x" in err and "10m" in err


def test_a_finished_event_ends_the_run_and_its_eta(table: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    _train(table, root, "ended", 3)
    DeltaLedger(str(root / "_ledger")).record_events("ended", [LedgerEvent("finished",
                                                                           {"step": 3})])
    shown = _json(["progress", str(root), "--stale-after", NEVER], capsys)
    assert [(p["state"], p["eta_s"]) for p in shown] == [("finished", None)]


def test_checkpoints_whose_model_files_retention_removed_are_not_listed_as_committed(
        table: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    records = _train(table, root, "kept", 5, keep_last=2)
    shown = _json(["checkpoints", str(root)], capsys)
    assert [(r["step"], r["status"], r["restorable"]) for r in shown] == [
        (1, "removed", False), (2, "removed", False), (3, "removed", False),
        (4, "committed", True), (5, "committed", True)]
    assert shown[0]["removed_reason"] == "retention"  # the manager records why it removed them
    assert shown[0]["checkpoint_id"] == records[0].checkpoint_id
    # what they trained still counts
    assert _json(["progress", str(root)], capsys)[0]["rows_consumed"] == 50


def test_steps_lost_count_the_steps_trained_after_the_restored_checkpoint(
        table: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    records = _train(table, root, "lost", 3)
    ledger = DeltaLedger(str(root / "_ledger"))
    third = records[-1]
    # the owner reached step 10 before it died; the newest checkpoint is step 3
    ledger.record_events("lost", [LedgerEvent("restore", {
        "checkpoint_id": third.checkpoint_id, "step": 3, "newest_step": 3, "steps_lost": 0,
        "reached_step": 10})])
    # a restore recorded without what the owner reached: the committed steps after it
    ledger.record_events("lost", [LedgerEvent("restore", {
        "checkpoint_id": records[0].checkpoint_id, "step": 1, "newest_step": 3,
        "steps_lost": 2})])
    got = connect(str(root)).sql(
        "SELECT step, newest_step, reached_step, steps_lost, fallback FROM recoveries "
        "ORDER BY restored_at").fetchall()
    assert got == [(3, 3, 10, 7, False), (1, 3, None, 2, True)]


def test_a_run_that_consumed_its_passes_is_finished_even_when_its_registry_says_running(
        table: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("LAKECKPT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LAKECKPT_REGISTRY", raising=False)
    root = tmp_path / "root"
    _train(table, root, "whole", 4, batch=100)  # 4 x 100 rows: the whole pass
    assert registration.flush()
    shown = _json(["progress", str(root), "--stale-after", AT_ONCE], capsys)
    assert [(p["state"], p["percent"], p["eta_s"]) for p in shown] == [("done", 100.0, 0.0)]
    listed = _json(["runs", "--stale-after", AT_ONCE], capsys)
    assert [(r["run_id"], r["status"], r["registered_status"]) for r in listed] == [
        ("whole", "finished", "running")]
