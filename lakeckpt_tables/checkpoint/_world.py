"""Collectives for the checkpoint protocol over torch.distributed, or a world of one.

The protocol runs on its own gloo group: metadata travels as Python objects (gloo handles them on
CPU whatever the training backend is), and a background async save never shares a group with
training collectives. The group keeps the timeout the job gave ``init_process_group``: a new
group would otherwise wait gloo's default 30 minutes for a peer that hangs or whose machine is
gone without closing its connections.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

import torch.distributed as dist

from lakeckpt_tables.errors import CheckpointError, LakeckptError

__all__ = ["World", "one_process"]

T = TypeVar("T")


@contextmanager
def one_process() -> Iterator[None]:
    """DCP warns at every save and load without a process group that it assumes one process:
    a world of one is what the manager means there, so exactly that warning is silenced (the
    background writer of ``async_save`` still shows it: docs/limits.md)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, message=(
            "torch.distributed is disabled, unavailable or uninitialized"))
        yield


def _job_timeout() -> timedelta | None:
    """The collective timeout of the default process group (None: torch's default); read
    through torch internals, which have no public accessor, so any change there means None."""
    try:
        group = dist.distributed_c10d._get_default_group()
        for device in group._device_types:
            timeout = getattr(group._get_backend(device).options, "_timeout", None)
            if isinstance(timeout, timedelta):
                return timeout
    except (AttributeError, RuntimeError):
        pass
    return None


class World:
    """This process's place among the ranks; collective methods must be called by all ranks."""

    def __init__(self) -> None:
        self.distributed = dist.is_available() and dist.is_initialized()
        if self.distributed:
            self.rank = dist.get_rank()
            self.size = dist.get_world_size()
            self.group: Any = dist.new_group(backend="gloo", timeout=_job_timeout())
        else:
            self.rank, self.size, self.group = 0, 1, None

    def gather(self, value: T) -> list[T]:
        """Every rank's ``value``, on every rank, in rank order.

        Raises:
            CheckpointError: a peer rank died or cannot be reached.
        """
        if not self.distributed:
            return [value]
        out: list[Any] = [None] * self.size
        with self._named("gather"):
            dist.all_gather_object(out, value, group=self.group)
        return out

    def gather_to_root(self, value: T) -> list[T] | None:
        """Every rank's ``value`` on rank 0, in rank order; None on the other ranks. A save's
        sealed rows go only where they are committed: an all-gather would send every rank
        all of them (~50-100 MB a save at 256 ranks x 8 workers).

        Raises:
            CheckpointError: a peer rank died or cannot be reached.
        """
        if not self.distributed:
            return [value]
        out: list[Any] | None = [None] * self.size if self.rank == 0 else None
        with self._named("gather"):
            dist.gather_object(value, out, dst=0, group=self.group)
        return out

    def broadcast(self, value: T) -> T:
        """Rank 0's ``value`` on every rank.

        Raises:
            CheckpointError: a peer rank died or cannot be reached.
        """
        if not self.distributed:
            return value
        box = [value]
        with self._named("broadcast"):
            dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def decide(self, decide: Callable[[], T]) -> T:
        """Rank 0 runs ``decide``; every rank gets its value, or raises the library error it
        raised (errors cross ranks as values, so all ranks fail alike).

        Raises:
            LakeckptError: what ``decide`` raised on rank 0.
        """
        outcome: Any = None
        if self.rank == 0:
            try:
                outcome = decide()
            except LakeckptError as exc:
                outcome = exc
        outcome = self.broadcast(outcome)
        if isinstance(outcome, LakeckptError):
            raise outcome
        return outcome  # type: ignore[no-any-return]

    def barrier(self) -> None:
        """Wait for every rank.

        Raises:
            CheckpointError: a peer rank died or cannot be reached.
        """
        if self.distributed:
            with self._named("barrier"):
                dist.barrier(group=self.group)

    @contextmanager
    def _named(self, op: str) -> Iterator[None]:
        # gloo reports a dead peer as a bare RuntimeError ("Connection reset by peer")
        try:
            yield
        except RuntimeError as exc:
            raise CheckpointError(
                f"rank {self.rank} of {self.size}: the checkpoint protocol's {op} failed, a "
                f"peer rank died or cannot be reached ({' '.join(str(exc).split())[:300]}). "
                "The checkpoint in progress counts only if the ledger committed it: restart "
                "the job and restore") from exc
