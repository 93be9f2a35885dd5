"""Start training children, SIGKILL them mid-run or inside a save, and collect what happened.

Every crash is real: the trainer is a separate OS process that receives SIGKILL, so nothing in
it gets a chance to clean up, flush or checkpoint. Two ways to die:

- between checkpoints: the parent sends SIGKILL once the child reports having trained a step;
- inside a save: the child is started with ``LAKECKPT_CRASH_AT=<point>#<n>``, and the
  checkpoint manager SIGKILLs its own process the n-th time it reaches that instant of the
  two-phase commit (see ``lakeckpt_tables.tools.crash``).

Only the trainer's main process is killed; its DataLoader workers notice their parent is gone
and exit on their own within torch's watchdog interval (about 5 s), idle meanwhile.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from lakeckpt_tables.tools.crash import ENV as CRASH_ENV
from lakeckpt_tables.tools.demo import DemoError
from lakeckpt_tables.tools.demo.train import TrainConfig, train_argv

__all__ = ["CRASH_ENV", "Attempt", "Progress", "run_child"]

_STDERR_TAIL = 2000


@dataclass(frozen=True)
class Attempt:
    """One run of the training child, as the parent saw it."""

    run_dir: Path
    number: int
    resumed_from: int  # step restored from a checkpoint; 0 for a fresh start
    last_step: int  # last step the child reported trained (where it died, if it died)
    returncode: int
    killed: bool  # the parent sent SIGKILL
    seconds: float
    crash_at: str | None = None  # the LAKECKPT_CRASH_AT the child was started with
    saving: int | None = None  # step of a save the child started and never reported committed
    committed: tuple[int, ...] = field(default=())  # steps the child reported committed
    started: datetime | None = None  # wall clock (UTC) before the child was started
    ended: datetime | None = None  # wall clock (UTC) once it had exited

    @property
    def step_log(self) -> Path:
        return self.run_dir / f"attempt-{self.number}.steps"

    @property
    def sigkilled(self) -> bool:
        return self.returncode == -signal.SIGKILL

    @property
    def died_in_save(self) -> bool:
        """Killed by its crash point, inside the save of step :attr:`saving`."""
        return self.crash_at is not None and self.sigkilled and self.saving is not None


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
              crash_at: str | None = None, stream: IO[str] | None = None) -> Attempt:
    """Run ``python -m lakeckpt_tables.tools.demo.train`` for ``cfg``.

    With ``kill_at``, SIGKILL it once it reports having trained that step. With ``crash_at``,
    start it with ``LAKECKPT_CRASH_AT=crash_at``: it must die inside a save.

    Raises:
        DemoError: the child failed on its own, or did not crash where it was meant to.
    """
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    err_path = cfg.run_dir / f"attempt-{cfg.attempt}.stderr"
    cmd = [sys.executable, "-m", "lakeckpt_tables.tools.demo.train", *train_argv(cfg)]
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    if crash_at is not None:
        env[CRASH_ENV] = crash_at
    bar = Progress(label, total, stream)
    started, start = datetime.now(UTC), time.perf_counter()
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        attempt = _follow(proc, cfg, bar, kill_at)
    attempt = replace(attempt, seconds=time.perf_counter() - start, crash_at=crash_at,
                      started=started, ended=datetime.now(UTC))
    bar.close(_note(attempt))
    _check(attempt, kill_at, label, err_path)
    return attempt


def _note(attempt: Attempt) -> str:
    if attempt.killed and attempt.saving is not None:
        return f"SIGKILL, landed in the save of step {attempt.saving} (exit {attempt.returncode})"
    if attempt.killed:
        return f"SIGKILL between checkpoints (exit {attempt.returncode})"
    if attempt.died_in_save:
        return (f"SIGKILL inside the save of step {attempt.saving} at {attempt.crash_at} "
                f"(exit {attempt.returncode})")
    return f"{attempt.seconds:.1f} s"


def _follow(proc: subprocess.Popen[str], cfg: TrainConfig, bar: Progress,
            kill_at: int | None) -> Attempt:
    """Read the child's progress lines until it ends, or kill it once it passed ``kill_at``."""
    assert proc.stdout is not None
    resumed, step, killed = 0, 0, False
    saving: int | None = None
    committed: list[int] = []
    for line in proc.stdout:
        event, _, value = line.strip().partition(" ")
        if event == "resume":
            resumed = step = int(value)
            bar.update(step, force=True)
        elif event == "save":
            saving = int(value)
        elif event == "checkpoint":
            saving = None
            committed.append(int(value))
        elif event == "step":
            step = int(value)
            bar.update(step)
            if kill_at is not None and step >= kill_at and not killed:
                # the child may have gone on meanwhile: what it wrote before dying is still
                # read, so last_step and saving say where it really died
                os.kill(proc.pid, signal.SIGKILL)
                killed = True
    returncode = proc.wait()
    proc.stdout.close()
    bar.update(step, force=True)  # where it stopped, even if the bar had not moved since
    return Attempt(cfg.run_dir, cfg.attempt, resumed, step, returncode, killed, 0.0,
                   saving=saving, committed=tuple(committed))


def _check(attempt: Attempt, kill_at: int | None, label: str, err_path: Path) -> None:
    if attempt.crash_at is not None:
        if attempt.died_in_save:
            return
        why = (f"was started with {CRASH_ENV}={attempt.crash_at} but "
               + ("finished without reaching that crash point" if attempt.returncode == 0
                  else f"exited with code {attempt.returncode} outside a save"))
    elif attempt.killed or (attempt.returncode == 0 and kill_at is None):
        return
    else:
        why = (f"exited with code {attempt.returncode}" if attempt.returncode
               else f"finished at step {attempt.last_step} before the kill at step {kill_at}")
    tail = err_path.read_text(errors="replace")[-_STDERR_TAIL:]
    raise DemoError(f"{label}: the training child {why}; its stderr ({err_path}) ends with:\n"
                    f"{tail}")
