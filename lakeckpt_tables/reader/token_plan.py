"""The token plan: packed sequences planned in stream space, so ranks stay in lockstep by
sequences and a position is one integer per slice.

NOTE [ token plan ]
Ranks must yield equal numbers of sequences per step, but documents differ in length: a plan
that splits *rows* among slices gives each slice a different number of tokens, and no slice
can know the others' without reading them. So packed reading is planned in *stream space*
instead: the stream of a round is its row groups, permuted by (seed, epoch), each contributing
its documents' tokens plus one eos per document (NOTE [ packing ] in ``reader/packing.py``).
A row group's stream size is known before reading it: tokens = the token leaf's ``num_values``
minus its ``null_count`` in the Parquet footer (empty and null lists are the only level entries
without a token), plus its rows; a row group whose footer cannot say (no statistics, deleted
rows, a file lacking the column) is counted by reading its token column once.

With ``Q`` slices (ranks x workers) every slice gets ``N = S // (Q * seq_len)`` sequences: a
contiguous range of stream space, so slice boundaries fall between sequences, possibly inside
a document (the next slice's first sequence goes on with that document, positions included).
The round's last ``S - Q * N * seq_len`` stream elements (fewer than ``Q * seq_len``) cannot be
split in lockstep: they are the round's tail, not delivered and reported (the policy for the
last partial sequence: dropped and counted, as the row reader treats its tails).

A slice's position is the number of sequences it delivered; resuming seeks: the stream offset
is located in its row group (whose token column is read to find the row and the offset inside
that document), and packing goes on from there. Nothing token-sized is ever in the state.
Elastic resume turns every slice's undelivered range into stream intervals (multiples of
``seq_len``: they hold whole sequences) and splits them again among the new slices, the tail of
that split reported in turn.

Rows are permuted by row group, not within one: a document is read whole from its row group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from lakeckpt_tables.errors import PackingError
from lakeckpt_tables.plan.pieces import cut_spans
from lakeckpt_tables.reader.packing import PackCarry, pack_array
from lakeckpt_tables.types import Unit

__all__ = ["TokenPlan", "packed_batches", "stream_sizes"]

Interval = tuple[int, int]
CHUNK_TOKENS = 1 << 16
"""Tokens packed per call at most (512 KiB of int64 ids, as much of positions): numpy's fixed
cost per call spread over several batches, the arrays still in cache (at 2^18 tokens packing
measured slower)."""
_TAG = 0x7061636B  # "pack": the token plan's permutations are its own


@dataclass(frozen=True)
class TokenPlan:
    """One round's sequences, split among ``slices`` slices (NOTE [ token plan ]).

    Attributes:
        sizes: stream elements of each unit (row group), in canonical unit order.
        order: the units in stream order.
        slices: ranks x workers.
        seq_len: tokens per sequence.
        layout: the stream intervals this round delivers: the whole stream, or what an
            elastic resume left undelivered.
    """

    sizes: tuple[int, ...]
    order: tuple[int, ...]
    slices: int
    seq_len: int
    layout: tuple[Interval, ...]

    @classmethod
    def of(cls, sizes: Sequence[int], *, slices: int, seq_len: int, seed: int, epoch: int,
           shuffle: bool, layout: Sequence[Interval] | None = None) -> TokenPlan:
        n = len(sizes)
        if shuffle:
            rng = np.random.Generator(np.random.PCG64([seed, epoch, _TAG]))
            order = tuple(int(u) for u in rng.permutation(n))
        else:
            order = tuple(range(n))
        total = int(sum(sizes))
        return cls(tuple(int(s) for s in sizes), order, slices, seq_len,
                   tuple(layout) if layout is not None else ((0, total),))

    @property
    def starts(self) -> np.ndarray[Any, Any]:
        """Stream start of each unit in stream order, and the stream's end."""
        ordered = np.asarray([self.sizes[u] for u in self.order], dtype=np.int64)
        return np.concatenate([[0], np.cumsum(ordered)])

    @property
    def per_slice(self) -> int:
        """Sequences of every slice (equal: lockstep)."""
        return self._length // (self.slices * self.seq_len)

    @property
    def _length(self) -> int:
        return sum(hi - lo for lo, hi in self.layout)

    @property
    def tail(self) -> int:
        """Stream elements of the round not delivered (fewer than slices x seq_len)."""
        return self._length - self.slices * self.per_slice * self.seq_len

    def intervals(self, q: int, first: int = 0) -> list[Interval]:
        """Slice ``q``'s stream intervals after its first ``first`` sequences."""
        length = self.per_slice * self.seq_len
        return cut_spans(self.layout, q * length + first * self.seq_len, (q + 1) * length)

    def remaining(self, positions: Sequence[int]) -> list[Interval]:
        """The stream intervals not delivered when slice ``q`` delivered ``positions[q]``
        sequences (for an elastic re-plan), in stream order."""
        out: list[Interval] = []
        for q, n in enumerate(positions):
            for lo, hi in self.intervals(q, n):
                if out and out[-1][1] == lo:
                    out[-1] = (out[-1][0], hi)
                else:
                    out.append((lo, hi))
        return out


