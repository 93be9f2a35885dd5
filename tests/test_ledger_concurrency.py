"""Concurrent jobs on one checkpoint root, as live processes: compaction and one writer per run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import WriterProperties, write_deltalake

from lakeckpt_tables.ledger import DeltaLedger

pytestmark = pytest.mark.slow

SAVER = str(Path(__file__).parent / "jobs" / "saver.py")
ROWS = 96


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("src") / "t"
    props = WriterProperties(max_row_group_size=16)
    write_deltalake(str(path), pa.table({"id": np.arange(ROWS, dtype=np.int64)}),
                    writer_properties=props)
    return path


def _saver(table: Path, root: Path, run: str, steps: int, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, SAVER, str(table), str(root), run, str(steps), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.timeout(240)
def test_three_jobs_compacting_after_every_commit_never_duplicate_a_record(
        table: Path, tmp_path: Path) -> None:
    steps = 8
    jobs = [_saver(table, tmp_path, f"run-{k}", steps, "1") for k in range(3)]
    outputs = [job.communicate(timeout=200) for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0, 0], [err[-2000:] for _, err in outputs]
    ledger = DeltaLedger(str(tmp_path / "_ledger"))
    for k in range(3):
        assert [r.step for r in ledger.checkpoints(f"run-{k}")] == list(range(1, steps + 1))
    rows = ledger.to_arrow()
    checkpoints = rows.filter(pc.field("record") == "checkpoint")
    assert checkpoints.num_rows == 3 * steps
    assert max(Counter(checkpoints["checkpoint_id"].to_pylist()).values()) == 1
    consumed = ledger.consumption()
    for k in range(3):
        mine = consumed.filter(pc.field("run_id") == f"run-{k}")
        assert pc.sum(mine["rows"]).as_py() == steps * 4  # batch 4, one save per batch
    keys = Counter(zip(*(consumed[c].to_pylist() for c in
                         ("run_id", "step", "file", "row_group", "row_start")), strict=True))
    assert max(keys.values()) == 1


@pytest.mark.timeout(240)
def test_a_job_that_restores_a_run_fences_the_job_still_writing_it(
        table: Path, tmp_path: Path) -> None:
    # the old job must still be saving when the new one (a fresh interpreter) has restored:
    # 20 saves 0.8 s apart leave it 14 s after step 3, also on a loaded machine
    old = _saver(table, tmp_path, "run", 20, "100", "--pause", "0.8")
    assert old.stdout is not None
    while (line := old.stdout.readline()) and line.strip() != "saved 3":
        pass
    new = _saver(table, tmp_path, "run", 3, "100", "--restore")
    new_out, new_err = new.communicate(timeout=120)
    old_out, old_err = old.communicate(timeout=120)
    assert new.returncode == 0, new_err[-2000:]
    restored = int(new_out.split()[1])
    assert restored >= 3
    assert old.returncode == 3, old_err[-2000:]
    assert "error RunFencedError" in old_out and "run 'run' is owned by job" in old_out
    records = DeltaLedger(str(tmp_path / "_ledger")).checkpoints("run")
    # one chain: every checkpoint builds on the one before it, steps strictly increasing
    assert [r.parent_id for r in records] == [None] + [r.checkpoint_id for r in records[:-1]]
    assert [r.step for r in records] == list(range(1, restored + 4))
    consumed = DeltaLedger(str(tmp_path / "_ledger")).consumption(run_id="run")
    assert pc.sum(consumed["rows"]).as_py() == (restored + 3) * 4


@pytest.mark.timeout(240)
def test_two_fresh_jobs_of_one_run_one_commits_the_other_is_fenced(
        table: Path, tmp_path: Path) -> None:
    first = _saver(table, tmp_path, "run", 6, "100", "--pause", "0.2")
    time.sleep(0.1)
    second = _saver(table, tmp_path, "run", 6, "100", "--pause", "0.2")
    outs = [first.communicate(timeout=120)[0], second.communicate(timeout=120)[0]]
    codes = sorted([first.returncode, second.returncode])
    assert codes == [0, 3], outs
    loser = outs[[first.returncode, second.returncode].index(3)]
    assert "error RunFencedError" in loser or "error CommitConflictError" in loser
    records = DeltaLedger(str(tmp_path / "_ledger")).checkpoints("run")
    assert [r.step for r in records] == list(range(1, 7))
    assert [r.parent_id for r in records] == [None] + [r.checkpoint_id for r in records[:-1]]


@pytest.mark.timeout(180)
def test_twenty_short_processes_reading_the_ledger_all_exit_cleanly(tmp_path: Path) -> None:
    """No filesystem thread outlives the interpreter (pyarrow calling back into delta-rs's
    Python filesystem handler aborted about one process in ten at exit); the long campaign
    is ``scripts/exit_campaign.py``."""
    job = str(Path(__file__).parent / "jobs" / "ledger_reader.py")
    ledger = str(tmp_path / "ledger")
    codes = []
    for k in range(20):
        done = subprocess.run([sys.executable, job, ledger, str(k)], capture_output=True,
                              text=True, timeout=60)
        codes.append((done.returncode, done.stdout.strip(), done.stderr[-200:]))
    assert [(rc, out) for rc, out, _ in codes] == [(0, str(k + 1)) for k in range(20)], codes
