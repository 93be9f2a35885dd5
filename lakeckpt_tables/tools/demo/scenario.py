"""The demo end to end: table, reference run, crash run (two SIGKILLs + resumes), proof.

The crash run is three attempts of the same training child, checkpointing through
:class:`~lakeckpt_tables.checkpoint.CheckpointManager` into one ledger:

1. SIGKILLed by the parent between two checkpoints, about a third into the run;
2. resumed, then SIGKILLed *inside* a save, about two thirds into the run, at an instant of the
   two-phase commit chosen with ``LAKECKPT_CRASH_AT`` (by default ``commit:before``: the model
   files are complete on disk, only the ledger commit is missing);
3. resumed, and finishes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from lakeckpt_tables.ledger import open_ledger
from lakeckpt_tables.sources import DeltaSource
from lakeckpt_tables.tools.demo import DemoError
from lakeckpt_tables.tools.demo.ledger_proof import IdLocator, prove_ledger, save_leftovers
from lakeckpt_tables.tools.demo.proof import Proof, delivered, prove_ids
from lakeckpt_tables.tools.demo.runner import Attempt, run_child
from lakeckpt_tables.tools.demo.table import TableInfo, build_table
from lakeckpt_tables.tools.demo.train import TrainConfig, planned_steps

__all__ = [
    "DEFAULT_SAVE_CRASH",
    "SAVE_CRASH_POINTS",
    "DemoOptions",
    "DemoResult",
    "Schedule",
    "choose_schedule",
    "crash_spec",
    "run_demo",
    "save_steps",
]

SAVE_CRASH_POINTS = {
    "prepare:before_write": "the save had started; no model file was written yet",
    "prepare:mid_write": "the model's data files were written, DCP's .metadata not yet",
    "prepare:after_write": "the model state was complete and checksummed and the reader "
                           "state captured; the rank had not reported ready",
    "commit:before": "every rank had prepared (model files complete, .metadata written, "
                     "checksums taken); only the one ledger commit, the commit point, was "
                     "missing: complete files, yet no checkpoint",
}
"""Crash points inside a save that abort it, and what had happened at that instant."""

DEFAULT_SAVE_CRASH = "commit:before"
"""The last instant of a save before its commit point: everything is on disk but the commit."""

REFERENCE_RUN = "reference"
CRASH_RUN = "crash"


@dataclass(frozen=True)
class DemoOptions:
    """What the user can choose; None means a default derived from the table's size."""

    root: Path
    rows: int = 200_000
    epochs: int = 2
    workers: int = 2
    batch_size: int = 256
    seed: int = 0
    kill_at: int | None = None
    save_crash: str = DEFAULT_SAVE_CRASH
    save_crash_at: int | None = None
    checkpoint_every: int | None = None


@dataclass(frozen=True)
class Schedule:
    """When to checkpoint and where the two crashes happen."""

    checkpoint_every: int
    kill_at: int  # the parent SIGKILLs attempt 1 once it reports this step
    save_crash_at: int  # attempt 2 dies inside the save of this step


@dataclass(frozen=True)
class DemoResult:
    """Everything the demo did and found."""

    table: TableInfo
    steps: int
    schedule: Schedule
    save_crash: str  # the crash point inside the save
    crash_spec: str  # LAKECKPT_CRASH_AT of attempt 2
    reference: Attempt
    attempts: tuple[Attempt, ...]
    proof: Proof
    seconds: float

    def to_json(self, options: DemoOptions) -> dict[str, Any]:
        t, s = self.table, self.schedule
        return {
            "table": {"path": str(t.path), "rows": t.rows, "version": t.version,
                      "files": t.files, "row_groups": t.row_groups},
            "training": {"workers": options.workers, "batch_size": options.batch_size,
                         "seed": options.seed, "epochs": options.epochs, "steps": self.steps,
                         "checkpoint_every": s.checkpoint_every},
            "crashes": {"kill_at": s.kill_at, "save_crash_at": s.save_crash_at,
                        "save_crash": self.save_crash, "crash_spec": self.crash_spec,
                        "save_crash_means": SAVE_CRASH_POINTS[self.save_crash]},
            "reference": _attempt_json(self.reference),
            "attempts": [_attempt_json(a) for a in self.attempts],
            "proof": self.proof.to_json(),
            "seconds": round(self.seconds, 2),
        }


def _attempt_json(a: Attempt) -> dict[str, Any]:
    return {"attempt": a.number, "resumed_from": a.resumed_from, "last_step": a.last_step,
            "returncode": a.returncode, "killed": a.killed, "crash_at": a.crash_at,
            "died_in_save": a.died_in_save, "saving": a.saving, "committed": list(a.committed),
            "seconds": round(a.seconds, 2)}


def save_steps(steps: int, every: int) -> list[int]:
    """Steps the trainer saves at: every ``every`` steps, and the last step."""
    return sorted({*range(every, steps + 1, every), steps})


