"""Checkpoints under real crashes of torchrun jobs: real SIGKILL of ranks, real Delta ledger.

A killed and resumed two-rank job must train the ids (per rank, in order) and end with the
parameters, bit for bit, of the same job never killed; an elastic resume trains every row
exactly once. The single-process crash points are in ``test_checkpoint_crash.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from crash_jobs import (
    ROWS,
    assert_exactly_once,
    assert_ledger_exactly_once,
    assert_same_run,
    logs,
    run,
    write_table,
)

from lakeckpt_tables.ledger import DeltaLedger

pytestmark = pytest.mark.slow

EVERY = ("--every", "3")  # 600 rows over 2 ranks at batch 32: 10 steps; checkpoints at 3, 6, 9


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("src") / "table"
    write_table(path, ROWS)
    return path


@pytest.fixture(scope="module")
def two_rank_reference(table: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two-rank job never killed: what every killed two-rank job must end as."""
    base = tmp_path_factory.mktemp("reference")
    assert run(table, base / "ckpt", base / "out", nproc=2, extra=EVERY) == 0
    assert_exactly_once(logs(base / "out"))
    return base / "out"


@dataclass
class Chain:
    """One two-rank run crashed twice, then resumed to its end: rank 1 dies writing its shard
    of the second checkpoint (step 6); the resumed job (from step 3) commits step 6 and rank 0
    is SIGKILLed after step 8; the next job resumes from step 6 and finishes."""

    root: Path
    out: Path
    codes: list[int]  # the three jobs' exit statuses
    steps: list[list[int]]  # the ledger's checkpoint steps after each job


@pytest.fixture(scope="module")
def chain(table: Path, tmp_path_factory: pytest.TempPathFactory) -> Chain:
    """Both crash tests' run: one chain of three jobs (a job each for the crash inside a save
    and the kill between checkpoints would train the same steps twice more)."""
    base = tmp_path_factory.mktemp("chain")
    root, out = base / "ckpt", base / "out"
    jobs = [("prepare:mid_write@1#2", EVERY), (None, (*EVERY, "--kill-after-step", "8")),
            (None, EVERY)]
    c = Chain(root, out, [], [])
    for crash, extra in jobs:
        c.codes.append(run(table, root, out, nproc=2, crash=crash, extra=extra))
        c.steps.append([r.step for r in DeltaLedger(str(root / "_ledger")).checkpoints("run")])
    return c


@pytest.mark.timeout(400)  # three torchrun jobs and the reference, each ~30 s on 2 busy cores
def test_a_two_rank_torchrun_job_killed_twice_equals_the_failure_free_run(
        table: Path, two_rank_reference: Path, chain: Chain) -> None:
    assert chain.codes[0] != 0 and chain.codes[1] != 0 and chain.codes[2] == 0
    assert chain.steps[1] == [3, 6]  # killed after step 8: step 6 committed, 7 and 8 lost
    assert_exactly_once(logs(chain.out))
    assert_same_run(chain.out, two_rank_reference)
    assert_ledger_exactly_once(chain.root, table)


@pytest.mark.timeout(400)  # as above
def test_a_rank_crashing_mid_write_under_torchrun_aborts_the_checkpoint(
        two_rank_reference: Path, chain: Chain) -> None:
    # rank 1 dies writing its shard of the second checkpoint (step 6): only step 3 committed
    assert chain.codes[0] != 0
    assert chain.steps[0] == [3]
    # the resumed job saves step 6 again over what the dead rank left, and the run ends as the
    # failure-free one
    assert chain.steps[1] == [3, 6] and chain.codes[2] == 0
    assert_same_run(chain.out, two_rank_reference)


@pytest.mark.timeout(400)  # several torchrun jobs, each ~30 s on 2 busy cores
def test_a_three_rank_job_resumed_at_two_ranks_trains_every_row_exactly_once(
        table: Path, tmp_path: Path) -> None:
    root, out = tmp_path / "ckpt", tmp_path / "out"
    # 600 rows over 3 ranks at batch 32: 7 steps; checkpoint at 3, killed after step 5
    assert run(table, root, out, nproc=3, extra=(*EVERY, "--kill-after-step", "5")) != 0
    assert [r.step for r in DeltaLedger(str(root / "_ledger")).checkpoints("run")] == [3]
    assert run(table, root, out, nproc=2, extra=(*EVERY, "--workers", "1")) == 0
    assert_exactly_once(logs(out))
    assert_ledger_exactly_once(root, table)
