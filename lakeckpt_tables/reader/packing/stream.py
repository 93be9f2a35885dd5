"""Packing: tokenized documents (rows of a list<int> column) into fixed-length sequences.

NOTE [ packing ]
The *stream* of a run of rows is every document's tokens followed by ``eos_id``, in delivery
order. Packing cuts the stream into sequences of ``seq_len`` tokens; a document longer than
what is left of a sequence is split, and goes on in the next one. ``position_ids`` count from
0 at each document's first token and go on across a split (its eos has the position
``len(document)``), so attention can be masked per document.

:func:`pack` is a pure function: (carry, rows) -> (full sequences, new carry, rows consumed).
It is vectorized over the Arrow list offsets (numpy only, no Python per document). The
:class:`PackCarry` is all a packer remembers between calls, JSON-clean and small:

- ``doc_offset``: how many stream elements of the first row handed in next (its tokens, then
  its eos) were packed already: a row cut by ``limit`` is handed in again from there;
- ``tokens``/``positions``: the partial sequence (fewer than ``seq_len`` tokens) of rows all
  consumed, waiting for the next rows to fill it.

A reader asks for at most the sequences of one batch (``limit``): packing then stops exactly
at a sequence boundary, inside a row if need be, so between two batches the partial sequence
is empty and the position is (row, ``doc_offset``): a seek, like every other reader position,
and the state never holds token data. The partial sequence is non-empty only while rows run
out before a batch is full, or at the end of a pass.

End of a pass: the last partial sequence (fewer than ``seq_len`` tokens) is either dropped
(``last="drop"``, the default: its tokens are *undelivered* and counted, never silently lost)
or padded to ``seq_len`` with ``pad_id`` (``last="pad"``: the padding counts on from
position 0 as a document of its own, so per-document masking keeps it apart, and the number of
padding tokens is reported) by :func:`finish`. The packed ``LakeDataset`` drops: its round's
tail is what cannot be split in lockstep among ranks (NOTE [ token plan ] in
``reader/packing/token_plan.py``), logged with its token count; padding it would hand some ranks
sequences of padding only.

An ``eos_id`` that occurs inside a document makes document boundaries ambiguous to the model:
it is counted exactly (each stream element once, however rows are cut) and warned about once
per process (:class:`~lakeckpt_tables.errors.EosInDocumentWarning`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from lakeckpt_tables.errors import EosInDocumentWarning, PackingError

__all__ = [
    "LAST_POLICIES",
    "PackCarry",
    "Packed",
    "StreamWriter",
    "check_packing",
    "check_token_column",
    "finish",
    "pack",
    "pack_array",
    "warn_eos",
]

LAST_POLICIES = ("drop", "pad")
LastPolicy = Literal["drop", "pad"]

_Int = np.ndarray[Any, np.dtype[np.int64]]
_Bool = np.ndarray[Any, np.dtype[np.bool_]]
_warned_eos = False


@dataclass(frozen=True)
class PackCarry:
    """What a packer remembers between calls (NOTE [ packing ])."""

    doc_offset: int = 0
    tokens: tuple[int, ...] = ()
    positions: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"doc_offset": self.doc_offset, "tokens": list(self.tokens),
                "positions": list(self.positions)}

    @classmethod
    def from_json(cls, value: Mapping[str, Any], seq_len: int) -> PackCarry:
        """Parse and check a carry.

        Raises:
            ValueError: not a carry of a packer of ``seq_len`` (callers name the state).
        """
        if not isinstance(value, Mapping) or set(value) != {"doc_offset", "tokens", "positions"}:
            raise ValueError(f"a packing carry has keys doc_offset, tokens, positions; "
                             f"got {value!r}")
        doc_offset, tokens, positions = value["doc_offset"], value["tokens"], value["positions"]
        ints = [doc_offset, *tokens, *positions]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints):
            raise ValueError(f"a packing carry holds integers only, got {value!r}")
        if doc_offset < 0 or len(tokens) != len(positions) or len(tokens) >= seq_len:
            raise ValueError(f"a packing carry for seq_len={seq_len} has doc_offset >= 0 and "
                             f"fewer than seq_len tokens, one position each; got {value!r}")
        if tokens and doc_offset:
            raise ValueError("a packing carry holds a partial sequence only when its rows are "
                             f"all consumed (doc_offset 0); got {value!r}")
        return cls(doc_offset, tuple(tokens), tuple(positions))


@dataclass(frozen=True)
class Packed:
    """One call's output: full sequences, the new carry, and what was consumed."""

    input_ids: _Int  # [k, seq_len]
    position_ids: _Int  # [k, seq_len]
    carry: PackCarry
    rows: int  # rows consumed whole (tokens and eos packed); the next call starts at this row
    eos_in_documents: int = 0  # eos_id found among the document tokens packed by this call


