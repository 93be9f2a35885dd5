"""The one exactly-once check, over the row ids a run delivered (demo, examples and tests).

Row ids are unique per row (a table's ``id`` column); a pass delivered exactly once when every
expected id came exactly once and nothing else came.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ExactlyOnce", "check_exactly_once"]


@dataclass(frozen=True)
class ExactlyOnce:
    """What :func:`check_exactly_once` found; true when nothing is wrong.

    Attributes:
        delivered: ids delivered, repeats included.
        duplicated: ids delivered more than once (sorted).
        missing: expected ids never delivered (sorted).
        unexpected: delivered ids not expected (sorted).
    """

    delivered: int
    duplicated: tuple[int, ...]
    missing: tuple[int, ...]
    unexpected: tuple[int, ...]

    def __bool__(self) -> bool:
        return not (self.duplicated or self.missing or self.unexpected)

    def __str__(self) -> str:
        if self:
            return f"exactly once: {self.delivered} rows"
        return (f"NOT exactly once: {len(self.duplicated)} duplicated {list(self.duplicated[:10])}"
                f", {len(self.missing)} missing {list(self.missing[:10])}, "
                f"{len(self.unexpected)} unexpected {list(self.unexpected[:10])}")


def check_exactly_once(delivered: Iterable[int], expected: Iterable[int]) -> ExactlyOnce:
    """Compare the ids a pass delivered with the ids it should have delivered once each.

    Args:
        delivered: every id delivered, in any order (a repeat is a duplicate).
        expected: the ids of the rows the pass reads.

    Returns:
        The verdict; ``bool(result)`` is True when exactly once.
    """
    counts = Counter(int(i) for i in delivered)
    wanted = {int(i) for i in expected}
    return ExactlyOnce(
        delivered=sum(counts.values()),
        duplicated=tuple(sorted(i for i, n in counts.items() if n > 1)),
        missing=tuple(sorted(wanted - counts.keys())),
        unexpected=tuple(sorted(counts.keys() - wanted)),
    )
