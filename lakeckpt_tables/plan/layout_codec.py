"""Layouts in a reader state: integer columns, compressed (NOTE [ compact layouts ]).

NOTE [ compact layouts ]
An elastic re-plan's layout has two pieces per old slice (the rest of a begun window, then
the slice's whole windows not begun): 4,096 pieces after 256 x 8 slices were re-planned, and
every worker's state carries it. As JSON (``[[[a, b]], seed, lo, hi, shuffler]`` per piece)
that was 247 KiB a worker, 360 KiB after a second re-plan (zlib of that JSON: 110 KB).
Encoded instead as columns of int64 (per piece: kind, span count, ``lo``, rows cut off the
end; per span: the gap to the previous span's end, which is 0 where a layout's spans tile the
base space as a re-plan's do, and its length; window seeds once each, in first-use order, and
per seeded piece the index of its seed), each column's bytes split into 8 byte planes (zeros
of small numbers end up in long runs), zlib, base85: 31 KB and 40 KB there (``lakeckpt
bench scale``: a worker's state 40 KB and 45 KB). Half of it is the window seeds, 8 random
bytes each. A derivation of the layout from the old shape and positions would be smaller
still, but would need the table's units to decode a state, which the audits (``lakeckpt
progress``, ``verify``) read without. The encoding is exact, so a state
decoded from it plans the same rows in the same order; the JSON form of earlier states
(a list of pieces) still loads. Base85 (no quote nor backslash in its alphabet) keeps the
state JSON-clean and is a sixth shorter than base64.
"""

from __future__ import annotations

import base64
import threading
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lakeckpt_tables.plan.pieces import Piece
from lakeckpt_tables.plan.shuffle import LEGACY, SHUFFLERS

__all__ = ["decode_layout", "encode_layout"]

KEY_PIECES = "pieces"
KEY_SHUFFLERS = "shufflers"
KEY_COLUMNS = "columns"
_KEYS = {KEY_PIECES, KEY_SHUFFLERS, KEY_COLUMNS}


_Key = tuple[int, tuple[str, ...], str]  # pieces, shufflers, columns
_KEPT = 4
_layouts: dict[_Key, tuple[Piece, ...]] = {}
_forms: dict[int, tuple[tuple[Piece, ...], _Key]] = {}  # by id() of the layout it holds
"""The last few layouts encoded or decoded, both ways. Every ``state_dict()`` of a worker
encodes the same layout object (10 ms at 6,000 pieces), and rank 0 merges every worker's
state, each with the same layout (1,024 states of 5,600 pieces: 29 s decoded one by one,
0.3 s now)."""


_lock = threading.Lock()


def _remember(layout: tuple[Piece, ...], key: _Key) -> None:
    with _lock:
        if len(_layouts) >= _KEPT:
            del _layouts[next(iter(_layouts))]
        if len(_forms) >= _KEPT:
            del _forms[next(iter(_forms))]
        _layouts[key] = layout
        _forms[id(layout)] = (layout, key)


def encode_layout(layout: Sequence[Piece]) -> dict[str, Any]:
    """``layout`` as ``{"pieces": n, "shufflers": [name, ...], "columns": "<base85>"}``."""
    known = _forms.get(id(layout))
    if known is not None and known[0] is layout:
        key = known[1]
    else:
        key = _encode(layout)
        if isinstance(layout, tuple):
            _remember(layout, key)
    return {KEY_PIECES: key[0], KEY_SHUFFLERS: list(key[1]), KEY_COLUMNS: key[2]}


def _encode(layout: Sequence[Piece]) -> _Key:
    shufflers = sorted({p.shuffler for p in layout if p.seed is not None})
    kinds = [0 if p.seed is None else 1 + shufflers.index(p.shuffler) for p in layout]
    counts = [len(p.spans) for p in layout]
    gaps, lengths = [], []
    end = 0
    for piece in layout:
        for a, b in piece.spans:
            gaps.append(a - end)
            lengths.append(b - a)
            end = b
    seeds: dict[int, int] = {}
    uses = [seeds.setdefault(p.seed, len(seeds)) for p in layout if p.seed is not None]
    lo = [p.lo for p in layout]
    cut = [sum(b - a for a, b in p.spans) - p.hi for p in layout]
    columns = np.array([*kinds, *counts, *gaps, *lengths, *lo, *cut, *uses, *seeds],
                       dtype="<i8")
    planes = columns.view(np.uint8).reshape(-1, 8).T.tobytes()
    return (len(layout), tuple(shufflers),
            base64.b85encode(zlib.compress(planes, 9)).decode("ascii"))