def check_packing(seq_len: int, eos_id: int, last: str = "drop",
                  pad_id: int | None = None) -> None:
    """Refuse packing options that cannot give fixed-length sequences.

    Raises:
        PackingError: names the option and what to pass instead.
    """
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 2:
        raise PackingError(f"seq_len={seq_len!r}: a packed sequence needs at least 2 tokens "
                           "(a token and what follows it); pass seq_len >= 2")
    if not isinstance(eos_id, int) or isinstance(eos_id, bool):
        raise PackingError(f"eos_id={eos_id!r}: pass the tokenizer's end-of-document id (an int)")
    if last not in LAST_POLICIES:
        raise PackingError(f"last={last!r}: the last partial sequence of a pass is 'drop'ped "
                           "(reported as undelivered tokens) or 'pad'ded; pass one of those")
    if pad_id is not None and (not isinstance(pad_id, int) or isinstance(pad_id, bool)):
        raise PackingError(f"pad_id={pad_id!r}: pass a token id (an int)")


def check_token_column(where: str, schema: pa.Schema, column: str, *,
                       text: bool = False) -> None:
    """Refuse a packing column that is not a list of integers (with ``text``: a tokenizer is
    given, not a string column).

    Raises:
        PackingError: names the table, the column and its type.
    """
    if column not in schema.names:
        raise PackingError(f"{where}: pack_tokens={column!r} is not a column; its columns are "
                           f"{schema.names}")
    kind = schema.field(column).type
    if text:
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise PackingError(f"{where}: pack_tokens={column!r} has type {kind}; a tokenizer "
                               "tokenizes a string column (drop tokenizer= for a token column)")
        return
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        raise PackingError(f"{where}: pack_tokens={column!r} has type {kind}, a text column: "
                           "pass tokenizer= (a tokenizers.Tokenizer) to tokenize it as it is "
                           "read, or name a column of token ids")
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)
            or pa.types.is_fixed_size_list(kind)) or not pa.types.is_integer(kind.value_type):
        raise PackingError(f"{where}: pack_tokens={column!r} has type {kind}; packing reads a "
                           "list of integer token ids (list<int32>, list<int64>...). Tokenize "
                           "the column first, or name the token column")


