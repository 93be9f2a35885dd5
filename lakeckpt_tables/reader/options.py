"""``ReaderOptions``: every option of a ``LakeDataset``, validated once, frozen, without I/O.

Every bad combination of options is refused here, with the reason, before any table is
touched; the dataset then only reads what this value says. (``LakeDataset.config`` is the part
of it that defines the rows, resolved against the table: the identity of a reader state.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lakeckpt_tables.plan import DEFAULT_SHUFFLE_WINDOW, PlanPolicy
from lakeckpt_tables.reader.readahead import DEFAULT_DEPTH
from lakeckpt_tables.reader.rounds import DEFAULT_UNIT_ROWS, FollowPolicy

__all__ = ["ReaderOptions"]

OUTPUTS = ("torch", "arrow")
NULL_POLICIES = ("refuse", "fill", "mask")
DECIMAL_POLICIES = ("refuse", "float64")


@dataclass(frozen=True, kw_only=True)
class ReaderOptions:
    """The options of a :class:`~lakeckpt_tables.reader.dataset.LakeDataset` (its Args say
    what each means), with the rank and world size resolved.

    Raises:
        ValueError: an option out of range, or a combination that cannot work; the message
            says which and why.
    """

    columns: Sequence[str] | None = None
    batch_size: int = 1024
    shuffle: bool = True
    seed: int = 0
    version: int | None = None
    epochs: int = 1
    rank: int = 0
    world_size: int = 1
    drop_last: bool = False
    shuffle_window: int = DEFAULT_SHUFFLE_WINDOW
    transform: Callable[[dict[str, Any]], Any] | None = None
    follow: bool = False
    poll_interval: float = 1.0
    max_idle: float | None = None
    until_version: int | None = None
    on_change: Literal["fail", "skip"] = "fail"
    min_segment_rows: int | None = None
    refresh: Literal["epoch"] | None = None
    output: Literal["torch", "arrow"] = "torch"
    nulls: Literal["refuse", "fill", "mask"] = "refuse"
    decimals: Literal["refuse", "float64"] = "refuse"
    filter: Any = None
    unit_rows: int = DEFAULT_UNIT_ROWS
    read_ahead: int = DEFAULT_DEPTH

    def __post_init__(self) -> None:
        if isinstance(self.columns, str):
            raise TypeError("columns must be a list of names, not a string")
        if self.columns is not None:
            object.__setattr__(self, "columns", tuple(self.columns))  # frozen: a copy of it
        _positive("epochs", self.epochs)
        _positive("unit_rows", self.unit_rows)
        if not _is_int(self.read_ahead) or self.read_ahead < 0:
            raise ValueError(f"read_ahead must be a non-negative int, got {self.read_ahead!r}")
        PlanPolicy(batch_size=self.batch_size, shuffle_window=self.shuffle_window)  # validates
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world_size {self.world_size}")
        for name, value, allowed in (("output", self.output, OUTPUTS),
                                     ("nulls", self.nulls, NULL_POLICIES),
                                     ("decimals", self.decimals, DECIMAL_POLICIES),
                                     ("refresh", self.refresh, (None, "epoch"))):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if self.filter is not None and (self.follow or self.refresh is not None):
            raise ValueError("filter= is decided when the snapshot is pinned; follow=True "
                             "and refresh='epoch' pin versions later and take no filter")
        if self.refresh is not None and (self.follow or self.epochs != 1):
            raise ValueError("refresh='epoch' reads one epoch per pass (call set_epoch(e) "
                             "before each); it takes neither follow=True nor epochs")
        if self.follow:
            if self.epochs != 1:
                raise ValueError("follow mode has no epochs: leave epochs=1")
            if self.max_idle is not None and self.world_size > 1:
                raise ValueError(
                    "max_idle ends a pass when no commit came for a while, which each rank "
                    "would notice at a different step; with several ranks use until_version, "
                    "or stop all ranks together from the training loop")
            self.follow_policy()  # validates the follow options

    def follow_policy(self) -> FollowPolicy | None:
        """How the reader follows its table; None without ``follow=True``."""
        if not self.follow:
            return None
        rows = self.min_segment_rows
        return FollowPolicy(
            min_segment_rows=self.world_size * self.batch_size if rows is None else rows,
            poll_interval=self.poll_interval, max_idle=self.max_idle,
            until_version=self.until_version, on_change=self.on_change)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive(name: str, value: Any) -> None:
    if not _is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
