"""Checkpoints under real crashes: real processes, real torchrun, real SIGKILL, real Delta ledger.

Every test compares against a failure-free run of the same job: the ids trained (per rank, in
order) must be identical and the final parameters bit-identical; over an elastic resume, the
ids must be every row exactly once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from deltalake import WriterProperties, write_deltalake

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.errors import CommitConflictError, StateMismatchError
from lakeckpt_tables.ledger import DeltaLedger

pytestmark = pytest.mark.slow

JOB = str(Path(__file__).parent / "jobs" / "train.py")
ROWS = 600


def _write_table(path: Path, rows: int, first_id: int = 0) -> None:
    rng = np.random.default_rng(first_id)
    props = WriterProperties(max_row_group_size=40)
    for start in range(first_id, first_id + rows, 150):
        ids = np.arange(start, min(start + 150, first_id + rows), dtype=np.int64)
        x = rng.standard_normal((len(ids), 4), dtype=np.float32)
        table = pa.table({
            "id": ids,
            "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 4),
            "y": pa.array(x.sum(axis=1) * 0.5, pa.float32()),
        })
        write_deltalake(str(path), table, mode="append", writer_properties=props)


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("src") / "table"
    _write_table(path, ROWS)
    return path


def _run(table: Path, root: Path, out: Path, *, nproc: int = 1, crash: str | None = None,
         extra: tuple[str, ...] = ()) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("LAKECKPT_CRASH_AT", None)
    if crash:
        env["LAKECKPT_CRASH_AT"] = crash
    args = ["--table", str(table), "--root", str(root), "--out", str(out), *extra]
    if nproc == 1:
        cmd = [sys.executable, JOB, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", "--max-restarts=0", JOB, *args]
    return subprocess.run(cmd, env=env, capture_output=True, timeout=180).returncode


def _logs(out: Path) -> dict[int, list[list[int]]]:
    logs = {}
    for path in sorted(out.glob("rank*.log")):
        batches = []
        for line in path.read_text().splitlines():
            batches.append([int(i) for i in line.split(" ", 1)[1].split(",")])
        logs[int(path.stem[4:])] = batches
    return logs


def _params(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "params.pt")


def _assert_exactly_once(logs: dict[int, list[list[int]]], rows: int = ROWS) -> None:
    seen = Counter(i for batches in logs.values() for batch in batches for i in batch)
    duplicated = [i for i, n in seen.items() if n > 1]
    missing = sorted(set(range(rows)) - set(seen))
    assert not duplicated and not missing, (duplicated[:10], missing[:10])


def _assert_ledger_exactly_once(root: Path, table: Path) -> None:
    """The ledger alone proves it: rows consumed per row group add up to its rows, once."""
    consumed: Counter[tuple[str, int]] = Counter()
    for rec in DeltaLedger(str(root / "_ledger")).consumption(run_id="run").to_pylist():
        consumed[(rec["file"], rec["row_group"])] += rec["rows"]
    units = DeltaSource(str(table)).snapshot().units
    assert consumed == Counter({(u.path, u.row_group): u.rows for u in units})


def _assert_same_run(out: Path, reference: Path) -> None:
    assert _logs(out) == _logs(reference)
    ours, theirs = _params(out), _params(reference)
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key


@pytest.fixture(scope="module")
def reference(table: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("reference")
    assert _run(table, base / "ckpt", base / "out") == 0
    _assert_exactly_once(_logs(base / "out"))
    return base / "out"


@pytest.mark.parametrize("point", [
    "prepare:before_write", "prepare:mid_write", "prepare:after_write",
    "commit:before", "commit:after",
])
@pytest.mark.timeout(300)  # two or three jobs, each up to ~40 s on 2 busy cores
def test_a_crash_at_any_protocol_point_leaves_the_previous_or_the_new_checkpoint(
        table: Path, reference: Path, tmp_path: Path, point: str) -> None:
    root, out = tmp_path / "ckpt", tmp_path / "out"
    assert _run(table, root, out, crash=f"{point}#2") == -9  # dies in the second save (step 10)
    ledger = DeltaLedger(str(root / "_ledger"))
    steps = [r.step for r in ledger.checkpoints("run")]
    assert steps == ([5, 10] if point == "commit:after" else [5])
    assert _run(table, root, out) == 0
    _assert_exactly_once(_logs(out))
    _assert_same_run(out, reference)
    _assert_ledger_exactly_once(root, table)
    final = DeltaLedger(str(root / "_ledger")).checkpoints("run")
    assert len({r.step for r in final}) == len(final), "a step committed twice"


@pytest.mark.timeout(400)  # several torchrun jobs, each ~30 s on 2 busy cores
def test_a_two_rank_torchrun_job_killed_twice_equals_the_failure_free_run(
        table: Path, tmp_path: Path) -> None:
    # 600 rows over 2 ranks at batch 32: 10 steps; checkpoints at 3, 6, 9
    every = ("--every", "3")
    ref = tmp_path / "ref"
    assert _run(table, ref / "ckpt", ref / "out", nproc=2, extra=every) == 0
    root, out = tmp_path / "ckpt", tmp_path / "out"
    assert _run(table, root, out, nproc=2, extra=(*every, "--kill-after-step", "5")) != 0
    assert _run(table, root, out, nproc=2, extra=(*every, "--kill-after-step", "8")) != 0
    assert _run(table, root, out, nproc=2, extra=every) == 0
    _assert_exactly_once(_logs(out))
    _assert_same_run(out, ref / "out")
    _assert_ledger_exactly_once(root, table)


@pytest.mark.timeout(400)  # several torchrun jobs, each ~30 s on 2 busy cores
def test_a_three_rank_job_resumed_at_two_ranks_trains_every_row_exactly_once(
        table: Path, tmp_path: Path) -> None:
    root, out = tmp_path / "ckpt", tmp_path / "out"
    # 600 rows over 3 ranks at batch 32: 7 steps; checkpoint at 3, killed after step 5
    every = ("--every", "3")
    assert _run(table, root, out, nproc=3, extra=(*every, "--kill-after-step", "5")) != 0
    assert [r.step for r in DeltaLedger(str(root / "_ledger")).checkpoints("run")] == [3]
    assert _run(table, root, out, nproc=2, extra=(*every, "--workers", "1")) == 0
    _assert_exactly_once(_logs(out))
    _assert_ledger_exactly_once(root, table)


@pytest.mark.timeout(400)  # several torchrun jobs, each ~30 s on 2 busy cores
def test_a_rank_crashing_mid_write_under_torchrun_aborts_the_checkpoint(
        table: Path, tmp_path: Path) -> None:
    ref = tmp_path / "ref"
    assert _run(table, ref / "ckpt", ref / "out", nproc=2) == 0
    root, out = tmp_path / "ckpt", tmp_path / "out"
    assert _run(table, root, out, nproc=2, crash="prepare:mid_write@1#2") != 0
    assert [r.step for r in DeltaLedger(str(root / "_ledger")).checkpoints("run")] == [5]
    assert _run(table, root, out, nproc=2) == 0
    _assert_same_run(out, ref / "out")


def test_a_corrupted_model_file_falls_back_to_the_previous_checkpoint_and_says_so(
        table: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root, out = tmp_path / "ckpt", tmp_path / "out"
    assert _run(table, root, out, extra=("--every", "4")) == 0
    ledger = DeltaLedger(str(root / "_ledger"))
    records = ledger.checkpoints("run")
    latest = records[-1]
    shard = next(p for p in (root / latest.model_location).iterdir() if p.suffix == ".distcp")
    shard.write_bytes(b"garbage" + shard.read_bytes()[7:])
    model = torch.nn.Linear(4, 1)
    manager = CheckpointManager(root, "run")
    assert manager.restore(model=model) == records[-2].step
    assert "fails verification" in caplog.text
    events = ledger.to_arrow().filter(pa.compute.equal(ledger.to_arrow()["record"], "event"))
    assert "restore_fallback" in events["event"].to_pylist()


def test_restoring_a_run_of_another_table_is_refused(table: Path, tmp_path: Path) -> None:
    root, out = tmp_path / "ckpt", tmp_path / "out"
    assert _run(table, root, out, extra=("--every", "100")) == 0
    other = tmp_path / "other"
    _write_table(other, 100)
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(LakeDataset(DeltaSource(str(other)), batch_size=8),
                                batch_size=None)
    with pytest.raises(StateMismatchError, match="table"):
        CheckpointManager(root, "run").restore(dataloader=loader)


def test_two_jobs_committing_the_same_run_step_one_wins_the_other_gets_a_named_error(
        tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    first = CheckpointManager(tmp_path, "shared")
    second = CheckpointManager(tmp_path, "shared")
    first.save(3, model=model)
    with pytest.raises(CommitConflictError, match="shared"):
        second.save(3, model=model)
    assert [r.step for r in first.checkpoints()] == [3]
