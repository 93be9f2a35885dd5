"""``PlanPolicy``: everything besides the data that decides who reads which rows in which
order (frozen, keyword-only, validated), and the seeds plans derive from it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from lakeckpt_tables.plan.shuffle import BALANCED, SHUFFLERS

__all__ = ["DEFAULT_SHUFFLE_WINDOW", "PlanPolicy", "derive_seed"]


DEFAULT_SHUFFLE_WINDOW = 128
"""Units per shuffle window: with 4096-row units about half a million rows, the memory of four
typical 128k-row row groups, drawn from every part of the slice's range."""


def derive_seed(*parts: int | str) -> int:
    """A stable 63-bit seed from ``parts`` (same on every machine, Python and NumPy version)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@dataclass(frozen=True, kw_only=True)
class PlanPolicy:
    """Everything besides the data that decides who reads which rows in which order.

    Attributes:
        batch_size: rows per batch.
        world_size: number of ranks.
        workers: DataLoader workers per rank (1 when reading in the main process).
        shuffle: permute units per epoch and rows within each window.
        seed: base seed; epoch and window seeds derive from it.
        shuffle_window: units read together and shuffled as one window.
        drop_last: deliver only full batches; the rest of each slice is reported undelivered.
        shuffler: how a window's rows are permuted (NOTE [ keyed permutation ] in
            ``plan/shuffle.py``); :data:`LEGACY` for reader states that name none.
    """

    batch_size: int
    world_size: int = 1
    workers: int = 1
    shuffle: bool = True
    seed: int = 0
    shuffle_window: int = DEFAULT_SHUFFLE_WINDOW
    drop_last: bool = False
    shuffler: str = BALANCED

    def __post_init__(self) -> None:
        if self.shuffler not in SHUFFLERS:
            raise ValueError(f"PlanPolicy.shuffler must be one of {SHUFFLERS}, "
                             f"got {self.shuffler!r}")
        for name in ("batch_size", "world_size", "workers", "shuffle_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"PlanPolicy.{name} must be a positive int, got {value!r}")

    @property
    def slices(self) -> int:
        return self.world_size * self.workers

    @property
    def lockstep(self) -> bool:
        """Ranks must yield equal batch counts only when there is more than one rank."""
        return self.world_size > 1
