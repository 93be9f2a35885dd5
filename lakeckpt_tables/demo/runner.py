"""Start training children, SIGKILL one mid-run, restart it, and collect what happened.

The crash is real: the trainer is a separate OS process and the parent sends it SIGKILL, so
nothing in the trainer gets a chance to clean up, flush or checkpoint. Only the trainer's main
process is killed; its DataLoader workers notice their parent is gone and exit on their own
within torch's watchdog interval (about 5 s), idle meanwhile.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from lakeckpt_tables.demo import DemoError
from lakeckpt_tables.demo.train import TrainConfig, train_argv

__all__ = ["Attempt", "Progress", "run_child"]

_STDERR_TAIL = 2000


@dataclass(frozen=True)
class Attempt:
    """One run of the training child, as the parent saw it."""

    run_dir: Path
    number: int
    resumed_from: int  # step restored from a checkpoint; 0 for a fresh start
    last_step: int  # last step the child reported trained
    returncode: int
    killed: bool  # the parent sent SIGKILL
    seconds: float

    @property
    def step_log(self) -> Path:
        return self.run_dir / f"attempt-{self.number}.steps"


class Progress:
    """A plain-text progress bar, redrawn in place with ``\\r`` (no dependency)."""

    def __init__(self, label: str, total: int, stream: IO[str] | None = None,
                 width: int = 30) -> None:
        self.label, self.total, self.width = label, max(total, 1), width
        self.stream = stream if stream is not None else sys.stderr
        self._drawn = -1

    def update(self, step: int, *, force: bool = False) -> None:
        cells = self.width * min(step, self.total) // self.total
        if cells == self._drawn and not force and step != self.total:
            return  # redraw only when the bar moves: a few dozen writes per run
        self._drawn = cells
        bar = "#" * cells + "-" * (self.width - cells)
        self.stream.write(f"\r{self.label:<22} [{bar}] {step:>7}/{self.total} steps")
        self.stream.flush()

    def close(self, note: str = "") -> None:
        self.stream.write(f"  {note}\n" if note else "\n")
        self.stream.flush()


def run_child(cfg: TrainConfig, total: int, label: str, *, kill_at: int | None = None,
              stream: IO[str] | None = None) -> Attempt:
    """Run ``python -m lakeckpt_tables.demo.train`` for ``cfg``; SIGKILL it once it reports
    having trained step ``kill_at``.

    Raises:
        DemoError: the child failed on its own, or finished before reaching ``kill_at``.
    """
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    err_path = cfg.run_dir / f"attempt-{cfg.attempt}.stderr"
    cmd = [sys.executable, "-m", "lakeckpt_tables.demo.train", *train_argv(cfg)]
    bar = Progress(label, total, stream)
    start = time.perf_counter()
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        attempt = _follow(proc, cfg, bar, kill_at)
    attempt = replace(attempt, seconds=time.perf_counter() - start)
    bar.close(f"SIGKILL (exit {attempt.returncode})" if attempt.killed
              else f"{attempt.seconds:.1f} s")
    _check(attempt, kill_at, label, err_path)
    return attempt


def _follow(proc: subprocess.Popen[str], cfg: TrainConfig, bar: Progress,
            kill_at: int | None) -> Attempt:
    """Read the child's progress lines until it ends, or kill it once it passed ``kill_at``."""
    assert proc.stdout is not None
    resumed, step, killed = 0, 0, False
    for line in proc.stdout:
        event, _, value = line.strip().partition(" ")
        if event == "resume":
            resumed = step = int(value)
            bar.update(step, force=True)
        elif event == "step":
            step = int(value)
            bar.update(step)
            if kill_at is not None and step >= kill_at:
                os.kill(proc.pid, signal.SIGKILL)
                bar.update(step, force=True)
                killed = True
                break
    returncode = proc.wait()
    proc.stdout.close()
    return Attempt(cfg.run_dir, cfg.attempt, resumed, step, returncode, killed, 0.0)


def _check(attempt: Attempt, kill_at: int | None, label: str, err_path: Path) -> None:
    if attempt.killed or (attempt.returncode == 0 and kill_at is None):
        return
    why = (f"exited with code {attempt.returncode}" if attempt.returncode
           else f"finished at step {attempt.last_step} before the kill at step {kill_at}")
    tail = err_path.read_text(errors="replace")[-_STDERR_TAIL:]
    raise DemoError(f"{label}: the training child {why}; its stderr ({err_path}) ends with:\n"
                    f"{tail}")