def pack(carry: PackCarry, offsets: _Int, values: _Int, *, seq_len: int, eos_id: int,
         limit: int | None = None) -> Packed:
    """Pack rows after ``carry`` into full sequences (NOTE [ packing ]).

    Args:
        carry: the packer's state; its ``doc_offset`` applies to row 0.
        offsets: ``n + 1`` row offsets into ``values`` (``offsets[0]`` need not be 0).
        values: the token ids.
        seq_len: tokens per sequence.
        eos_id: appended after every document.
        limit: at most this many sequences; packing then stops at that sequence's end, inside
            a row if need be (``rows`` and ``carry.doc_offset`` say where).

    Returns:
        The sequences, the new carry and the rows consumed whole.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    lo = int(offsets[0])
    writer = StreamWriter(offsets - lo, np.asarray(values)[lo:int(offsets[-1])], eos_id=eos_id)
    ends, total = writer.ends, writer.total
    d = carry.doc_offset
    if n == 0 and d:
        raise ValueError("a carry inside a row needs that row handed in again")
    if n and d > int(lengths[0]):
        raise ValueError(f"doc_offset {d} is past row 0's eos ({int(lengths[0])} tokens)")
    if limit == 0:
        return Packed(_empty(seq_len), _empty(seq_len), carry, 0)
    held = len(carry.tokens)
    k = (held + total - d) // seq_len
    if limit is not None:
        k = min(k, limit)
    # the stream elements this call takes from the rows: [d, take); with k >= 1 sequences
    # cut by the limit, k * seq_len > held
    take = total if (limit is None or k < limit) else d + k * seq_len - held
    flat = np.empty(held + take - d, dtype=np.int64)
    pos = np.empty(held + take - d, dtype=np.int64)
    flat[:held], pos[:held] = carry.tokens, carry.positions
    eos_inside = writer.write(d, take, flat[held:], pos[held:])
    if eos_inside:
        warn_eos(eos_id, eos_inside)
    full = k * seq_len
    if take < total:  # stopped inside the rows, at a sequence end: nothing partial is held
        rows = int(np.searchsorted(ends, take, side="right"))
        start = int(ends[rows - 1]) if rows else 0
        new = PackCarry(doc_offset=take - start)
    else:
        rows = n
        new = PackCarry(0, tuple(flat[full:].tolist()), tuple(pos[full:].tolist()))
    return Packed(flat[:full].reshape(k, seq_len), pos[:full].reshape(k, seq_len), new, rows,
                  eos_inside)


class StreamWriter:
    """The stream of a run of rows (each row's tokens, then ``eos_id``; NOTE [ packing ])
    written straight into the caller's int64 buffers, any range of it at a time: what the
    packed reader cuts into batches and :func:`pack` into sequences.

    Row-sized arrays are made once for the rows; each :meth:`write` is then a few whole-array
    numpy passes into the caller's memory, no Python per document and no token-sized
    temporary but the write's own mask of token slots and the row starts its positions
    subtract, both in 32 bits and reused (2026-11-25, in cache: the masked copy of the tokens
    0.52 ns a token, the positions 0.33; besides, a write costs ~10 us of numpy calls, so the
    reader writes many batches at once).
    """

    __slots__ = ("_eos", "_inside", "_marks", "_scratch", "_spans", "_starts",
                 "_values", "ends", "total")

    def __init__(self, offsets: _Int, values: _Int, *, eos_id: int,
                 reuse: StreamWriter | None = None, eos_free: bool = False) -> None:
        """``offsets``: ``n + 1`` row offsets from 0 into ``values``, the token ids.
        ``eos_free``: the caller knows the eos id is none of the values (a file's statistics
        say so): they are not looked through for it.
        ``reuse``: a writer done with, whose scratch memory this one takes over (a fresh 1 MB
        array per row group cost ~250 page faults of ~3 us here: ~0.6 ns a token)."""
        rows: _Int = np.asarray(offsets, dtype=np.int64)
        spans: _Int = rows[1:] - rows[:-1] + 1
        ends: _Int = np.cumsum(spans)  # stream end of each row (its eos included)
        self.total = int(ends[-1]) if len(ends) else 0
        self.ends, self._spans, self._starts, self._marks = ends, spans, ends - spans, ends - 1
        self._scratch: _Bool = reuse._scratch if reuse is not None else _EMPTY_BOOL
        self._inside: _Int | None = None  # where the eos id is among the tokens, if it is
        if not eos_free:
            found = np.equal(values, eos_id, out=self._bools(len(values)))
            self._inside = np.flatnonzero(found) if found.any() else None
        self._values, self._eos = values, eos_id

    def _bools(self, n: int) -> _Bool:
        """``n`` booleans of scratch memory, grown with headroom (row groups differ a little
        in size: growing to each new largest one would fault its pages in again)."""
        if len(self._scratch) < n:
            self._scratch = np.empty(n + n // 4, bool)
        return self._scratch[:n]

    @classmethod
    def of(cls, array: pa.Array | pa.ChunkedArray, *, eos_id: int,
           reuse: StreamWriter | None = None, eos_free: bool = False) -> StreamWriter:
        """The writer of a list column's rows, from its Arrow buffers (no copy of the values
        unless their type is not an integer one numpy reads as is)."""
        offsets, values = _buffers(array)
        return cls(offsets, values, eos_id=eos_id, reuse=reuse, eos_free=eos_free)

    @property
    def clean(self) -> bool:
        """Whether no document holds the eos id (a write's count is then 0)."""
        return self._inside is None

    def write(self, a: int, b: int, ids: _Int, positions: _Int) -> int:
        """Stream elements ``[a, b)`` into ``ids`` and their position ids into ``positions``
        (each ``b - a`` long); returns the eos ids among their document tokens.

        The ``r`` rows ending at or before stream element ``j`` put ``r`` eos before it, so the
        tokens of ``[a, b)`` are ``values[a - r(a) : b - r(b)]`` in order, landed through the
        eos mask; an element's position is its index less its row's start."""
        if b <= a:
            return 0
        ends = self.ends  # (array methods and scalar searches: a write costs ~5 us besides)
        r0, r1 = int(ends.searchsorted(a, "right")), int(ends.searchsorted(b - 1, "right"))
        rb = r1 + 1 if ends[r1] == b else r1  # rows ending at or before b
        marks = self._marks[r0:rb] - a  # the eos slots
        keep = self._bools(b - a)  # the token slots
        keep.fill(True)
        keep[marks] = False
        ids[keep] = self._values[a - r0:b - rb]
        ids[marks] = self._eos
        skip = a - int(self._starts[r0])
        # positions below 2^31 (any real document) are made in 32 bits and widened as they
        # land: half the bytes through memory for the row starts repeated per token
        # (2026-11-25, 2^15 elements in cache: 0.33 ns a token against 0.60)
        kind = np.int32 if b - a + skip < _INT32_LIMIT else np.int64
        starts = (self._starts[r0:r1 + 1] - a).astype(kind).repeat(self._spans[r0:r1 + 1])
        own = starts[skip:skip + b - a]
        np.subtract(_arange(b - a, kind), own, out=own)
        positions[:] = own
        if self._inside is None:
            return 0
        return int(self._inside.searchsorted(b - rb) - self._inside.searchsorted(a - r0))


_INT32_LIMIT = 1 << 31
_EMPTY_BOOL: _Bool = np.empty(0, bool)
_ARANGES: dict[type, np.ndarray[Any, Any]] = {}


def _arange(n: int, kind: type = np.int64) -> np.ndarray[Any, Any]:
    """``0..n-1`` of integer type ``kind``, a view of one array kept per type (it grows to
    the largest ``n`` asked)."""
    held = _ARANGES.get(kind)
    if held is None or len(held) < n:
        held = _ARANGES[kind] = np.arange(max(n, 2 * (0 if held is None else len(held))),
                                          dtype=kind)
    return held[:n]


def pack_array(carry: PackCarry, array: pa.Array | pa.ChunkedArray, *, seq_len: int,
               eos_id: int, limit: int | None = None) -> Packed:
    """:func:`pack` over a list column straight from its Arrow buffers (no copy of the
    values unless their type is not int64)."""
    offsets, values = _buffers(array)
    return pack(carry, offsets, values, seq_len=seq_len, eos_id=eos_id, limit=limit)


def _buffers(array: pa.Array | pa.ChunkedArray) -> tuple[_Int, _Int]:
    """Row offsets (from 0) and token values of a list column, from its Arrow buffers."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    if array.null_count:
        raise PackingError(f"the token column holds {array.null_count} null list(s); packing "
                           "needs a list of token ids in every row (fill or filter them)")
    if pa.types.is_fixed_size_list(array.type):
        width = array.type.list_size
        offsets = np.arange(len(array) + 1, dtype=np.int64) * width
        return offsets, array.flatten().to_numpy(zero_copy_only=False)
    offsets = array.offsets.to_numpy(zero_copy_only=False)
    values = array.values.to_numpy(zero_copy_only=False)  # indexed from offsets[0]
    first = int(offsets[0])
    return offsets - first, values[first:int(offsets[-1])]


def finish(carry: PackCarry, *, seq_len: int, last: LastPolicy,
           pad_id: int) -> tuple[_Int, _Int, int]:
    """The end of a pass: the partial sequence dropped or padded (NOTE [ packing ]).

    Returns:
        ``(input_ids, position_ids, n)``: with ``last="pad"`` one padded sequence (or none when
        nothing is held) and ``n`` the padding tokens; with ``"drop"`` no sequence and ``n``
        the tokens not delivered.
    """
    held = len(carry.tokens)
    if last == "drop" or held == 0:
        return _empty(seq_len), _empty(seq_len), held
    pad = seq_len - held
    tokens = np.concatenate([np.asarray(carry.tokens, np.int64), np.full(pad, pad_id, np.int64)])
    positions = np.concatenate([np.asarray(carry.positions, np.int64),
                                np.arange(pad, dtype=np.int64)])
    return tokens.reshape(1, seq_len), positions.reshape(1, seq_len), pad


def _empty(seq_len: int) -> _Int:
    return np.empty((0, seq_len), dtype=np.int64)


def warn_eos(eos_id: int, count: int) -> None:
    """Warn once per process that ``eos_id`` occurs inside documents (NOTE [ packing ])."""
    global _warned_eos
    if _warned_eos:
        return
    _warned_eos = True
    warnings.warn(EosInDocumentWarning(
        f"eos_id={eos_id} occurs {count} time(s) inside documents: the model cannot tell those "
        "from document ends. Check the tokenizer's eos id, or strip it from the documents "
        "(warned once per process; the reader counts every occurrence)"), stacklevel=3)
