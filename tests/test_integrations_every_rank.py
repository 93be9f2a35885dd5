"""A trainer callback installed on some ranks only is named at its start, within a bounded
wait, not left to hang the first save until the process group's timeout (NOTE [ a callback on
every rank ]). Both integrations (``LakeLedger``'s ``setup``, ``LakeTrainerCallback``'s
``on_train_begin``) call ``require_every_rank`` before their first collective; the job is
``jobs/callback_missing.py``: two gloo ranks, the callback on rank 0 only, once in a Lightning
``Trainer.fit``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

JOB = str(Path(__file__).parent / "jobs" / "callback_missing.py")


@pytest.mark.timeout(120)  # two ranks importing torch, one Lightning, and two 2 s waits
def test_a_rank_without_the_callback_is_named_within_the_bounded_wait(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, JOB, str(tmp_path), str(rank), "2"], env=env,
                              stdout=subprocess.PIPE, text=True) for rank in (0, 1)]
    try:
        out, _ = ranks[0].communicate(timeout=110)
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()
    lines = [line.split(" ", 3) for line in out.splitlines()]
    assert [line[:2] for line in lines] == [
        ["both", "none"], ["lonely", "CallbackMissingError"], ["both", "CallbackMissingError"]
    ], out
    callbacks = {"lonely": "LakeLedger(run_id='lonely')", "both": "LakeLedger(run_id=...)"}
    for run_id, _, seconds, message in lines[1:]:
        assert 1.8 <= float(seconds) < 15, out  # the bounded wait, not the group's 60 s
        assert f"run {run_id}: rank(s) [1] of 2" in message, message
        assert f"Add {callbacks[run_id]} to the Trainer's callbacks on every rank" in message


def test_a_wait_without_a_deadline_is_refused() -> None:
    """A zero wait would make the store wait without a deadline: refused, even alone."""
    from lakeckpt_tables.integrations._every_rank import require_every_rank

    with pytest.raises(ValueError, match="run r: peer_timeout must be a positive"):
        require_every_rank("LakeLedger(run_id='r')", "r", 0)
    require_every_rank("LakeLedger(run_id='r')", "r", 1.0)  # a world of one: nothing to wait for
