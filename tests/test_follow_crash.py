"""Follow mode under real crashes: a writer process appends while a 2-rank torchrun job follows
the table, and the job is SIGKILLed and resumed several times (Guarantees 1, 2 and 4).

The proof is in the ids and the ledger: every row appended up to the end version is trained
exactly once, in the same per-rank order (and to bit-identical parameters) as a follower that
never crashed, run afterwards on the finished table: segments are formed from the commit log
alone, so neither the writer's timing nor the crashes change them. The ledger's consumption
records add up to every row group once, and it names every segment and the skipped OPTIMIZE.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import loader_for, lose_machine, take
from test_follow import (
    Written,
    assert_segment_events,
    delta_units,
    ledger_events,
    ledger_units,
    parse_writer_output,
    realpaths,
    writer,
)

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.ledger import DeltaLedger
from lakeckpt_tables.plan.check import check_exactly_once

# ~80 s a case on an idle machine: three torchrun jobs, a writer and a reference follower.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

JOBS = Path(__file__).parent / "jobs"
FIRST_ROWS = 40  # version 0: 40 rows, 3 steps of 2 ranks x batch 8
APPENDS = 24  # appends of 7-11 rows by the writer process
OPTIMIZE_AFTER = 12  # an OPTIMIZE after the 12th append: version 13
HOLD_AFTER = 18  # the writer waits after 18 appends until the test releases it
END = APPENDS + 1  # last version: 24 appends and the OPTIMIZE
MIN_SEGMENT_ROWS = 16  # the job's default: world size x batch size


def _start(table: Path, root: Path, out: Path, *extra: str,
           workers: int = 0) -> subprocess.Popen[bytes]:
    """The follow job under torchrun with 2 ranks; its stderr goes to ``<out>.err``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("LAKECKPT_CRASH_AT", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--max-restarts=0", str(JOBS / "follow.py"), "--table", str(table), "--root",
           str(root), "--out", str(out), "--version", "0", "--until", str(END), "--every", "3",
           "--workers", str(workers), *extra]
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{out}.err", "ab") as err:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)


def _finish(proc: subprocess.Popen[bytes], out: Path, timeout: float = 120) -> int:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        lose_machine(proc.pid)
        proc.wait()
        raise
    if proc.returncode not in (0, 1, -signal.SIGKILL):
        pytest.fail(f"follow job failed ({proc.returncode}): "
                    f"{Path(f'{out}.err').read_text()[-3000:]}")
    return proc.returncode


def _last_step(out: Path) -> int:
    path = out / "rank0.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return int(lines[-1].split(" ", 1)[0]) if lines else 0


def _wait_for_step(proc: subprocess.Popen[bytes], out: Path, step: int) -> None:
    deadline = time.monotonic() + 120
    while _last_step(out) < step:
        assert proc.poll() is None, f"the job ended ({proc.returncode}) before step {step}"
        assert time.monotonic() < deadline, f"no step {step} after 120 s"
        time.sleep(0.01)


def _logs(out: Path) -> dict[int, list[list[int]]]:
    logs = {}
    for path in sorted(out.glob("rank*.log")):
        logs[int(path.stem[4:])] = [[int(i) for i in line.split(" ", 1)[1].split(",")]
                                    for line in path.read_text().splitlines()]
    return logs


# DataLoader workers form segments on their own (NOTE [ segment boundaries ]): the harder case.
# Without workers the follow examples (tests/test_examples_smoke.py) are killed while tables grow.
@pytest.mark.parametrize("workers", [2])
def test_a_follower_killed_three_times_while_a_writer_appends_trains_like_one_never_killed(
        tmp_path: Path, workers: int) -> None:
    table, go, release = tmp_path / "table", tmp_path / "go", tmp_path / "release"
    written = Written(str(table))
    written.appended[writer.append(str(table), 0, FIRST_ROWS)] = (0, FIRST_ROWS)
    writer_proc = subprocess.Popen(
        [sys.executable, str(JOBS / "writer.py"), "--table", str(table), "--first-id",
         str(FIRST_ROWS), "--appends", str(APPENDS), "--rows", "9", "--interval", "0.1",
         "--optimize-after", str(OPTIMIZE_AFTER), "--go", str(go), "--hold-after",
         str(HOLD_AFTER), "--release", str(release)],
        stdout=subprocess.PIPE, text=True)
    root, out = tmp_path / "ckpt", tmp_path / "out"
    try:
        # 1: the job trains version 0, then follows the writer, which starts once it trained
        # a step; rank 0 SIGKILLs itself right after step 7 (checkpoint at 6)
        job = _start(table, root, out, "--kill-after-step", "7", workers=workers)
        _wait_for_step(job, out, 1)
        go.touch()
        assert _finish(job, out) != 0
        assert [r.step for r in DeltaLedger(str(root / "_ledger")).checkpoints("run")] == [3, 6]
        # 2: resumed at step 6, SIGKILLed from outside at no particular instant once past
        # step 11; the writer holds back its last appends, so the job is still following
        job = _start(table, root, out, workers=workers)
        _wait_for_step(job, out, 11)
        lose_machine(job.pid)
        assert _finish(job, out) == -signal.SIGKILL
        # 3: resumed again, killed after step 19, past the OPTIMIZE, while appends go on
        release.touch()
        job = _start(table, root, out, "--kill-after-step", "19", workers=workers)
        assert _finish(job, out) != 0
        # 4: resumed to the end version
        assert _finish(_start(table, root, out, workers=workers), out) == 0
    finally:
        go.touch()
        release.touch()
        writer_out, _ = writer_proc.communicate(timeout=120)
    assert writer_proc.returncode == 0
    parse_writer_output(writer_out, written)
    assert written.end == END and written.other == {OPTIMIZE_AFTER + 1: "OPTIMIZE"}

    # the failure-free follower, on the finished table: the same sequence, whatever the timing
    ref = tmp_path / "ref"
    assert _finish(_start(table, ref / "ckpt", ref / "out", workers=workers), ref / "out") == 0
    logs = _logs(out)
    assert logs == _logs(ref / "out")
    assert len({len(batches) for batches in logs.values()}) == 1, "ranks in lockstep"
    verdict = check_exactly_once(
        (i for batches in logs.values() for batch in batches for i in batch), written.ids())
    assert verdict, str(verdict)
    ours, theirs = torch.load(out / "params.pt"), torch.load(ref / "out" / "params.pt")
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)

    # the ledger alone: every row group consumed exactly once, every segment named once
    appends = sorted(v for v in written.appended if v > 0)
    assert realpaths(ledger_units(root)) == realpaths(delta_units(written, 0, appends))
    assert_segment_events(root, written.segments(0, END, MIN_SEGMENT_ROWS))
    assert [e["version"] for e in ledger_events(root, "skipped_commit")] == [OPTIMIZE_AFTER + 1]

    # a follower resumed from the last checkpoint, past until_version, reads nothing more
    # (here at world size 1: the finished state re-planned for another shape; left to the
    # default min_segment_rows, it adopts the run's)
    dataset = LakeDataset(DeltaSource(str(table)), columns=["id", "x", "y"], batch_size=8,
                          seed=7, shuffle_window=2, version=0, follow=True, until_version=END,
                          poll_interval=0.05)
    loader = loader_for(dataset, 0)
    assert CheckpointManager(root, "run").restore(dataloader=loader) == len(logs[0])
    assert take(loader) == []
