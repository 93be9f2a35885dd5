"""``lakeckpt demo``: the end-to-end crash proof, and the checker's ability to say no."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lakeckpt_tables.cli import main
from lakeckpt_tables.demo import DemoError
from lakeckpt_tables.demo.proof import delivered, prove
from lakeckpt_tables.demo.runner import Attempt
from lakeckpt_tables.demo.scenario import choose_schedule
from lakeckpt_tables.demo.steplog import StepLog, read_steps
from lakeckpt_tables.demo.train import FINAL_PARAMS

_CLI = "import sys; from lakeckpt_tables.cli import main; sys.exit(main())"


@pytest.mark.slow
def test_demo_survives_a_real_sigkill(tmp_path: Path) -> None:
    root = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-c", _CLI, "demo", "--rows", "20000", "--json", "--dir", str(root)],
        capture_output=True, timeout=120)
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr
    result = json.loads(done.stdout)
    first, second = result["attempts"]
    assert first["killed"] and first["returncode"] == -signal.SIGKILL
    assert second["returncode"] == 0 and second["resumed_from"] > 0
    proof = result["proof"]
    assert proof["sigkilled"] and proof["ok"]
    assert proof["rows_total"] == proof["rows_trained"] == 20000
    assert proof["duplicated"] == proof["missing"] == 0
    assert proof["lost_steps"] > 0 and proof["redelivered_exactly"]
    assert proof["sequence_identical"] and proof["loss_identical"]
    assert proof["params_identical"]
    assert "\r" in stderr and "SIGKILL" in stderr  # the progress bar


@pytest.mark.parametrize("steps", [2, 3, 16, 80, 782, 10_000])
def test_schedule_kills_between_checkpoints_mid_round(steps: int) -> None:
    every, kill_at = choose_schedule(steps, None, None)
    assert 1 <= kill_at < steps
    if steps >= 16:
        assert every % 2 == 1 and (kill_at // every) % 2 == 1 and kill_at % every


def test_schedule_refuses_what_cannot_crash() -> None:
    with pytest.raises(DemoError, match="--rows"):
        choose_schedule(1, None, None)
    with pytest.raises(DemoError, match="--kill-at"):
        choose_schedule(100, 10, 100)
    with pytest.raises(DemoError, match="--checkpoint-every"):
        choose_schedule(100, 0, None)


def test_cli_reports_bad_options_as_errors(tmp_path: Path) -> None:
    (tmp_path / "junk").write_text("x")
    assert main(["demo", "--rows", "100", "--dir", str(tmp_path)]) == 2


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
         steps: dict[int, list[int]]) -> Attempt:
    run_dir = tmp_path / name
    run_dir.mkdir(exist_ok=True)
    attempt = Attempt(run_dir, number, resumed_from, max(steps), 0, False, 0.0)
    with StepLog(attempt.step_log) as log:
        for step, ids in steps.items():
            log.write(step, float(step), np.array(ids))
    torch.save({"w": torch.ones(2)}, run_dir / FINAL_PARAMS)
    return attempt


def test_delivered_drops_steps_lost_with_the_crash(tmp_path: Path) -> None:
    first = _run(tmp_path, "crash", 1, 0, {1: [0, 1], 2: [2, 3], 3: [4, 5]})
    second = _run(tmp_path, "crash", 2, 2, {3: [4, 5], 4: [6, 7]})
    assert [r.step for r in delivered([first, second])] == [1, 2, 3, 4]


def test_proof_says_no_when_the_resume_repeats_a_row(tmp_path: Path) -> None:
    ref = _run(tmp_path, "ref", 1, 0, {1: [0, 1], 2: [2, 3], 3: [4, 5], 4: [6, 7]})
    first = _run(tmp_path, "crash", 1, 0, {1: [0, 1], 2: [2, 3], 3: [4, 5]})
    first = Attempt(first.run_dir, 1, 0, 3, -signal.SIGKILL, True, 0.0)
    second = _run(tmp_path, "crash", 2, 2, {3: [4, 5], 4: [6, 1]})
    proof = prove(8, ref, [first, second])
    assert proof.sigkilled and proof.redelivered_exactly and proof.params_identical
    assert (proof.duplicated, proof.missing) == (1, 1)
    assert not proof.exactly_once and not proof.sequence_identical and not proof.ok
