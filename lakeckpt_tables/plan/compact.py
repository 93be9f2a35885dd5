"""Per-unit arrays of a plan in less memory (NOTE [ compact plans ] in ``plan/epoch.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["Orders", "Parts", "PartsView", "Same", "compact"]


class Same:
    """``np.arange(n)`` without its ``n`` integers (``fill=None``), or ``n`` times ``fill``:
    the row group and first row of every plan unit of a round whose row groups are not split
    (NOTE [ compact plans ] in ``plan/epoch.py``). Indexed like the array it stands for."""

    def __init__(self, n: int, fill: int | None = None) -> None:
        self.n, self.fill = n, fill

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, int | np.integer):
            if not -self.n <= int(index) < self.n:
                raise IndexError(f"index {index} of {self.n}")
            i = int(index) % self.n
            return i if self.fill is None else self.fill
        return self.__array__()[index] if isinstance(index, slice) else self._of(index)

    def _of(self, index: Any) -> np.ndarray[Any, Any]:
        at = np.asarray(index, dtype=np.int64)
        if len(at) and not (-self.n <= at.min() and at.max() < self.n):
            raise IndexError(f"indices out of {self.n}")
        return at % self.n if self.fill is None else np.full(at.shape, self.fill, np.int64)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray[Any, Any]:
        out = (np.arange(self.n, dtype=np.int64) if self.fill is None
               else np.full(self.n, self.fill, dtype=np.int64))
        return out if dtype is None else out.astype(dtype)

    def tolist(self) -> list[int]:
        return self.__array__().tolist()  # type: ignore[no-any-return]

    def __iter__(self) -> Any:
        return iter(self.tolist())


def compact(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``values`` (non-negative integers) as ``int32`` when they fit: half the memory of
    ``int64`` for a plan's per-unit arrays."""
    if values.dtype == np.int32 or (len(values) and int(values.max()) >= 2**31):
        return values
    return values.astype(np.int32)


class Orders(dict[Any, Any]):
    """A round's unit orders by what they depend on (shuffle, shuffler, seed, segment,
    epoch; not the world size or layout), so that the plans of one round for several shapes,
    or built again at every checkpoint, permute its units once. The two newest are kept;
    pickled empty (a DataLoader worker computes its own)."""

    KEEP = 2

    def __reduce__(self) -> Any:
        return Orders, ()

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        while len(self) > self.KEEP:
            del self[next(iter(self))]


class Parts:
    """Row groups cut into plan units: group ``g`` of ``sizes[g]`` rows into ``counts[g]``
    parts of equal size (+-1 row, the larger last), numbered ``starts[g] ..
    starts[g + 1] - 1``. What a plan unit's row group and first row are, computed from
    per-group arrays (NOTE [ compact plans ] in ``plan/epoch.py``)."""

    def __init__(self, sizes: np.ndarray[Any, Any], counts: np.ndarray[Any, Any]) -> None:
        self.sizes = sizes.astype(np.int64)
        self.counts = counts.astype(np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def group(self, units: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return np.searchsorted(self.starts, units, "right") - 1

    def bounds(self, units: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], ...]:
        """(group, first row, end row) of plan units ``units``."""
        g = self.group(units)
        k = units - self.starts[g]
        size, count = self.sizes[g], self.counts[g]
        return g, (k * size) // count, ((k + 1) * size) // count

    def view(self, what: str) -> PartsView:
        return PartsView(self, what)


class PartsView:
    """``source`` (``"group"``) or ``first`` (``"first"``) of every plan unit of
    :class:`Parts`, without their arrays; indexed like the array it stands for."""

    def __init__(self, parts: Parts, what: str) -> None:
        self.parts, self.what = parts, what

    def __len__(self) -> int:
        return len(self.parts)

    def _of(self, at: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        n = len(self)
        if len(at) and not (-n <= int(at.min()) and int(at.max()) < n):
            raise IndexError(f"indices out of {n}")
        group, first, _ = self.parts.bounds(at % max(n, 1))
        return group if self.what == "group" else first

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, int | np.integer):
            return int(self._of(np.array([int(index)], dtype=np.int64))[0])
        if isinstance(index, slice):
            return self._of(np.arange(len(self), dtype=np.int64)[index])
        return self._of(np.asarray(index, dtype=np.int64))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray[Any, Any]:
        out = self._of(np.arange(len(self), dtype=np.int64))
        return out if dtype is None else out.astype(dtype)

    def tolist(self) -> list[int]:
        return self.__array__().tolist()  # type: ignore[no-any-return]

    def __iter__(self) -> Any:
        return iter(self.tolist())
