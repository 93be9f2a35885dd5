"""The schedule of a mixture: which source supplies each draw, a pure function of (seed, draw).

NOTE [ mixture schedule ]
A *draw* is one batch of the mixture. Which source supplies draw ``i`` is a pure function of
the seed and ``i``, so every rank and DataLoader worker computes it alone, a resume continues it
and an elastic re-plan keeps it; nothing about the schedule is stored but the draw index.

Per batch, not per sequence: each source is an ordinary reader yielding whole batches with its
own exactly-once position (a seek), its own columns and its own ledger records. Mixing inside a
batch would split sources' batches and carry the leftovers in the state (token data, not a
position), and a batch's tensors could not be stacked when sources have different columns.
Over many steps a per-batch mixture trains on the same proportions; within one step a batch
comes from one source (with many ranks, every rank's batch of a step comes from the same one).

The schedule is a Kronecker (golden-ratio) sequence: ``u_i = (x0 + i * A) mod 2^64`` with ``A``
the 64-bit golden ratio and ``x0`` mixed from the seed, and draw ``i`` goes to the source whose
cumulative-weight interval holds ``u_i``. It is low-discrepancy: over ANY window of consecutive
draws each source's count is within a few draws of ``weight x window`` (iid sampling would be
off by ~sqrt(window) and could go far off in some window). It is integer arithmetic only, so
the same on every machine, and O(1) per draw: no index is precomputed (Megatron's blend index
for 93M rows takes ~90 minutes to build). Sources are ordered by name, so the order of the dict
does not matter.

Weights that change with the draw (a schedule: ``mixture/weights.py``) move the intervals, not
the sequence: draw ``i`` goes to the source whose interval *at draw i* holds ``u_i``. The
sequence stays equidistributed, so over any window each source's count stays within a few
draws of the sum of its weights over the window's draws; a constant stretch of a schedule
draws exactly what constant weights draw.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["schedule", "scheduled", "scheduled_per_draw", "thresholds", "thresholds_per_draw"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio, odd


def _mix(seed: int) -> np.uint64:
    """splitmix64 of the seed: a start point of the sequence per seed."""
    z = (seed * 0x9E3779B97F4A7C15 + 0x9E3779B97F4A7C15) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return np.uint64(z ^ (z >> 31))


def thresholds(weights: list[float]) -> np.ndarray[Any, Any]:
    """Upper ends of each source's interval of [0, 2^64), but the last (the rest)."""
    cum = np.cumsum(np.asarray(weights, dtype=np.float64))
    cum /= cum[-1]
    return np.array([min(int(c * 2.0**64), 2**64 - 1) for c in cum[:-1]], dtype=np.uint64)


def thresholds_per_draw(weights: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """:func:`thresholds` of each row of ``weights`` (draws x sources, rows positive sums),
    vectorized: row ``w`` gives what ``thresholds(list(w))`` gives."""
    cum = np.cumsum(np.asarray(weights, dtype=np.float64), axis=1)
    cum /= cum[:, -1:]
    top = np.nextafter(1.0, 0.0)  # below 1: c * 2^64 fits an uint64 (the last end is the rest)
    return (np.minimum(cum[:, :-1], top) * 2.0**64).astype(np.uint64)


def schedule(seed: int, weights: list[float], draws: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The source (index into ``weights``) of each draw (NOTE [ mixture schedule ]).

    Args:
        seed: the mixture's seed.
        weights: positive weights, in the order of the sources (by name).
        draws: draw indices (non-negative integers).
    """
    return scheduled(seed, thresholds(weights), draws)


def scheduled(seed: int, bounds: np.ndarray[Any, Any],
              draws: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """:func:`schedule` with the weights' :func:`thresholds` computed once by the caller."""
    return np.searchsorted(bounds, _points(seed, draws), side="right")


def scheduled_per_draw(seed: int, bounds: np.ndarray[Any, Any],
                       draws: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """:func:`scheduled` with each draw's own thresholds (``bounds``: draws x (sources - 1),
    from :func:`thresholds_per_draw`)."""
    u = _points(seed, draws)
    return (u[:, None] >= bounds).sum(axis=1) if bounds.shape[1] else np.zeros(len(u), np.int64)


def _points(seed: int, draws: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``u_i`` of each draw: the Kronecker sequence started by the seed."""
    i = np.asarray(draws, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return _mix(seed) + i * _GOLDEN  # wraps modulo 2^64