def decode_layout(value: Any) -> tuple[Piece, ...]:
    """A layout from :func:`encode_layout`'s form or the JSON form (a list of pieces).

    Raises:
        ValueError: malformed (the reader state names it corrupt).
    """
    if isinstance(value, list):
        return tuple(Piece.from_json(p) for p in value)
    if not isinstance(value, Mapping) or set(value) != _KEYS:
        raise ValueError(f"a layout is a list of pieces or a dict with keys {sorted(_KEYS)}, "
                         f"got {value!r:.80}")
    n, shufflers, text = value[KEY_PIECES], value[KEY_SHUFFLERS], value[KEY_COLUMNS]
    if (not isinstance(n, int) or isinstance(n, bool) or n < 0 or not isinstance(text, str)
            or not isinstance(shufflers, list)):
        raise ValueError(f"malformed compact layout {value!r:.80}")
    key = (n, tuple(map(str, shufflers)), text)
    found = _layouts.get(key)
    if found is None:
        found = _decode(*key)
        _remember(found, key)
    return found


def _decode(n: int, shufflers: tuple[str, ...], text: str) -> tuple[Piece, ...]:
    try:
        planes = zlib.decompress(base64.b85decode(text))
        if len(planes) % 8:
            raise ValueError("not whole int64 columns")
        columns = np.frombuffer(planes, dtype=np.uint8).reshape(8, -1).T.copy().view("<i8")
        return _pieces(n, list(shufflers), columns.ravel())
    except (ValueError, IndexError, zlib.error) as exc:
        raise ValueError(f"compact layout is damaged: {exc}") from exc


def _pieces(n: int, shufflers: list[str], values: np.ndarray[Any, Any]) -> tuple[Piece, ...]:
    """The pieces of ``n`` from the flat columns, checked as :meth:`Piece.from_json` checks
    one (at once: a 6,000-piece layout decodes in a few ms)."""
    kinds, counts = values[:n], values[n:2 * n]
    if (counts < 0).any() or (kinds < 0).any() or (kinds > len(shufflers)).any():
        raise ValueError("bad piece kinds or span counts")
    if any(name not in SHUFFLERS for name in shufflers):
        raise ValueError(f"unknown shuffler in {shufflers}")
    spans, seeded = int(counts.sum()), int((kinds > 0).sum())
    gaps, lengths = values[2 * n:2 * n + spans], values[2 * n + spans:2 * n + 2 * spans]
    at = 2 * n + 2 * spans
    lo, cut, uses = values[at:at + n], values[at + n:at + 2 * n], values[at + 2 * n:
                                                                       at + 2 * n + seeded]
    seeds = values[at + 2 * n + seeded:]
    if len(values) < at + 2 * n + seeded:
        raise ValueError(f"{len(values)} values for {n} pieces of {spans} spans")
    if not np.array_equal(np.unique(uses), np.arange(len(seeds))):
        raise ValueError("a seed no piece uses, or a piece using no seed")
    if np.abs(gaps).sum(dtype=np.float64) + np.abs(lengths).sum(dtype=np.float64) >= 2**62:
        raise ValueError("spans past any table")  # and no int64 sum below overflows
    ends = np.cumsum(gaps + lengths)
    starts = ends - lengths
    cum = np.concatenate([[0], np.cumsum(lengths)])
    first = np.concatenate([[0], np.cumsum(counts)])
    totals = cum[first[1:]] - cum[first[:-1]]
    if ((lengths < 0).any() or (starts < 0).any() or (seeds < 0).any() or (lo < 0).any()
            or (cut < 0).any() or (lo > totals - cut).any()):
        raise ValueError("a piece's spans or [lo, hi) out of range")
    pairs = list(zip(starts.tolist(), ends.tolist(), strict=True))
    names = [LEGACY, *shufflers]
    seed_of = seeds[uses].tolist()
    out: list[Piece] = []
    used = 0
    for k, c, f, a, b in zip(kinds.tolist(), counts.tolist(), first[:-1].tolist(), lo.tolist(),
                             (totals - cut).tolist(), strict=True):
        seed = None
        if k:
            seed, used = seed_of[used], used + 1
        out.append(Piece(tuple(pairs[f:f + c]), seed, a, b, names[k]))
    return tuple(out)
