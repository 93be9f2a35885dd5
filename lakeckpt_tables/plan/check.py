"""The one exactly-once check, over the row ids a run delivered (demo, examples and tests).

Row ids are unique per row (a table's ``id`` column); a pass delivered exactly once when every
expected id came exactly once and nothing else came.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ExactlyOnce", "check_exactly_once"]


@dataclass(frozen=True)
class ExactlyOnce:
    """What :func:`check_exactly_once` found; true when nothing is wrong.

    Attributes:
        delivered: ids delivered, repeats included.
        duplicated: ids delivered more often than due (sorted).
        missing: expected ids delivered less often than due (sorted).
        unexpected: delivered ids not expected (sorted).
        surplus: deliveries beyond what was due (unexpected ids included).
        shortfall: deliveries short of what was due.
    """

    delivered: int
    duplicated: tuple[int, ...]
    missing: tuple[int, ...]
    unexpected: tuple[int, ...]
    surplus: int = 0
    shortfall: int = 0

    def __bool__(self) -> bool:
        return not (self.duplicated or self.missing or self.unexpected)

    def __str__(self) -> str:
        if self:
            return f"exactly once: {self.delivered} rows"
        return (f"NOT exactly once: {len(self.duplicated)} duplicated {list(self.duplicated[:10])}"
                f", {len(self.missing)} missing {list(self.missing[:10])}, "
                f"{len(self.unexpected)} unexpected {list(self.unexpected[:10])}")


def check_exactly_once(delivered: Iterable[int] | np.ndarray[Any, Any],
                       expected: Iterable[int] | np.ndarray[Any, Any], *,
                       times: int = 1) -> ExactlyOnce:
    """Compare the ids a run delivered with the ids it should have delivered.

    Args:
        delivered: every id delivered, in any order (a repeat is a duplicate).
        expected: the ids of the rows the pass reads (repeats ignored).
        times: how often each expected id is due (the epochs of a run over one snapshot).

    Returns:
        The verdict; ``bool(result)`` is True when every expected id came exactly ``times``
        times and nothing else came.
    """
    got = np.asarray(list(delivered) if not isinstance(delivered, np.ndarray) else delivered,
                     dtype=np.int64)
    universe = np.unique(np.asarray(list(expected) if not isinstance(expected, np.ndarray)
                                    else expected, dtype=np.int64))
    known = np.isin(got, universe)
    counts = np.bincount(np.searchsorted(universe, got[known]), minlength=len(universe))
    stray, stray_counts = np.unique(got[~known], return_counts=True)
    return ExactlyOnce(
        delivered=len(got),
        duplicated=tuple(int(i) for i in universe[counts > times]),
        missing=tuple(int(i) for i in universe[counts < times]),
        unexpected=tuple(int(i) for i in stray),
        surplus=int(np.maximum(counts - times, 0).sum()) + int(stray_counts.sum()),
        shortfall=int(np.maximum(times - counts, 0).sum()),
    )