def stream_sizes(reader: Any, units: Sequence[Unit], column: str) -> list[int]:
    """Stream elements (tokens + one eos per row) of each unit: from the Parquet footer where
    it can say, by reading the token column otherwise (NOTE [ token plan ])."""
    sizes = []
    for unit in units:
        tokens = _footer_tokens(reader, unit, column)
        if tokens is None:
            array = reader.read(unit, [column]).column(column)
            tokens = int(sum(_value_count(chunk) for chunk in array.chunks))
        sizes.append(tokens + unit.rows)
    return sizes


def _value_count(array: pa.Array) -> int:
    if pa.types.is_fixed_size_list(array.type):
        return len(array) * int(array.type.list_size)
    offsets = array.offsets
    return int(offsets[-1].as_py() - offsets[0].as_py()) if len(array) else 0


def _footer_tokens(reader: Any, unit: Unit, column: str) -> int | None:
    """Tokens of a row group from its footer, or None when the footer cannot say."""
    from lakeckpt_tables.sources.base import DataFile

    data_file = unit.file if isinstance(unit.file, DataFile) else None
    # TODO(packing-footer-counts): a RowGroupReader method in sources/ would spare these
    # private calls (the same seam null_counts uses)
    handle = reader._handle(unit.path, data_file)
    if handle.row_group_rows[unit.row_group] != unit.rows:
        return None  # deleted rows: their tokens are in the footer's count
    physical = reader._null_source(handle, data_file, column)
    if not isinstance(physical, str):
        return None
    meta = handle.file.metadata.row_group(unit.row_group)
    leaves = [meta.column(j) for j in range(meta.num_columns)
              if meta.column(j).path_in_schema.startswith(physical + ".")]
    if len(leaves) != 1:
        return None
    stats = leaves[0].statistics
    if stats is None or not stats.has_null_count:
        return None
    return int(leaves[0].num_values) - int(stats.null_count)


def packed_batches(plan: TokenPlan, units: Sequence[Unit], q: int, start: int, *,
                   read: Callable[[Unit], pa.Table], column: str, seq_len: int, eos_id: int,
                   batch_size: int) -> Iterator[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any],
                                                      int, int]]:
    """Slice ``q``'s batches after ``start`` sequences: (input_ids, position_ids, position
    after the batch, eos ids found inside documents).

    ``read(unit)`` gives the unit's live rows with the token column.
    """
    starts = plan.starts
    position = start
    ids: list[np.ndarray[Any, Any]] = []
    pos: list[np.ndarray[Any, Any]] = []
    held = 0
    inside = 0
    for lo, hi in plan.intervals(q, start):
        need = (hi - lo) // seq_len
        k = int(np.searchsorted(starts, lo, side="right")) - 1
        offset = lo - int(starts[k])  # stream elements of unit k before lo
        carry = PackCarry()
        while need:
            if k >= len(plan.order):
                raise PackingError(
                    f"the token plan counted {plan.starts[-1]} stream elements, but the rows "
                    "hold fewer: a data file's footer statistics disagree with its rows. "
                    "Rewrite the file (or report it), and start the run again")
            array = read(units[plan.order[k]]).column(column)
            array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
            row, doc = _locate(array, offset) if offset else (0, 0)
            array = array.slice(row)
            carry = PackCarry(doc, carry.tokens, carry.positions)
            while need and len(array):
                # many batches per call: numpy's per-call cost spread over ~CHUNK_TOKENS
                out = pack_array(carry, array, seq_len=seq_len, eos_id=eos_id,
                                 limit=min(need, max(batch_size, CHUNK_TOKENS // seq_len)))
                inside += out.eos_in_documents
                array, carry = array.slice(out.rows), out.carry
                got = len(out.input_ids)
                need -= got
                i = 0
                while i < got:  # views of the call's sequences, batch by batch
                    take = min(batch_size - held, got - i)
                    ids.append(out.input_ids[i:i + take])
                    pos.append(out.position_ids[i:i + take])
                    held, i, position = held + take, i + take, position + take
                    if held == batch_size:
                        yield _joined(ids), _joined(pos), position, inside
                        ids, pos, held, inside = [], [], 0, 0
            k, offset = k + 1, 0
    if held:
        yield _joined(ids), _joined(pos), position, inside


def _joined(parts: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _locate(array: pa.Array, offset: int) -> tuple[int, int]:
    """The row holding stream element ``offset`` of ``array``'s rows, and how many of that
    row's stream elements come before it."""
    if pa.types.is_fixed_size_list(array.type):
        lengths = np.full(len(array), array.type.list_size, dtype=np.int64)
    else:
        lengths = np.diff(array.offsets.to_numpy(zero_copy_only=False)).astype(np.int64)
    ends = np.cumsum(lengths + 1)
    row = int(np.searchsorted(ends, offset, side="right"))
    return row, offset - (int(ends[row - 1]) if row else 0)