def choose_schedule(steps: int, every: int | None, kill_at: int | None,
                    save_crash_at: int | None) -> Schedule:
    """Checkpoint interval, the kill between checkpoints, and the save to crash in.

    By default about 8 checkpoints with an odd interval (at least 3); the kill half-way between
    the odd-numbered checkpoint nearest a third of the run and the next one (trained steps are
    really lost, and with two workers the restart resumes mid-way through the DataLoader's
    round-robin over its workers, the case a naive resume gets wrong); the save crash at the
    save nearest two thirds of the run.

    Raises:
        DemoError: the run is too short to crash twice, or a chosen value is out of range.
    """
    if steps < 2:
        raise DemoError(f"the run is {steps} step(s); use more --rows to have crashes to show")
    if every is None:
        every = max(2, round(steps / 8)) | 1
    elif every < 2:
        raise DemoError(f"--checkpoint-every must be at least 2 (a kill between checkpoints "
                        f"needs a step that is not one), got {every}")
    if kill_at is None:
        nearest = max(1, round(steps / 3 / every))
        checkpoint = (nearest - 1 if nearest % 2 == 0 else nearest) * every
        kill_at = min(checkpoint + max(every // 2, 1), steps - 1)
        if kill_at % every == 0:  # only when the run ends right after a checkpoint
            kill_at -= 1
    elif not 1 <= kill_at < steps:
        raise DemoError(f"--kill-at must be between 1 and {steps - 1} (the run is {steps} steps)")
    elif kill_at % every == 0:
        raise DemoError(f"--kill-at {kill_at} is a checkpoint step: the parent's SIGKILL would "
                        "race the save (a crash inside a save is what --save-crash does)")
    restored = kill_at // every * every
    later = [s for s in save_steps(steps, every) if s > restored]
    if save_crash_at is None:
        save_crash_at = min(later, key=lambda s: (abs(s - 2 * steps / 3), s))
    elif save_crash_at not in later:
        raise DemoError(f"--save-crash-at must be a step attempt 2 saves at, after step "
                        f"{restored} it resumes from: one of {_few(later)}")
    return Schedule(every, kill_at, save_crash_at)


def _few(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) if len(steps) <= 8 else \
        f"{', '.join(map(str, steps[:6]))}, ..., {steps[-1]}"


def crash_spec(point: str, target: int, restored: int, steps: int, every: int) -> str:
    """``LAKECKPT_CRASH_AT`` that kills an attempt resuming at ``restored`` in the save of
    ``target``: the crash point counts its hits, and that save is the n-th of the attempt.

    Raises:
        DemoError: ``target`` is not a save after ``restored``.
    """
    nth = sum(1 for s in save_steps(steps, every) if restored < s <= target)
    if target not in save_steps(steps, every) or nth < 1:
        raise DemoError(f"attempt 2 resumes from step {restored}, so it never saves step "
                        f"{target}; the kill landed late (choose a later --save-crash-at)")
    return f"{point}#{nth}"


def run_demo(options: DemoOptions, stream: IO[str] | None = None) -> DemoResult:
    """Build the table, train once uninterrupted, train again with two SIGKILLs, and compare."""
    start = time.perf_counter()
    _check_options(options)
    table = build_table(options.root / "table", options.rows, seed=options.seed)
    steps = planned_steps(str(table.path), options.batch_size, options.workers, options.seed,
                          options.epochs)
    schedule = choose_schedule(steps, options.checkpoint_every, options.kill_at,
                               options.save_crash_at)
    checkpoints = options.root / "checkpoints"

    def config(run: str, attempt: int) -> TrainConfig:
        return TrainConfig(str(table.path), options.root / run, checkpoints, run, attempt,
                           options.workers, options.batch_size, options.seed, options.epochs,
                           schedule.checkpoint_every)

    reference = run_child(config(REFERENCE_RUN, 1), steps, "reference run", stream=stream)
    first = run_child(config(CRASH_RUN, 1), steps, "crash run, attempt 1",
                      kill_at=schedule.kill_at, stream=stream)
    latest = open_ledger(None, root=str(checkpoints)).latest(CRASH_RUN)
    spec = crash_spec(options.save_crash, schedule.save_crash_at,
                      0 if latest is None else latest.step, steps, schedule.checkpoint_every)
    second = run_child(config(CRASH_RUN, 2), steps, "crash run, attempt 2", crash_at=spec,
                       stream=stream)
    assert second.saving is not None  # run_child checked that it died inside a save
    leftovers = save_leftovers(checkpoints, CRASH_RUN, second.saving)
    third = run_child(config(CRASH_RUN, 3), steps, "crash run, attempt 3", stream=stream)
    attempts = (first, second, third)
    locator = IdLocator(DeltaSource(str(table.path)).snapshot(table.version).units)
    proof = Proof(
        prove_ids(table.rows, options.epochs, reference, attempts),
        prove_ledger(checkpoints, CRASH_RUN, locator, options.epochs, delivered(attempts),
                     attempts, leftovers))
    return DemoResult(table, steps, schedule, options.save_crash, spec, reference, attempts,
                      proof, time.perf_counter() - start)


def _check_options(options: DemoOptions) -> None:
    if options.rows < 1:
        raise DemoError(f"--rows must be positive, got {options.rows}")
    if options.epochs < 1:
        raise DemoError(f"--epochs must be positive, got {options.epochs}")
    if options.workers < 0:
        raise DemoError(f"--workers must be 0 or more, got {options.workers}")
    if options.batch_size < 1:
        raise DemoError(f"--batch-size must be positive, got {options.batch_size}")
    if options.save_crash not in SAVE_CRASH_POINTS:
        raise DemoError(f"--save-crash must be one of {', '.join(SAVE_CRASH_POINTS)}, "
                        f"got {options.save_crash!r}")
    if options.root.exists() and any(options.root.iterdir()):
        raise DemoError(f"{options.root} is not empty; give a new or empty --dir")
