"""Timing helpers of the checkpoint benchmarks: a manager that times its phases, a train step.

Measurement stays out of the library: ``TimedManager`` subclasses ``CheckpointManager`` here.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from lakeckpt_tables.checkpoint.manager import CheckpointManager
from lakeckpt_tables.ledger import CheckpointRecord
from lakeckpt_tables.tools.bench._common import Progress, clock, percentile, quiet

__all__ = ["Progress", "TimedManager", "clock", "no_dcp_warnings", "percentile", "quiet",
           "train_step"]

@contextlib.contextmanager
def no_dcp_warnings() -> Iterator[None]:
    # DCP warns on every single-process save that it assumes a single process: it does.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        warnings.filterwarnings("ignore", category=UserWarning,
                                module="torch.distributed.checkpoint")
        warnings.filterwarnings("ignore", message=".*set_vital.*")  # torchdata 0.11, on iter()
        yield


# ------------------------------------------------------------------------ timed manager


class TimedManager(CheckpointManager):
    """A :class:`CheckpointManager` that times its phases (see NOTE [ what the commit ... ]).

    ``timings`` holds seconds per call, appended in call order: ``commit`` (phase 2 on this
    rank, retention scan excluded) and within it ``gather`` and ``broadcast`` (the protocol's
    collectives, summed per save: the commit timestamp and the outcome are both broadcast),
    ``retire`` (the retention scan, rank 0), ``ledger_commit`` (rank 0) and ``capture``
    (reader state + consumption). ``records`` holds the consumption records of each ledger
    commit (rank 0).
    """

    def __init__(self, *args: Any, barrier_before_commit: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timings: dict[str, list[float]] = defaultdict(list)
        self.records: list[int] = []
        self._barrier = barrier_before_commit
        self._retire_s = 0.0
        if self.ledger is not None:
            real = self.ledger.commit

            def timed_commit(checkpoint: CheckpointRecord, consumption: Sequence[Any] = (),
                             events: Sequence[Any] = (), *,
                             owner: str | None = None) -> CheckpointRecord:
                t0 = clock()
                out = real(checkpoint, consumption, events, owner=owner)
                self.timings["ledger_commit"].append(clock() - t0)
                self.records.append(len(consumption))
                return out

            self.ledger.commit = timed_commit  # type: ignore[method-assign]
        self._time("retire", self, "_committer", "committed")  # retention, after the commit
        self._time("capture", self, "_preparer", "capture_reader")  # reader state + consumption

    def capture(self, dataloader: Any) -> Any:
        """Capture the reader state and consumption as a save does (nothing is written)."""
        return self._preparer.capture_reader(dataloader, self._baseline)

    def _time(self, name: str, owner: Any, part: str, method: str) -> None:
        """Time calls of ``owner.<part>.<method>`` under ``name`` (rank 0's parts may be None)."""
        target = getattr(owner, part)
        if target is None:
            return
        real = getattr(target, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            out = real(*args, **kwargs)
            spent = clock() - t0
            self.timings[name].append(spent)
            if name == "retire":
                self._retire_s = spent
            return out

        setattr(target, method, timed)

    def _commit(self, attempt: Any) -> CheckpointRecord:
        if self._barrier:
            self.world.barrier()
        self._retire_s = 0.0
        world = self.world
        gather, broadcast = world.gather_to_root, world.broadcast
        spent = {"gather": 0.0, "broadcast": 0.0}  # a commit's collectives, summed per save

        def timed_gather(value: Any) -> list[Any] | None:
            t0 = clock()
            out = gather(value)
            spent["gather"] += clock() - t0
            return out

        def timed_broadcast(value: Any) -> Any:
            t0 = clock()
            out = broadcast(value)
            spent["broadcast"] += clock() - t0
            return out

        world.gather_to_root, world.broadcast = timed_gather, timed_broadcast  # type: ignore[method-assign]
        t0 = clock()
        try:
            out = super()._commit(attempt)
        finally:
            del world.gather_to_root, world.broadcast  # back to the class's methods
        for name, seconds in spent.items():
            self.timings[name].append(seconds)
        self.timings["commit"].append(clock() - t0 - self._retire_s)
        return out

def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
                features: int, distributed: bool) -> None:
    inputs = torch.sin(x[:, None] * torch.arange(1, features + 1, dtype=torch.float32))
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(inputs)[:, 0], x)
    loss.backward()  # type: ignore[no-untyped-call]
    if distributed:
        import torch.distributed as dist

        world = dist.get_world_size()
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= world
    optimizer.step()
