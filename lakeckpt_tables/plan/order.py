"""The order of an epoch's units: seeded, groups (row groups) kept together, balanced across
epochs (NOTE [ balanced unit order ])."""

from __future__ import annotations

from typing import Any

import numpy as np

from lakeckpt_tables.plan.compact import Parts
from lakeckpt_tables.plan.policy import PlanPolicy, derive_seed
from lakeckpt_tables.plan.shuffle import BALANCED, permutation

__all__ = ["BALANCE_CYCLE", "unit_order"]

Ints = np.ndarray[Any, np.dtype[np.int64]]


def unit_order(count: int, policy: PlanPolicy, segment: int, epoch: int,
               groups: Ints | Parts | None) -> Ints:
    """The epoch's units in reading order (indices into the canonical order), by
    ``policy``'s shuffle and shuffler; ``groups``: each unit's row group (kept together)."""
    if not policy.shuffle:
        return _small(np.arange(count, dtype=np.int64))
    seed = derive_seed(policy.seed, segment, epoch, "units")
    if isinstance(groups, Parts):
        if policy.shuffler != BALANCED or count > BALANCE_LIMIT:
            return _parts_order(groups, policy, segment, epoch)
        groups = np.asarray(groups.view("group"))  # few units: layered as they are
    if policy.shuffler == BALANCED:
        if groups is None and count > BALANCE_LIMIT:
            return _inverse(_permutation(count, seed))  # NOTE [ compact plans ] (epoch.py)
        return _small(_balanced_permutation(np.arange(count, dtype=np.int64) if groups is None
                                            else groups, policy.seed, segment, epoch))
    if groups is None:
        return _permutation(count, seed)
    return _small(_grouped_permutation(groups, policy.seed, segment, epoch))


def _parts_order(parts: Parts, policy: PlanPolicy, segment: int,
                 epoch: int) -> np.ndarray[Any, Any]:
    """:func:`_grouped_permutation`, or :func:`_balanced_permutation` of more than
    ``BALANCE_LIMIT`` units, for groups of contiguous units (``parts``), in ``int32`` and
    without sorting every unit (NOTE [ compact plans ] in ``plan/epoch.py``): both order the
    groups by a rank and the units of a group by a seeded key, so each group's units are
    sorted alone and the groups laid out in rank order."""
    seed = policy.seed
    groups = len(parts.counts)
    if policy.shuffler != BALANCED:
        rank = _inverse(_permutation(groups, derive_seed(seed, segment, epoch, "units")))
    elif groups > BALANCE_LIMIT:
        rank = _permutation(groups, derive_seed(seed, segment, epoch, "units"))
    else:
        rank = np.empty(groups, dtype=np.int64)
        rank[_family_order(np.zeros(groups, dtype=np.int64), seed, segment, epoch,
                           "units")] = np.arange(groups)
    key = _permutation(len(parts), derive_seed(seed, segment, epoch, "parts"))
    for g0, g1, local in _group_chunks(parts):  # each group's units by key, over the key
        c, e = int(parts.starts[g0]), int(parts.starts[g1])
        key[c:e] = np.lexsort((key[c:e], local)) + c
    order = _inverse(rank)  # groups in rank order
    dest = np.empty(groups, dtype=np.int64)
    dest[order] = np.concatenate([[0], np.cumsum(parts.counts[order])[:-1]])
    out = np.empty_like(key)
    for g0, g1, local in _group_chunks(parts):
        c, e = int(parts.starts[g0]), int(parts.starts[g1])
        out[dest[local] + np.arange(c, e) - parts.starts[local]] = key[c:e]
    return out


def _group_chunks(parts: Parts) -> Any:
    """(first group, end group, group of each unit) of runs of whole groups, ~65,536 units
    each."""
    g0, groups = 0, len(parts.counts)
    while g0 < groups:
        g1 = max(int(np.searchsorted(parts.starts, parts.starts[g0] + (1 << 16), "right")) - 1,
                 g0 + 1)
        g1 = min(g1, groups)
        yield g0, g1, np.repeat(np.arange(g0, g1, dtype=np.int64), parts.counts[g0:g1])
        g0 = g1


def _small(order: Ints) -> np.ndarray[Any, Any]:
    """An order as ``int32`` when it fits (NOTE [ compact plans ] in ``plan/epoch.py``)."""
    return order.astype(np.int32) if len(order) < 2**31 else order


def _permutation(count: int, seed: int) -> np.ndarray[Any, Any]:
    """:func:`~lakeckpt_tables.plan.shuffle.permutation` in ``int32`` when it fits, without
    an ``int64`` copy: ``Generator.shuffle`` of a range draws what ``permutation`` draws."""
    if count >= 2**31:
        return permutation(count, seed)
    out = np.arange(count, dtype=np.int32)
    np.random.Generator(np.random.PCG64(seed)).shuffle(out)
    return out


