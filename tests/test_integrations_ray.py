"""Ray Train with ``RayTrainLedger``, proved by its example, run once (a local Ray cluster costs
more to start than the training it runs): ``TorchTrainer`` over 2 CPU workers with
``FailureConfig(max_failures=2)``, one worker SIGKILLed mid-epoch, Ray restarting the group,
which resumes from the ledger's checkpoint; every row trained once, each rank's batches those of
an uninterrupted run, ``lakeckpt verify`` passing (examples/ray_resume.py says ``PROOF OK``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ray_resume.py"


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ray_restarts_a_killed_worker_group_from_the_ledger_exactly_once(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_DISABLE_USAGE_STATS": "1"}
    done = subprocess.run([sys.executable, str(EXAMPLE), "--work", str(tmp_path), "--rows", "600",
                           "--batch-size", "30", "--every", "3", "--kill-after-step", "5"],
                          capture_output=True, text=True, timeout=380, env=env)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines and lines[-1] == "PROOF OK", \
        done.stdout[-4000:] + done.stderr[-4000:]
    assert "a worker was SIGKILLed: True" in done.stdout
    assert "ids: 600 trained of 600 rows: exactly once" in done.stdout
    assert "each rank's batches equal an uninterrupted run's: True" in done.stdout
