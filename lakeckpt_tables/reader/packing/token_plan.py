"""The token plan: packed sequences planned in stream space, so ranks stay in lockstep by
sequences and a position is one integer per slice.

NOTE [ token plan ]
Ranks must yield equal numbers of sequences per step, but documents differ in length: a plan
that splits *rows* among slices gives each slice a different number of tokens, and no slice
can know the others' without reading them. So packed reading is planned in *stream space*
instead: the stream of a round is its row groups, permuted by (seed, epoch), each contributing
its documents' tokens plus one eos per document (NOTE [ packing ] in ``reader/packing/stream.py``).
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
from lakeckpt_tables.reader.packing.stream import StreamWriter, warn_eos
from lakeckpt_tables.reader.readahead import ReadAhead
from lakeckpt_tables.types import Unit

__all__ = ["StreamSizes", "TokenPlan", "packed_batches", "stream_sizes"]

Interval = tuple[int, int]
GROUP_TOKENS = 1 << 15
"""Stream elements written into one pair of arrays at least, the batches handed out as views
of them: a write's fixed cost (~10 us of numpy calls) spread over more tokens, the arrays
small enough to stay in cache and to be reused by the allocator, not mapped afresh (2026-11-25,
the bench's packed loop, main-thread CPU a token, median of 4: 3.9 ns at 2^14, 3.15 at 2^15,
3.3 at 2^16, 8.8 at 2^17 with 20x the page faults)."""
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


@dataclass(frozen=True)
class StreamSizes:
    """What the footers say of a snapshot's units (row groups), in canonical unit order."""

    sizes: list[int]
    """Stream elements (tokens + one eos per row) of each unit."""
    eos_free: list[bool]
    """Whether the unit's token statistics (min, max) rule the eos id out of its documents:
    its writer then skips looking for one (a pass over its tokens, ~0.25 ns a token)."""


def stream_sizes(reader: Any, units: Sequence[Unit], column: str,
                 eos_id: int | None = None) -> StreamSizes:
    """Stream elements (tokens + one eos per row) of each unit: from the Parquet footer where
    it can say, by reading the token column otherwise (NOTE [ token plan ])."""
    sizes, free = [], []
    for unit in units:
        stats = _footer_stats(reader, unit, column)
        tokens = stats[0] if stats is not None else None
        if tokens is None:
            array = reader.read(unit, [column]).column(column)
            tokens = int(sum(_value_count(chunk) for chunk in array.chunks))
        sizes.append(tokens + unit.rows)
        low, high = stats[1:] if stats is not None else (None, None)
        free.append(eos_id is not None and low is not None and high is not None
                    and not low <= eos_id <= high)
    return StreamSizes(sizes, free)


def _value_count(array: pa.Array) -> int:
    if pa.types.is_fixed_size_list(array.type):
        return len(array) * int(array.type.list_size)
    offsets = array.offsets
    return int(offsets[-1].as_py() - offsets[0].as_py()) if len(array) else 0


def _footer_stats(reader: Any, unit: Unit,
                  column: str) -> tuple[int | None, Any, Any] | None:
    """A row group's tokens (None when deleted rows make the count wrong) and its tokens'
    min and max (None when not recorded) from its footer; None when the footer cannot say."""
    from lakeckpt_tables.sources.base import DataFile

    data_file = unit.file if isinstance(unit.file, DataFile) else None
    # TODO(packing-footer-counts): a RowGroupReader method in sources/ would spare these
    # private calls (the same seam null_counts uses)
    handle = reader._handle(unit.path, data_file)
    physical = reader._null_source(handle, data_file, column)
    if not isinstance(physical, str):
        return None
    meta = handle.file.metadata.row_group(unit.row_group)
    leaves = [meta.column(j) for j in range(meta.num_columns)
              if meta.column(j).path_in_schema.startswith(physical + ".")]
    if len(leaves) != 1:
        return None
    stats = leaves[0].statistics
    if stats is None:
        return None
    whole = handle.row_group_rows[unit.row_group] == unit.rows  # else deleted rows' tokens
    tokens = (int(leaves[0].num_values) - int(stats.null_count)
              if whole and stats.has_null_count else None)
    low, high = (stats.min, stats.max) if stats.has_min_max else (None, None)
    return tokens, low, high


