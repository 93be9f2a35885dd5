"""The read plan: a pure function from (units, policy, segment, epoch) to every slice's rows.

No I/O, no clock, no global RNG, no torch. A *slice* is one (rank, DataLoader worker) pair,
numbered ``g = rank * workers + worker``; its reader state is one integer, the rows delivered.

NOTE [ pieces and layouts ]
An epoch's *base space* is the segment's units, permuted by a seed derived from
(seed, segment, epoch), laid end to end: rows ``[0, N)``. A *piece* is an ordered set of base
rows: a tuple of base-space spans, optionally permuted by a seed, of which the range
``[lo, hi)`` is taken. An epoch's *layout* is a tuple of pieces; by default the single piece
``[0, N)``. Slices get equal contiguous ranges of the layout, and a slice emits its range as
*windows*, which are pieces again: ``shuffle_window`` units at a time, rows permuted within
the window. Because a window is a piece, what a slice has not yet delivered (the rest of a
partially read window, then whole windows) is a list of pieces, and those lists, concatenated,
are the layout of an elastic re-plan for another world size. Any number of re-plans compose.

NOTE [ lockstep ]
With more than one rank every slice yields the same number of batches per epoch (one
collective per step). Batch ``j`` of a slice of ``s`` rows cut into ``n`` batches ends at
``min((j + 1) * batch_size, s - (n - 1 - j))``: full batches, except that a slice one row
short gives up one row in its last batch (or its last two). Sizes then differ by at most one
row across ranks, never in number. When that is impossible (batch size 1 with uneven slices,
or fewer rows than slices) the last ``rows mod slices`` rows of the layout form the epoch's
*tail*: reported by :meth:`EpochPlan.tail`, re-planned by an elastic resume, and in follow
mode carried into the next segment (NOTE [ segment tails are carried ] in
``lakeckpt_tables.reader.rounds``); an epoch's tail is not delivered.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lakeckpt_tables.plan.shuffle import (
    BALANCED,
    FEISTEL,
    LEGACY,
    SHUFFLERS,
    WindowOrder,
    permutation,
)

__all__ = [
    "BALANCED",
    "BALANCE_CYCLE",
    "DEFAULT_SHUFFLE_WINDOW",
    "FEISTEL",
    "LEGACY",
    "SHUFFLERS",
    "EpochPlan",
    "Piece",
    "PlanPolicy",
    "cut_spans",
    "derive_seed",
    "permutation",
    "replan",
    "replan_rounds",
]


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


Span = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Piece:
    """Rows ``[lo, hi)`` of the base-space ``spans`` laid end to end, permuted by ``seed``
    with ``shuffler`` (:mod:`lakeckpt_tables.plan.shuffle`)."""

    spans: tuple[Span, ...]
    seed: int | None
    lo: int
    hi: int
    shuffler: str = LEGACY

    @classmethod
    def plain(cls, spans: Sequence[Span]) -> Piece:
        merged: list[Span] = []  # adjacent spans merged: same rows, smaller state
        for a, b in spans:
            if b <= a:
                continue
            if merged and merged[-1][1] == a:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        return cls(tuple(merged), None, 0, sum(b - a for a, b in merged))

    @property
    def size(self) -> int:
        return self.hi - self.lo

    def cut(self, start: int, stop: int) -> Piece:
        """Rows ``[start, stop)`` of this piece's order, as a piece."""
        if self.seed is not None:
            return Piece(self.spans, self.seed, self.lo + start, self.lo + stop,
                         self.shuffler)
        return Piece.plain(cut_spans(self.spans, self.lo + start, self.lo + stop))

    def rows(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Base-space row numbers in emission order (for tests and audits; O(rows))."""
        base = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in self.spans] or
                              [np.empty(0, np.int64)])
        if self.seed is not None:
            return base[self.order()(self.lo, self.hi)]
        return base[self.lo : self.hi]

    def order(self) -> WindowOrder:
        """The permutation of the spans' rows (a seeded piece only)."""
        assert self.seed is not None
        return WindowOrder(self.shuffler, sum(b - a for a, b in self.spans), self.seed)

    def to_json(self) -> list[Any]:
        value = [[list(s) for s in self.spans], self.seed, self.lo, self.hi]
        # the legacy shuffler is not named: states written before shufflers had names
        return value if self.seed is None or self.shuffler == LEGACY else [*value,
                                                                           self.shuffler]

    @classmethod
    def from_json(cls, value: Any) -> Piece:
        spans, seed, lo, hi, *named = value
        shuffler = str(named[0]) if len(named) == 1 else LEGACY
        if len(named) > 1 or shuffler not in SHUFFLERS:
            raise ValueError(f"malformed piece {value!r}")
        piece = cls(tuple((int(a), int(b)) for a, b in spans),
                    None if seed is None else int(seed), int(lo), int(hi), shuffler)
        total = sum(b - a for a, b in piece.spans)
        if (not 0 <= piece.lo <= piece.hi <= total
                or any(not 0 <= a <= b for a, b in piece.spans)
                or (piece.seed is not None and not 0 <= piece.seed < 2**63)):
            raise ValueError(f"malformed piece {value!r}")
        return piece


def cut_spans(spans: Sequence[Span], start: int, stop: int) -> list[Span]:
    """Rows ``[start, stop)`` of ``spans`` laid end to end, as spans."""
    out: list[Span] = []
    offset = 0
    for a, b in spans:
        length = b - a
        lo, hi = max(start - offset, 0), min(stop - offset, length)
        if lo < hi:
            out.append((a + lo, a + hi))
        offset += length
        if offset >= stop:
            break
    return out


def _cut_layout(layout: Sequence[Piece], start: int, stop: int) -> list[Piece]:
    out: list[Piece] = []
    offset = 0
    for piece in layout:
        lo, hi = max(start - offset, 0), min(stop - offset, piece.size)
        if lo < hi:
            out.append(piece.cut(lo, hi))
        offset += piece.size
        if offset >= stop:
            break
    return out


def coalesce(pieces: Iterable[Piece]) -> tuple[Piece, ...]:
    """Merge neighbouring plain pieces and adjacent spans, so layouts stay small."""
    out: list[Piece] = []
    for piece in pieces:
        if piece.size == 0:
            continue
        if piece.seed is None and out and out[-1].seed is None:
            spans = list(out[-1].spans)
            for a, b in piece.spans:
                if spans and spans[-1][1] == a:
                    spans[-1] = (spans[-1][0], b)
                else:
                    spans.append((a, b))
            out[-1] = Piece.plain(spans)
        else:
            out.append(piece)
    return tuple(out)


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


class EpochPlan:
    """The plan of one epoch of one segment.

    Args:
        unit_rows: rows of each unit, in canonical (path, row group) order.
        policy: plan parameters.
        segment: segment index (0 for a pinned snapshot).
        epoch: epoch index.
        layout: the epoch's layout; the whole base space when None.
        groups: for each unit, the group (row group) it was cut from; units of a group stay
            together when shuffled: groups are permuted, then units within each group.
    """

    def __init__(
        self,
        unit_rows: Sequence[int] | np.ndarray[Any, Any],
        policy: PlanPolicy,
        *,
        segment: int = 0,
        epoch: int = 0,
        layout: Sequence[Piece] | None = None,
        groups: Sequence[int] | np.ndarray[Any, Any] | None = None,
    ) -> None:
        self.policy = policy
        self.segment = segment
        self.epoch = epoch
        rows = np.asarray(unit_rows, dtype=np.int64)
        if not policy.shuffle:
            self.order = np.arange(len(rows), dtype=np.int64)
        elif policy.shuffler == BALANCED:
            self.order = _balanced_permutation(
                np.arange(len(rows), dtype=np.int64) if groups is None
                else np.asarray(groups, dtype=np.int64),
                policy.seed, segment, epoch)
        elif groups is None:
            self.order = permutation(len(rows), derive_seed(policy.seed, segment, epoch, "units"))
        else:
            self.order = _grouped_permutation(np.asarray(groups, dtype=np.int64),
                                              policy.seed, segment, epoch)
        self.offsets = np.concatenate([[0], np.cumsum(rows[self.order])]).astype(np.int64)
        total = int(self.offsets[-1])
        self.layout = coalesce(layout) if layout is not None else (Piece.plain([(0, total)]),)
        self.rows = sum(p.size for p in self.layout)
        self._plan_slices()

    def _plan_slices(self) -> None:
        p, m = self.policy, self.rows
        s = p.slices
        q, r = divmod(m, s)
        b = p.batch_size
        if p.lockstep and not p.drop_last and r and (b < 2 or q < 1):
            m, r = s * q, 0  # remainder cannot be delivered in lockstep: it becomes the tail
        self.delivered_total = m
        self.bounds = [(m * g) // s for g in range(s + 1)]
        if p.lockstep:
            smax, smin = q + (1 if r else 0), q
            self._lockstep_batches: int | None = smin // b if p.drop_last else -(-smax // b)
        else:
            self._lockstep_batches = None

    def slice_rows(self, g: int) -> int:
        """Rows in slice ``g``'s range (delivered or dropped by drop_last)."""
        return self.bounds[g + 1] - self.bounds[g]

    def batch_count(self, g: int) -> int:
        if self._lockstep_batches is not None:
            return self._lockstep_batches
        s, b = self.slice_rows(g), self.policy.batch_size
        return s // b if self.policy.drop_last else -(-s // b)

    def batch_ends(self, g: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Cumulative row positions at which slice ``g``'s batches end."""
        n, s, b = self.batch_count(g), self.slice_rows(g), self.policy.batch_size
        j = np.arange(n, dtype=np.int64)
        if self.policy.drop_last:
            return (j + 1) * b
        return np.minimum((j + 1) * b, s - (n - 1 - j))

    def delivered_rows(self, g: int) -> int:
        """Rows slice ``g`` delivers this epoch."""
        ends = self.batch_ends(g)
        return int(ends[-1]) if len(ends) else 0

    def slice_layout(self, g: int) -> list[Piece]:
        return _cut_layout(self.layout, self.bounds[g], self.bounds[g + 1])

    def tail(self) -> list[Piece]:
        """Rows of the layout no slice is given (see NOTE [ lockstep ])."""
        return _cut_layout(self.layout, self.delivered_total, self.rows)

    def windows(self, g: int) -> list[Piece]:
        """Slice ``g``'s emission, as windows in order."""
        out: list[Piece] = []
        for piece in self.slice_layout(g):
            if piece.seed is not None:
                out.append(piece)  # already a (partial) window of an earlier plan
            else:
                out.extend(self._window_plain(piece, g, len(out)))
        return out

    def _window_plain(self, piece: Piece, g: int, first_index: int) -> list[Piece]:
        chunks = [c for span in piece.spans for c in self._unit_chunks(span)]
        k = self.policy.shuffle_window
        out: list[Piece] = []
        for i in range(0, len(chunks), k):
            group = chunks[i : i + k]
            window = Piece.plain(group)
            if self.policy.shuffle:
                seed = derive_seed(self.policy.seed, self.segment, self.epoch, g,
                                   first_index + len(out), "window")
                window = Piece(window.spans, seed, 0, window.size, self.policy.shuffler)
            out.append(window)
        return out

    def _unit_chunks(self, span: Span) -> list[Span]:
        """Cut a base-space span at unit boundaries."""
        a, b = span
        cuts = self.offsets[np.searchsorted(self.offsets, a, "right"):]
        out = []
        for c in cuts:
            c = int(c)
            if c >= b:
                break
            out.append((a, c))
            a = c
        out.append((a, b))
        return out

    def locate(self, spans: Sequence[Span]) -> list[tuple[int, int, int]]:
        """Map base-space spans to ``(canonical unit index, first row, end row)`` chunks."""
        out = []
        for a, b in spans:
            for x, y in self._unit_chunks((a, b)):
                u = int(np.searchsorted(self.offsets, x, "right")) - 1
                start = int(self.offsets[u])
                out.append((int(self.order[u]), x - start, y - start))
        return out

    def remaining(self, g: int, position: int) -> list[Piece]:
        """What slice ``g`` has not delivered after ``position`` rows, as pieces.

        The rest of a begun window keeps its permutation; whole windows not begun come back
        plain (their rows in base order), so that neighbours coalesce and a re-plan's layout
        grows with the number of slices, not with the number of windows (reader state size).
        """
        out = []
        offset = 0
        for window in self.windows(g):
            end = offset + window.size
            if end > position:
                start = max(position - offset, 0)
                whole = window.lo == 0 and window.hi == sum(b - a for a, b in window.spans)
                if start == 0 and whole:
                    out.append(Piece.plain(window.spans))
                else:
                    out.append(window.cut(start, window.size))
            offset = end
        return out


SlicePosition = tuple[int, int]  # (epoch, rows delivered in that epoch)


def replan(
    unit_rows: Sequence[int] | np.ndarray[Any, Any],
    old: PlanPolicy,
    layouts: dict[int, tuple[Piece, ...]],
    positions: Sequence[SlicePosition],
    *,
    segment: int = 0,
) -> tuple[int, dict[int, tuple[Piece, ...]]]:
    """Turn every old slice's undelivered rows into layouts any new policy can plan.

    The epochs of one segment share its units; see :func:`replan_rounds` for rounds with
    units of their own (follow mode).

    Args:
        unit_rows: the segment's unit sizes, canonical order.
        old: the policy the positions were recorded under.
        layouts: the old plan's layouts by epoch (default layout where absent).
        positions: ``(epoch, rows delivered)`` of every old slice, by slice index.
        segment: segment index.

    Returns:
        The epoch to start at, and a layout for every epoch some slice had begun (now or
        under an older shape).
    """
    if len(positions) != old.slices:
        raise ValueError(f"{len(positions)} positions for {old.slices} slices")

    def plan_for(epoch: int, layout: Sequence[Piece] | None) -> EpochPlan:
        return EpochPlan(unit_rows, old, segment=segment, epoch=epoch, layout=layout)

    return replan_rounds(plan_for, layouts, positions)


def replan_rounds(
    plan_for: Callable[[int, Sequence[Piece] | None], EpochPlan],
    layouts: dict[int, tuple[Piece, ...]],
    positions: Sequence[SlicePosition],
    *,
    carried: bool = False,
) -> tuple[int, dict[int, tuple[Piece, ...]]]:
    """:func:`replan` over rounds: ``plan_for(round, layout)`` gives a round's old plan.

    ``carried``: a round's tail went to the round after it (follow segments: NOTE [ segment
    tails are carried ] in ``lakeckpt_tables.reader.rounds``), so only the last round's tail,
    not carried yet, is re-planned; otherwise every round's tail is.

    Returns:
        The round to start at, and a layout for every round some slice had begun.
    """
    first = min(e for e, _ in positions)
    last = max(e for e, _ in positions)
    # A round past every slice's position may still carry the layout of an earlier re-plan
    # (some slice of an older shape had begun it): keep it, or its delivered rows come back.
    new_layouts = {e: tuple(ps) for e, ps in layouts.items() if e > last}
    for epoch in range(first, last + 1):
        plan = plan_for(epoch, layouts.get(epoch))
        pieces: list[Piece] = []
        for g, (e, pos) in enumerate(positions):
            if e <= epoch:
                pieces.extend(plan.remaining(g, pos if e == epoch else 0))
        if not carried or epoch == last:
            pieces.extend(plan.tail())
        new_layouts[epoch] = coalesce(pieces)
    return first, new_layouts
