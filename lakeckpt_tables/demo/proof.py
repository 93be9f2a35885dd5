"""Check the crash run against the reference run, from the files the children wrote.

The "delivered for training" sequence of a run with crashes is every attempt's logged steps up
to the step the next attempt restored (later ones were lost with the crash), then the last
attempt's steps: exactly the batches whose updates are in the final model.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lakeckpt_tables.demo.runner import Attempt
from lakeckpt_tables.demo.steplog import StepRecord, read_steps
from lakeckpt_tables.demo.train import FINAL_PARAMS

__all__ = ["Proof", "delivered", "prove"]


@dataclass(frozen=True)
class Proof:
    """The demo's claims, each with the numbers behind it."""

    rows_total: int
    rows_trained: int
    duplicated: int
    missing: int
    crash_returncode: int
    restored_step: int
    lost_steps: int
    lost_rows: int
    redelivered_exactly: bool
    batches: int
    reference_batches: int
    sequence_identical: bool
    loss_identical: bool
    params_identical: bool

    @property
    def sigkilled(self) -> bool:
        return self.crash_returncode == -signal.SIGKILL

    @property
    def exactly_once(self) -> bool:
        return self.duplicated == 0 and self.missing == 0 and self.rows_trained == self.rows_total

    @property
    def ok(self) -> bool:
        return (self.sigkilled and self.exactly_once and self.redelivered_exactly
                and self.sequence_identical and self.loss_identical and self.params_identical)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(sigkilled=self.sigkilled, exactly_once=self.exactly_once, ok=self.ok)
        return out


def delivered(attempts: Sequence[Attempt]) -> list[StepRecord]:
    """The steps whose training survived: each attempt's, up to what the next one restored."""
    out: list[StepRecord] = []
    for i, attempt in enumerate(attempts):
        upto = attempts[i + 1].resumed_from if i + 1 < len(attempts) else None
        out.extend(r for r in read_steps(attempt.step_log) if upto is None or r.step <= upto)
    return out


def prove(rows_total: int, reference: Attempt, attempts: Sequence[Attempt]) -> Proof:
    """Compare a crashed-and-resumed run (``attempts``, in order) with the reference run."""
    ref = read_steps(reference.step_log)
    got = delivered(attempts)
    ids = _ids(got)
    unique = np.unique(ids)
    first, second = read_steps(attempts[0].step_log), read_steps(attempts[1].step_log)
    restored = attempts[1].resumed_from
    lost = [r for r in first if r.step > restored]
    redone = [r for r in second if r.step <= (lost[-1].step if lost else restored)]
    return Proof(
        rows_total=rows_total,
        rows_trained=len(ids),
        duplicated=len(ids) - len(unique),
        missing=rows_total - int(np.isin(np.arange(rows_total), unique).sum()),
        crash_returncode=attempts[0].returncode,
        restored_step=restored,
        lost_steps=len(lost),
        lost_rows=len(_ids(lost)),
        redelivered_exactly=_same_batches(lost, redone),
        batches=len(got),
        reference_batches=len(ref),
        sequence_identical=_same_batches(got, ref),
        loss_identical=[r.loss for r in got] == [r.loss for r in ref],
        params_identical=_same_params(reference.run_dir, attempts[-1].run_dir),
    )


def _ids(records: Sequence[StepRecord]) -> np.ndarray[Any, Any]:
    return np.concatenate([r.ids for r in records]) if records else np.empty(0, np.int64)


def _same_batches(a: Sequence[StepRecord], b: Sequence[StepRecord]) -> bool:
    """Same steps with the same row ids in the same order (batch boundaries included)."""
    return len(a) == len(b) and all(
        x.step == y.step and np.array_equal(x.ids, y.ids) for x, y in zip(a, b, strict=True))


def _same_params(a: Path, b: Path) -> bool:
    """Bit-identical final parameters: torch.equal on every tensor of the state dicts."""
    pa_ = torch.load(a / FINAL_PARAMS, weights_only=True)
    pb = torch.load(b / FINAL_PARAMS, weights_only=True)
    return pa_.keys() == pb.keys() and all(torch.equal(pa_[k], pb[k]) for k in pa_)
