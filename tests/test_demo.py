"""``lakeckpt demo``: the end-to-end crash proof, and the checkers' ability to say no."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from lakeckpt_tables.cli import main
from lakeckpt_tables.sources import DeltaSource
from lakeckpt_tables.tools.demo import DemoError
from lakeckpt_tables.tools.demo.ledger_proof import IdLocator, check_coverage, matches_ids
from lakeckpt_tables.tools.demo.proof import delivered, prove_ids
from lakeckpt_tables.tools.demo.runner import Attempt
from lakeckpt_tables.tools.demo.scenario import choose_schedule, crash_spec, save_steps
from lakeckpt_tables.tools.demo.steplog import StepLog, read_steps
from lakeckpt_tables.tools.demo.table import build_table
from lakeckpt_tables.tools.demo.train import FINAL_PARAMS
from lakeckpt_tables.types import Unit

_CLI = "import sys; from lakeckpt_tables.cli import main; sys.exit(main())"


@pytest.mark.slow
@pytest.mark.timeout(300)  # the demo's own limit is 240 s: a real training child killed twice
# one crash point: the demo proves the user-facing path end to end; every crash point of the
# commit is covered in-process by test_checkpoint_crash.py
@pytest.mark.parametrize("point", ["prepare:mid_write"])
def test_demo_survives_a_kill_between_checkpoints_and_one_inside_a_save(
        tmp_path: Path, point: str) -> None:
    root = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-c", _CLI, "demo", "--rows", "5000", "--json", "--dir", str(root),
         "--save-crash", point],
        capture_output=True, timeout=240)
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr
    result = json.loads(done.stdout)
    first, second, third = result["attempts"]
    crash = result["crashes"]
    # attempt 1: SIGKILL from the parent between checkpoints
    assert first["killed"] and first["returncode"] == -signal.SIGKILL
    assert first["saving"] is None and first["last_step"] % result["training"][
        "checkpoint_every"]
    # attempt 2: SIGKILL at the crash point inside the save it was meant to die in
    assert not second["killed"] and second["returncode"] == -signal.SIGKILL
    assert second["died_in_save"] and second["saving"] == crash["save_crash_at"]
    assert second["crash_at"] == crash["crash_spec"] and crash["crash_spec"].startswith(
        f"{point}#")
    assert second["resumed_from"] > 0 and crash["save_crash_at"] not in second["committed"]
    assert third["returncode"] == 0 and third["resumed_from"] > second["resumed_from"]

    proof = result["proof"]
    assert proof["ok"]
    ids = proof["ids"]
    assert ids["ok"] and ids["exactly_once"]
    assert ids["rows_trained"] == ids["rows_total"] * ids["epochs"] == 5000 * 2
    assert ids["duplicated"] == ids["missing"] == 0
    assert [c["sigkilled"] for c in ids["crashes"]] == [True, True]
    assert [c["inside_save"] for c in ids["crashes"]] == [False, True]
    assert all(c["lost_steps"] > 0 and c["redelivered_exactly"] for c in ids["crashes"])
    assert ids["sequence_identical"] and ids["loss_identical"] and ids["params_identical"]

    ledger = proof["ledger"]
    assert ledger["ok"] and ledger["ids_agree"] and ledger["parent_chain"]
    coverage = ledger["coverage"]
    assert coverage["exactly_once"] and coverage["rows"] == coverage["rows_expected"] == 5000 * 2
    assert coverage["row_groups_exact"] == coverage["row_groups"] == 2 * result["table"][
        "row_groups"]
    assert coverage["gap_rows"] == coverage["overlap_rows"] == coverage["invalid_records"] == 0
    steps = [c["step"] for c in ledger["checkpoints"]]
    assert steps == sorted(steps) and steps[-1] == result["training"]["steps"]
    assert {c["attempt"] for c in ledger["checkpoints"]} == {1, 2, 3}
    assert sum(c["rows"] for c in ledger["checkpoints"]) == 5000 * 2
    aborted = ledger["aborted"]
    assert aborted["ok"] and aborted["attempt"] == 2 and aborted["crash_at"] == crash[
        "crash_spec"]
    assert aborted["step"] == crash["save_crash_at"] and aborted["recommitted_by"] == 3
    assert not aborted["named_in_ledger"] and aborted["committed_in_attempt"] == []
    assert len(aborted["leftovers"]) == 1 and aborted["files"] > 0
    assert aborted["metadata"] == (point == "commit:before")
    assert "\r" in stderr and "SIGKILL inside the save" in stderr  # the progress bar


@pytest.mark.parametrize("steps", [2, 3, 4, 16, 80, 782, 1564, 10_000])
def test_schedule_kills_between_checkpoints_then_inside_a_later_save(steps: int) -> None:
    s = choose_schedule(steps, None, None, None)
    assert 1 <= s.kill_at < steps and s.kill_at % s.checkpoint_every
    assert s.save_crash_at in save_steps(steps, s.checkpoint_every)
    assert s.save_crash_at > s.kill_at // s.checkpoint_every * s.checkpoint_every
    if steps >= 16:
        every = s.checkpoint_every
        assert every % 2 == 1 and (s.kill_at // every) % 2 == 1
        assert s.kill_at < s.save_crash_at


def test_schedule_refuses_what_cannot_crash() -> None:
    with pytest.raises(DemoError, match="--rows"):
        choose_schedule(1, None, None, None)
    with pytest.raises(DemoError, match="--kill-at must be between"):
        choose_schedule(100, 10, 100, None)
    with pytest.raises(DemoError, match="race the save"):
        choose_schedule(100, 10, 30, None)
    with pytest.raises(DemoError, match="--checkpoint-every"):
        choose_schedule(100, 1, None, None)
    with pytest.raises(DemoError, match="--save-crash-at"):
        choose_schedule(100, 10, 35, 30)  # attempt 2 resumes from 30: it never saves 30
    with pytest.raises(DemoError, match="--save-crash-at"):
        choose_schedule(100, 10, 35, 45)  # not a save step
    assert choose_schedule(100, 10, 35, 100).save_crash_at == 100


def test_crash_spec_counts_the_attempts_saves() -> None:
    assert save_steps(25, 10) == [10, 20, 25]
    assert crash_spec("commit:before", 20, 10, 25, 10) == "commit:before#1"
    assert crash_spec("prepare:mid_write", 25, 0, 25, 10) == "prepare:mid_write#3"
    with pytest.raises(DemoError, match="kill landed late"):
        crash_spec("commit:before", 20, 20, 25, 10)


def test_cli_reports_bad_options_as_errors(tmp_path: Path) -> None:
    (tmp_path / "junk").write_text("x")
    assert main(["demo", "--rows", "100", "--dir", str(tmp_path)]) == 2
    assert main(["demo", "--rows", "100", "--epochs", "0", "--dir", str(tmp_path / "new")]) == 2


def test_step_log_ignores_a_record_cut_by_the_crash(tmp_path: Path) -> None:
    path = tmp_path / "a.steps"
    with StepLog(path) as log:
        log.write(1, 0.5, np.arange(4))
        log.write(2, 0.25, np.arange(4, 8))
    path.write_bytes(path.read_bytes()[:-3])
    records = read_steps(path)
    assert [r.step for r in records] == [1]
    assert records[0].loss == 0.5 and records[0].ids.tolist() == [0, 1, 2, 3]


def _run(tmp_path: Path, name: str, number: int, resumed_from: int,
         steps: dict[int, list[int]], returncode: int = 0) -> Attempt:
    run_dir = tmp_path / name
    run_dir.mkdir(exist_ok=True)
    attempt = Attempt(run_dir, number, resumed_from, max(steps), returncode,
                      returncode != 0, 0.0)
    with StepLog(attempt.step_log) as log:
        for step, ids in steps.items():
            log.write(step, float(step), np.array(ids))
    torch.save({"w": torch.ones(2)}, run_dir / FINAL_PARAMS)
    return attempt


def test_delivered_drops_steps_lost_with_each_crash(tmp_path: Path) -> None:
    first = _run(tmp_path, "crash", 1, 0, {1: [0, 1], 2: [2, 3], 3: [4, 5]})
    second = _run(tmp_path, "crash", 2, 2, {3: [4, 5], 4: [6, 7], 5: [8, 9]})
    third = _run(tmp_path, "crash", 3, 4, {5: [8, 9], 6: [0, 1]})
    assert [r.step for r in delivered([first, second, third])] == [1, 2, 3, 4, 5, 6]


def test_id_proof_holds_over_epochs_and_crashes(tmp_path: Path) -> None:
    steps = {1: [0, 1], 2: [2, 3], 3: [3, 0], 4: [2, 1]}  # 4 rows, 2 epochs
    ref = _run(tmp_path, "ref", 1, 0, steps)
    first = _run(tmp_path, "crash", 1, 0, {k: steps[k] for k in (1, 2, 3)}, -signal.SIGKILL)
    second = _run(tmp_path, "crash", 2, 1, {k: steps[k] for k in (2, 3)}, -signal.SIGKILL)
    third = _run(tmp_path, "crash", 3, 2, {k: steps[k] for k in (3, 4)})
    proof = prove_ids(4, 2, ref, [first, second, third])
    assert proof.ok and proof.exactly_once and proof.rows_trained == 8
    assert [(c.restored_step, c.lost_steps) for c in proof.crashes] == [(1, 2), (2, 1)]
    assert all(c.redelivered_exactly for c in proof.crashes)


def test_id_proof_says_no_when_the_resume_repeats_a_row(tmp_path: Path) -> None:
    ref = _run(tmp_path, "ref", 1, 0, {1: [0, 1], 2: [2, 3], 3: [4, 5], 4: [6, 7]})
    first = _run(tmp_path, "crash", 1, 0, {1: [0, 1], 2: [2, 3], 3: [4, 5]}, -signal.SIGKILL)
    second = _run(tmp_path, "crash", 2, 2, {3: [4, 5], 4: [6, 1]})
    proof = prove_ids(8, 1, ref, [first, second])
    assert proof.crashes[0].sigkilled and proof.crashes[0].redelivered_exactly
    assert proof.params_identical
    assert (proof.duplicated, proof.missing) == (1, 1)
    assert not proof.exactly_once and not proof.sequence_identical and not proof.ok


_UNITS = (Unit("a.parquet", 0, 10), Unit("a.parquet", 1, 6))


def _consumption(*records: tuple[int, str, int, int, int, int]) -> pa.Table:
    names = ["epoch", "file", "row_group", "row_start", "row_end", "rows"]
    return pa.table({n: [r[i] for r in records] for i, n in enumerate(names)})


def test_coverage_accepts_exact_ranges_and_windows_split_by_a_checkpoint() -> None:
    cov = check_coverage(_consumption(
        (0, "a.parquet", 0, 0, 4, 4), (0, "a.parquet", 0, 4, 10, 6),
        (0, "a.parquet", 1, 0, 6, 2), (0, "a.parquet", 1, 0, 6, 4)), _UNITS, 1)
    assert cov.exactly_once and cov.rows == cov.rows_expected == 16 and cov.exact_records == 2


def test_coverage_says_no_to_overlap_gap_and_invalid_records() -> None:
    overlap = check_coverage(_consumption(
        (0, "a.parquet", 0, 0, 6, 6), (0, "a.parquet", 0, 4, 8, 4),
        (0, "a.parquet", 1, 0, 6, 6)), _UNITS, 1)
    # rows add up to 16, but rows 4..6 twice and 8..10 never
    assert overlap.rows == 16 and not overlap.exactly_once
    assert overlap.overlap_rows == 2 and overlap.gap_rows == 0
    gap = check_coverage(_consumption((0, "a.parquet", 0, 0, 10, 10)), _UNITS, 1)
    assert gap.gap_rows == 6 and gap.row_groups_exact == 1 and not gap.exactly_once
    bad = check_coverage(_consumption(
        (0, "a.parquet", 0, 0, 10, 10), (0, "a.parquet", 1, 0, 6, 6),
        (0, "b.parquet", 0, 0, 1, 1), (1, "a.parquet", 0, 0, 1, 1),
        (0, "a.parquet", 1, 4, 7, 3)), _UNITS, 1)
    assert bad.invalid_records == 3 and not bad.exactly_once
    epochs = check_coverage(_consumption(
        (0, "a.parquet", 0, 0, 10, 10), (0, "a.parquet", 1, 0, 6, 6)), _UNITS, 2)
    assert epochs.gap_rows == 16 and epochs.rows_expected == 32 and not epochs.exactly_once


def test_ledger_records_must_name_the_rows_the_trainer_saw(tmp_path: Path) -> None:
    info = build_table(tmp_path / "t", 40, appends=2)
    locator = IdLocator(DeltaSource(str(info.path)).snapshot().units)
    u = locator.units[0]
    ids = np.flatnonzero(locator.unit_of == 0)  # every row of the first row group
    whole = {"file": u.path, "row_group": u.row_group, "row_start": 0, "row_end": u.rows,
             "rows": u.rows}
    assert matches_ids([whole], ids, locator)
    assert not matches_ids([whole], ids[1:], locator)  # a row the ledger claims, never seen
    half = {**whole, "rows": u.rows // 2}  # a count inside a shuffled window
    assert matches_ids([half], ids[: u.rows // 2], locator)
    assert not matches_ids([half], ids, locator)
    other = locator.units[1]
    elsewhere = {**whole, "file": other.path, "row_group": other.row_group,
                 "row_end": other.rows, "rows": other.rows}
    assert not matches_ids([elsewhere], np.flatnonzero(locator.unit_of == 0)[: other.rows],
                           locator)