def packed_batches(plan: TokenPlan, units: Sequence[Unit], q: int, start: int, *,
                   read: Callable[[Unit], pa.Table], column: str, seq_len: int, eos_id: int,
                   batch_size: int, read_ahead: int = 0, eos_free: Sequence[bool] = ()
                   ) -> Iterator[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], int, int]]:
    """Slice ``q``'s batches after ``start`` sequences: (input_ids, position_ids, position
    after the batch, eos ids found inside documents since the previous batch).

    ``eos_free``: per unit (canonical order), whether its footer rules the eos id out of its
    documents (:class:`StreamSizes`). ``read(unit)`` gives the unit's live rows with the token
    column: ``read_ahead`` units are
    read ahead on threads (NOTE [ read-ahead ] in ``reader/readahead.py``) while this thread
    packs. The units' shares of the slice's stream are written straight into arrays of at
    least :data:`GROUP_TOKENS` elements (``packing.StreamWriter``), each batch a view of them:
    no piece is joined or copied again, and torch takes the views as they are (a tensor of a
    view holds its own bytes only: sharing it with another process or pinning it copies
    those).
    """
    starts = plan.starts
    jobs: list[tuple[int, int, int]] = []  # (unit in stream order, first, end): unit-relative
    for lo, hi in plan.intervals(q, start):
        k = int(np.searchsorted(starts, lo, side="right")) - 1
        while lo < hi:
            if k >= len(plan.order):
                raise PackingError(
                    f"the token plan counted {plan.starts[-1]} stream elements, but the rows "
                    "hold fewer: a data file's footer statistics disagree with its rows. "
                    "Rewrite the file (or report it), and start the run again")
            end = min(hi, int(starts[k + 1]))
            if end > lo:
                jobs.append((k, lo - int(starts[k]), end - int(starts[k])))
            lo, k = end, k + 1

    def work(job: tuple[int, int, int]) -> tuple[pa.Array | pa.ChunkedArray, int, int, bool]:
        k, first, end = job
        u = plan.order[k]
        return read(units[u]).column(column), first, end, u < len(eos_free) and eos_free[u]

    want = batch_size * seq_len
    left = sum(end - first for _, first, end in jobs)  # whole sequences
    ids = positions = _EMPTY  # the arrays being filled: the next batches' memory
    fill = done = inside = 0  # elements written, yielded; eos inside the batch being filled
    position = start
    stream = None
    for array, first, end, free in ReadAhead(work, jobs, depth=read_ahead,
                                             size=lambda r: r[0].nbytes):
        stream = StreamWriter.of(array, eos_id=eos_id, reuse=stream, eos_free=free)
        if end > stream.total:
            raise PackingError(f"stream elements up to {end} were planned, but the rows hold "
                               f"{stream.total}: a data file's footer statistics disagree with "
                               "its rows. Rewrite the file (or report it), and start the run "
                               "again")
        while first < end:
            if fill == len(ids):
                size = min(max(1, GROUP_TOKENS // want) * want, left)
                ids, positions = np.empty(size, np.int64), np.empty(size, np.int64)
                left, fill, done = left - size, 0, 0
            # a write may fill several batches, unless its eos count must be told per batch
            stop = len(ids) if stream.clean else done + want
            n = min(end - first, stop - fill)
            found = stream.write(first, first + n, ids[fill:fill + n], positions[fill:fill + n])
            if found:
                warn_eos(eos_id, found)
            first, fill, inside = first + n, fill + n, inside + found
            while fill - done >= want:
                position += batch_size
                yield (ids[done:done + want].reshape(-1, seq_len),
                       positions[done:done + want].reshape(-1, seq_len), position, inside)
                done, inside = done + want, 0
    if fill > done:  # the slice's last batch: fewer sequences (its intervals hold whole ones)
        yield (ids[done:fill].reshape(-1, seq_len), positions[done:fill].reshape(-1, seq_len),
               position + (fill - done) // seq_len, inside)


_EMPTY = np.empty(0, np.int64)
