"""Checkpoints under real crashes: real processes, real SIGKILL, real Delta ledger.

Every test compares against a failure-free run of the same job: the ids trained (in order) must
be identical and the final parameters bit-identical. The torchrun jobs are in
``test_checkpoint_crash_torchrun.py`` (a file apart, so that two test processes share them).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from crash_jobs import (
    ROWS,
    assert_exactly_once,
    assert_ledger_exactly_once,
    assert_same_run,
    logs,
    run,
    run_each,
    write_table,
)

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.errors import CommitConflictError, StateMismatchError
from lakeckpt_tables.ledger import DeltaLedger

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("src") / "table"
    write_table(path, ROWS)
    return path


@pytest.fixture(scope="module")
def reference(runs: tuple[Path, dict[str, Crashed]]) -> Path:
    """The failure-free run's output directory (its root is the sibling ``ckpt``)."""
    return runs[0]


def reference_root(reference: Path, dest: Path) -> Path:
    """A copy of the failure-free run's checkpoint root (checkpoints at steps 5, 10, 15 and the
    final 19), for a test that needs a finished run and changes it: no job of its own to run."""
    shutil.copytree(reference.parent / "ckpt", dest)
    return dest


POINTS = ["prepare:before_write", "prepare:mid_write", "prepare:after_write", "commit:before",
          "commit:after"]


@dataclass
class Crashed:
    """A job SIGKILLed at a protocol point in its second save (step 10), then resumed."""

    root: Path
    out: Path
    crash_code: int  # the killed job's exit status
    steps: list[int]  # the ledger's checkpoint steps right after the crash
    resume_code: int  # the resumed job's exit status


@pytest.fixture(scope="module")
def runs(table: Path, tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[Path, dict[str, Crashed]]:
    """Every crash point, each a job of its own killed there; then, in ONE fresh process (a
    process start costs more than a run), the failure-free run first (from a fresh interpreter,
    as in a process of its own) and every crashed run resumed, one after the other."""
    crashed = {}
    for point in POINTS:
        base = tmp_path_factory.mktemp("crashed")
        root, out = base / "ckpt", base / "out"
        code = run(table, root, out, crash=f"{point}#2")  # dies in the second save (step 10)
        steps = [r.step for r in DeltaLedger(str(root / "_ledger")).checkpoints("run")]
        crashed[point] = Crashed(root, out, code, steps, resume_code=-1)
    ref = tmp_path_factory.mktemp("reference")
    codes = run_each(table, [(ref / "ckpt", ref / "out"),
                             *((c.root, c.out) for c in crashed.values())])
    assert codes[0] == 0
    assert_exactly_once(logs(ref / "out"))
    for c, resume_code in zip(crashed.values(), codes[1:], strict=True):
        c.resume_code = resume_code
    return ref / "out", crashed


@pytest.fixture(scope="module")
def crashed(runs: tuple[Path, dict[str, Crashed]]) -> dict[str, Crashed]:
    return runs[1]


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.timeout(300)  # five killed jobs and their resumes, each up to ~40 s on 2 busy cores
def test_a_crash_at_any_protocol_point_leaves_the_previous_or_the_new_checkpoint(
        table: Path, reference: Path, crashed: dict[str, Crashed], point: str) -> None:
    c = crashed[point]
    root, out = c.root, c.out
    assert c.crash_code == -9
    assert c.steps == ([5, 10] if point == "commit:after" else [5])
    assert c.resume_code == 0
    assert_exactly_once(logs(out))
    assert_same_run(out, reference)
    assert_ledger_exactly_once(root, table)
    final = DeltaLedger(str(root / "_ledger")).checkpoints("run")
    assert len({r.step for r in final}) == len(final), "a step committed twice"


def test_a_corrupted_model_file_falls_back_to_the_previous_checkpoint_and_says_so(
        reference: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = reference_root(reference, tmp_path / "ckpt")
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


def test_restoring_a_run_of_another_table_is_refused(reference: Path, tmp_path: Path) -> None:
    root = reference_root(reference, tmp_path / "ckpt")
    other = tmp_path / "other"
    write_table(other, 100)
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(LakeDataset(DeltaSource(str(other)), batch_size=8),
                                batch_size=None)
    with pytest.raises(StateMismatchError, match="table: state is of delta table"):
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
