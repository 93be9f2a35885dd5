"""The demo end to end: table, reference run, crash run (SIGKILL + resume), proof."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from lakeckpt_tables.demo import DemoError
from lakeckpt_tables.demo.proof import Proof, prove
from lakeckpt_tables.demo.runner import Attempt, run_child
from lakeckpt_tables.demo.table import TableInfo, build_table
from lakeckpt_tables.demo.train import TrainConfig, planned_steps

__all__ = ["DemoOptions", "DemoResult", "choose_schedule", "run_demo"]


@dataclass(frozen=True)
class DemoOptions:
    """What the user can choose; None means a default derived from the table's size."""

    root: Path
    rows: int = 200_000
    workers: int = 2
    batch_size: int = 256
    seed: int = 0
    kill_at: int | None = None
    checkpoint_every: int | None = None


@dataclass(frozen=True)
class DemoResult:
    """Everything the demo did and found."""

    table: TableInfo
    steps: int
    checkpoint_every: int
    kill_at: int
    reference: Attempt
    attempts: tuple[Attempt, ...]
    proof: Proof
    seconds: float

    def to_json(self, options: DemoOptions) -> dict[str, Any]:
        t = self.table
        return {
            "table": {"path": str(t.path), "rows": t.rows, "version": t.version,
                      "files": t.files, "row_groups": t.row_groups},
            "training": {"workers": options.workers, "batch_size": options.batch_size,
                         "seed": options.seed, "steps": self.steps,
                         "checkpoint_every": self.checkpoint_every, "kill_at": self.kill_at},
            "reference": _attempt_json(self.reference),
            "attempts": [_attempt_json(a) for a in self.attempts],
            "proof": self.proof.to_json(),
            "seconds": round(self.seconds, 2),
        }


def _attempt_json(a: Attempt) -> dict[str, Any]:
    return {"attempt": a.number, "resumed_from": a.resumed_from, "last_step": a.last_step,
            "returncode": a.returncode, "killed": a.killed, "seconds": round(a.seconds, 2)}


def choose_schedule(steps: int, every: int | None, kill_at: int | None) -> tuple[int, int]:
    """Checkpoint interval and kill step.

    By default about 8 checkpoints with an odd interval, and the kill half-way between the
    odd-numbered checkpoint nearest the middle of the run and the next one: trained steps are
    really lost, and with two workers the restart resumes mid-way through the DataLoader's
    round-robin over its workers, the case a naive resume gets wrong.

    Raises:
        DemoError: the run is too short to crash, or a chosen value is out of range.
    """
    if steps < 2:
        raise DemoError(f"one pass is {steps} step(s); use more --rows to have a crash to show")
    if every is None:
        every = max(1, round(steps / 8)) | 1
    elif every < 1:
        raise DemoError(f"--checkpoint-every must be positive, got {every}")
    if kill_at is None:
        nearest = max(1, round(steps / 2 / every))
        checkpoint = (nearest - 1 if nearest % 2 == 0 else nearest) * every
        kill_at = min(checkpoint + max(every // 2, 1), steps - 1)
    elif not 1 <= kill_at < steps:
        raise DemoError(f"--kill-at must be between 1 and {steps - 1} (one pass is {steps} steps)")
    return every, kill_at


def run_demo(options: DemoOptions, stream: IO[str] | None = None) -> DemoResult:
    """Build the table, train once uninterrupted, train again with a SIGKILL, and compare."""
    start = time.perf_counter()
    _check_options(options)
    table = build_table(options.root / "table", options.rows, seed=options.seed)
    steps = planned_steps(str(table.path), options.batch_size, options.workers, options.seed)
    every, kill_at = choose_schedule(steps, options.checkpoint_every, options.kill_at)

    def config(name: str, attempt: int) -> TrainConfig:
        return TrainConfig(str(table.path), options.root / name, attempt, options.workers,
                           options.batch_size, options.seed, every)

    reference = run_child(config("reference", 1), steps, "reference run", stream=stream)
    first = run_child(config("crash", 1), steps, "crash run, attempt 1", kill_at=kill_at,
                      stream=stream)
    second = run_child(config("crash", 2), steps, "crash run, attempt 2", stream=stream)
    proof = prove(table.rows, reference, [first, second])
    return DemoResult(table, steps, every, kill_at, reference, (first, second), proof,
                      time.perf_counter() - start)


def _check_options(options: DemoOptions) -> None:
    if options.rows < 1:
        raise DemoError(f"--rows must be positive, got {options.rows}")
    if options.workers < 0:
        raise DemoError(f"--workers must be 0 or more, got {options.workers}")
    if options.batch_size < 1:
        raise DemoError(f"--batch-size must be positive, got {options.batch_size}")
    if options.root.exists() and any(options.root.iterdir()):
        raise DemoError(f"{options.root} is not empty; give a new or empty --dir")
