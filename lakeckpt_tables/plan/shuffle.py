"""Seeded permutations of a shuffle window's rows (pure: no I/O, no global RNG).

NOTE [ keyed permutation ]
A window of half a million rows was shuffled with ``Generator(PCG64).permutation``: a
Fisher-Yates pass whose cache misses cost more per row (~34 ns) than decoding the row, and
which must be computed whole even when a reader needs a part of the window (a piece of an
elastic re-plan, a resume in mid-window). The ``feistel`` shuffler instead maps a position
to a row directly, so a piece computes only its own positions, vectorised in a few ns a row:

- the rows ``[0, n)`` live in ``Z_a x Z_B`` with ``B = 2^k``, ``B^2 >= n``, ``a = ceil(n/B)``
  (``a * B - n < B``: almost no padding);
- :data:`ROUNDS` Feistel rounds with alternating radices, ``(L, R) -> (R, (L + T_i[R]) mod m)``
  (``m = a`` and ``B`` in turn), each a bijection whatever the round table ``T_i``; the
  tables are small (``a`` or ``B`` entries, in cache) and drawn from the window's seed;
- a position whose image falls in the padding ``[n, a * B)`` is mapped again until it lands
  in ``[0, n)`` (cycle walking), which keeps the map a permutation of ``range(n)``.

Windows of at most :data:`SMALL_WINDOW` rows use the exact uniform permutation: it costs
nothing at that size, and a Feistel network over tiny halves has few distinct outcomes.

A reader state records the shuffler its rows were ordered with; states written before this
one existed (``legacy``: ``PCG64`` for every window) keep it, and resume to the same order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["BALANCED", "FEISTEL", "LEGACY", "ROUNDS", "SHUFFLERS", "SMALL_WINDOW", "WindowOrder",
           "permutation", "window_order"]

LEGACY = "pcg64"
"""``Generator(PCG64(seed)).permutation(n)`` for every window: reader states without a
shuffler name were made with it."""
FEISTEL = "feistel"
"""The keyed permutation of NOTE [ keyed permutation ] for windows; units in a plain seeded
order (reader states written with it keep it)."""
BALANCED = "balanced"
"""The default: windows as :data:`FEISTEL`, units in the balanced order of NOTE [ balanced
unit order ] in ``lakeckpt_tables.plan``."""
SHUFFLERS = (LEGACY, FEISTEL, BALANCED)

ROUNDS = 4
"""Feistel rounds: four rounds with random round functions (Luby-Rackoff) already look
random; a round costs ~1.5 ns a row."""
SMALL_WINDOW = 4096
"""Most rows of a window shuffled with the exact permutation by the ``feistel`` shuffler."""

Rows = np.ndarray[Any, np.dtype[np.int64]]


def permutation(n: int, seed: int) -> Rows:
    """A seeded uniform permutation of ``range(n)`` (``PCG64``, Fisher-Yates)."""
    return np.random.Generator(np.random.PCG64(seed)).permutation(n).astype(np.int64)


def window_order(shuffler: str, n: int, seed: int, lo: int, hi: int) -> Rows:
    """Positions ``[lo, hi)`` of the seeded permutation of ``range(n)``: the window rows that
    come out ``lo``-th to ``hi - 1``-th. Only those positions are computed (``feistel``).

    Raises:
        ValueError: an unknown shuffler, or positions outside ``[0, n]``.
    """
    return WindowOrder(shuffler, n, seed)(lo, hi)


class WindowOrder:
    """The seeded permutation of a window's ``n`` rows, position by position: a reader asks
    for one batch's positions at a time, so the work stays in cache and the round tables are
    drawn once.

    Raises:
        ValueError: an unknown shuffler.
    """

    def __init__(self, shuffler: str, n: int, seed: int) -> None:
        if shuffler not in SHUFFLERS:
            raise ValueError(f"unknown shuffler {shuffler!r}; this version knows {SHUFFLERS}")
        self.n = n
        self._whole: Rows | None = None
        self._tables: list[np.ndarray[Any, Any]] = []
        if shuffler == LEGACY or n <= SMALL_WINDOW:
            self._whole = permutation(n, seed)
            return
        self._k = ((n - 1).bit_length() + 1) // 2
        self._big, self._a = 1 << self._k, -(-n // (1 << self._k))
        self._kind = np.uint32 if self._a * self._big <= 2**32 else np.uint64
        rng = np.random.Generator(np.random.PCG64(seed))
        self._tables = [rng.integers(0, self._a if i % 2 == 0 else self._big,
                                     self._big if i % 2 == 0 else self._a, dtype=self._kind)
                        for i in range(ROUNDS)]

    def __call__(self, lo: int, hi: int) -> Rows:
        """Rows at positions ``[lo, hi)``.

        Raises:
            ValueError: positions outside ``[0, n]``.
        """
        if not 0 <= lo <= hi <= self.n:
            raise ValueError(f"positions [{lo}, {hi}) are not inside a window of {self.n} rows")
        if self._whole is not None:
            return self._whole[lo:hi]
        out = self._walk(np.arange(lo, hi, dtype=self._kind))
        outside = np.flatnonzero(out >= self.n)
        while len(outside):  # cycle walking out of the padding [n, a * B)
            out[outside] = self._walk(out[outside])
            outside = outside[out[outside] >= self.n]
        return out.astype(np.int64)

    def _walk(self, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        kind, k, a, mask = self._kind, self._k, self._a, self._big - 1
        left, right = x >> kind(k), x & kind(mask)  # (Z_a, Z_B)
        for i, table in enumerate(self._tables):
            mixed = np.take(table, right)
            mixed += left
            if i % 2 == 0:  # mod a: mixed < 2a; unsigned, mixed - a wraps to huge below a
                np.minimum(mixed, mixed - kind(a), out=mixed)
            else:  # mod B
                mixed &= kind(mask)
            left, right = right, mixed
        out: np.ndarray[Any, Any] = (left << kind(k)) | right  # ROUNDS even: (Z_a, Z_B)
        return out