def _inverse(key: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The inverse permutation (what ``argsort`` gives), scattered 65,536 at a time."""
    out = np.empty_like(key)
    step = 1 << 16
    for c in range(0, len(key), step):
        out[key[c:c + step]] = np.arange(c, min(c + step, len(key)), dtype=key.dtype)
    return out


def _grouped_permutation(groups: np.ndarray[Any, np.dtype[np.int64]], seed: int, segment: int,
                         epoch: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Groups in a seeded order, the units of each group in a seeded order within it
    (groups numbered ``0..G-1``). With one unit per group this is :func:`permutation`."""
    if not len(groups):
        return np.zeros(0, dtype=np.int64)
    count = int(groups.max()) + 1
    rank = np.empty(count, dtype=np.int64)
    rank[permutation(count, derive_seed(seed, segment, epoch, "units"))] = np.arange(count)
    within = permutation(len(groups), derive_seed(seed, segment, epoch, "parts"))
    return np.lexsort((within, rank[groups])).astype(np.int64)


BALANCE_CYCLE = 8
"""Epochs per chain of deals (NOTE [ balanced unit order ]): planning an epoch costs
at most this many sorts of its units."""


BALANCE_LIMIT = 1 << 15
"""Most items ordered in layers (NOTE [ balanced unit order ]); past it a random order is
already close to balanced (a slice's share is a sum over many items) and layering would cost
more than the rest of planning."""


def _balanced_permutation(groups: np.ndarray[Any, np.dtype[np.int64]], seed: int,
                          segment: int, epoch: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Groups, then the units of each group, in the layered order of NOTE [ balanced unit
    order ] (groups numbered ``0..G-1``).

    NOTE [ balanced unit order ]
    A slice reads a contiguous range of the epoch's unit order, and a unit is read whole, so with
    independent random orders the share of its rows a slice reads again the next epoch is a sum over
    few units: on a 500k-row table of one row group (122 units) read by 2 ranks it ranged from 0.40
    to 0.54 over 8 seeds (0.32 to 0.64 at 100k rows), where 1/2 is meant. So each epoch's order is
    laid out from the previous one's: cut it into blocks of about ``sqrt(m)`` of its ``m`` items (a
    size with many divisors), shuffle each block, and deal: first every block's first item (blocks
    in a random order), then every block's second item, and so on. Any contiguous share ``1/s`` of
    the new order holds about ``1/s`` of every old block, so each slice of any shape reads again
    ``1/s`` of its items, up to a block (``s`` up to ``sqrt(m)``; exactly when ``s`` divides the
    block size). The order does not depend on the world size: an elastic re-plan's layout refers to
    it. Layers chain within cycles of :data:`BALANCE_CYCLE` epochs from a random order (planning
    costs a few sorts), applied to the groups and, within each group, to its units (a group spanning
    slices is balanced too), up to :data:`BALANCE_LIMIT` items each.
    Units of a group stay together, so a slice still decodes a row group once.
    """
    if not len(groups):
        return np.zeros(0, dtype=np.int64)
    count = int(groups.max()) + 1
    place = np.empty(count, dtype=np.int64)
    place[_family_order(np.zeros(count, dtype=np.int64), seed, segment, epoch, "units")] = (
        np.arange(count))
    within = np.empty(len(groups), dtype=np.int64)
    within[_family_order(groups, seed, segment, epoch, "parts")] = np.arange(len(groups))
    return np.lexsort((within, place[groups])).astype(np.int64)


def _family_order(family: np.ndarray[Any, np.dtype[np.int64]], seed: int, segment: int,
                  epoch: int, what: str) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Items by family, each family in its epoch's layered order (NOTE [ balanced unit
    order ]); in a random order past :data:`BALANCE_LIMIT` items."""
    n = len(family)
    start = epoch - epoch % BALANCE_CYCLE if n <= BALANCE_LIMIT else epoch
    key = permutation(n, derive_seed(seed, segment, start, what))
    order = np.lexsort((key, family))
    for e in range(start, epoch):
        order = _deal(family[order], order, derive_seed(seed, segment, e, what, "layers"))
    return order


BLOCK_SIZES = np.array([1, 2, 6, 12, 24, 60, 120, 360, 720, 2520, 5040], dtype=np.int64)
"""Block sizes of a deal: a slice count dividing the block size gets an exact share of every
block, and these are divisible by the common ones (2, 3, 4, 6, 8, 12, ...)."""


def _block_size(size: np.ndarray[Any, np.dtype[np.int64]]) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The largest of :data:`BLOCK_SIZES` at most ``sqrt(size)``: about as many blocks as
    layers."""
    index = np.searchsorted(BLOCK_SIZES, np.sqrt(size), side="right") - 1
    sizes: np.ndarray[Any, np.dtype[np.int64]] = BLOCK_SIZES[np.maximum(index, 0)]
    return sizes


def _deal(family: np.ndarray[Any, np.dtype[np.int64]], order: np.ndarray[Any, np.dtype[np.int64]],
          seed: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The next epoch's order from ``order`` (items grouped by ``family``, sorted): each
    family's run cut into blocks (:func:`_block_size`), each block shuffled, dealt."""
    n = len(order)
    first = np.flatnonzero(np.concatenate([[True], family[1:] != family[:-1]]))
    size = np.diff(np.append(first, n))
    position = np.arange(n) - np.repeat(first, size)
    block = position // np.repeat(_block_size(size), size)
    by_block = np.lexsort((permutation(n, derive_seed(seed, "items")), block, family))
    cut = np.flatnonzero(np.concatenate([[True], (np.diff(family[by_block]) != 0)
                                         | (np.diff(block[by_block]) != 0)]))
    lengths = np.diff(np.append(cut, n))
    layer = np.empty(n, dtype=np.int64)
    layer[by_block] = np.arange(n) - np.repeat(cut, lengths)
    block_key = np.empty(n, dtype=np.int64)
    block_key[by_block] = np.repeat(permutation(len(cut), derive_seed(seed, "blocks")), lengths)
    return order[np.lexsort((block_key, layer, family))]
