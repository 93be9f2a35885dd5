"""Check the crash run against the reference run: from the ids the trainer saw, and the ledger.

The "delivered for training" sequence of a run with crashes is every attempt's logged steps up
to the step the next attempt restored (later ones were lost with the crash), then the last
attempt's steps: exactly the batches whose updates are in the final model. From it, the ids
proof: every row id trained exactly once per epoch, each crash's lost steps re-delivered
exactly, the same batches and losses as the reference run, and bit-identical final parameters.
The ledger proof (:mod:`.ledger_proof`) checks the same claims from the ledger's records.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lakeckpt_tables.plan.check import check_exactly_once
from lakeckpt_tables.tools.demo.ledger_proof import LedgerProof
from lakeckpt_tables.tools.demo.runner import Attempt
from lakeckpt_tables.tools.demo.steplog import StepRecord, read_steps
from lakeckpt_tables.tools.demo.train import FINAL_PARAMS

__all__ = ["Crash", "IdProof", "Proof", "crashes", "delivered", "prove_ids"]


@dataclass(frozen=True)
class Crash:
    """One attempt that died, and what its successor made of it."""

    attempt: int
    inside_save: bool  # died at a crash point inside a save, else SIGKILLed by the parent
    crash_at: str | None
    saving: int | None  # step of the save it died in
    last_step: int  # last step it reported trained
    returncode: int
    restored_step: int  # step the next attempt restored
    lost_steps: int  # trained steps after that: their training died with the process
    lost_rows: int
    redelivered_exactly: bool  # the next attempt re-trained exactly those batches

    @property
    def sigkilled(self) -> bool:
        return self.returncode == -signal.SIGKILL


@dataclass(frozen=True)
class IdProof:
    """The claims checked from the row ids the trainer logged, with the numbers behind them."""

    rows_total: int
    epochs: int
    rows_trained: int
    duplicated: int  # trainings of a row beyond once per epoch (or of an id not in the table)
    missing: int  # trainings of a row short of once per epoch
    crashes: tuple[Crash, ...]
    batches: int
    reference_batches: int
    sequence_identical: bool
    loss_identical: bool
    params_identical: bool

    @property
    def exactly_once(self) -> bool:
        return (self.duplicated == 0 and self.missing == 0
                and self.rows_trained == self.rows_total * self.epochs)

    @property
    def ok(self) -> bool:
        return (bool(self.crashes) and all(c.sigkilled and c.redelivered_exactly
                                           for c in self.crashes)
                and self.exactly_once and self.sequence_identical and self.loss_identical
                and self.params_identical)


@dataclass(frozen=True)
class Proof:
    """Both proofs; the demo holds when both do."""

    ids: IdProof
    ledger: LedgerProof

    @property
    def ok(self) -> bool:
        return self.ids.ok and self.ledger.ok

    def to_json(self) -> dict[str, Any]:
        ids = asdict(self.ids)
        for c, crash in zip(ids["crashes"], self.ids.crashes, strict=True):
            c["sigkilled"] = crash.sigkilled
        ids.update(exactly_once=self.ids.exactly_once, ok=self.ids.ok)
        return {"ids": ids, "ledger": self.ledger.to_json(), "ok": self.ok}


def delivered(attempts: Sequence[Attempt]) -> list[StepRecord]:
    """The steps whose training survived: each attempt's, up to what the next one restored."""
    out: list[StepRecord] = []
    for i, attempt in enumerate(attempts):
        upto = attempts[i + 1].resumed_from if i + 1 < len(attempts) else None
        out.extend(r for r in read_steps(attempt.step_log) if upto is None or r.step <= upto)
    return out


def crashes(attempts: Sequence[Attempt]) -> tuple[Crash, ...]:
    """Every attempt but the last died: what it lost, and whether its successor redid that."""
    out = []
    for dead, successor in pairwise(attempts):
        restored = successor.resumed_from
        lost = [r for r in read_steps(dead.step_log) if r.step > restored]
        upto = lost[-1].step if lost else restored
        redone = [r for r in read_steps(successor.step_log) if r.step <= upto]
        out.append(Crash(dead.number, dead.died_in_save, dead.crash_at, dead.saving,
                         dead.last_step, dead.returncode, restored, len(lost),
                         len(_ids(lost)), _same_batches(lost, redone)))
    return tuple(out)


def prove_ids(rows_total: int, epochs: int, reference: Attempt,
              attempts: Sequence[Attempt]) -> IdProof:
    """Compare a crashed-and-resumed run (``attempts``, in order) with the reference run."""
    ref = read_steps(reference.step_log)
    got = delivered(attempts)
    verdict = check_exactly_once(_ids(got), np.arange(rows_total), times=epochs)
    return IdProof(
        rows_total=rows_total,
        epochs=epochs,
        rows_trained=verdict.delivered,
        duplicated=verdict.surplus,
        missing=verdict.shortfall,
        crashes=crashes(attempts),
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
