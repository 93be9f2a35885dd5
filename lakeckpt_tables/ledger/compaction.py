"""What a compaction reads and writes, in bounded memory, for both ledger backends.

A ledger that lives for months holds millions of rows; a compaction that read them all at
once would need gigabytes. So the rows are read in *slices*, each the rows of one record kind
and run over a range of steps (so a read skips the rest by statistics), in the order
(record, run, step) that makes later reads of one kind or run skip the rest of the compacted
files too, and written to files of at most :data:`FILE_ROWS` rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

import pyarrow as pa

from lakeckpt_tables.ledger import schema as s

__all__ = ["FILE_ROWS", "ORDER", "SLICE_ROWS", "Slice", "fragmented", "sorted_files"]

ORDER: Final = (s.RECORD, s.RUN_ID, s.STEP)
"""The order of a compacted ledger's rows."""

FILE_ROWS = 262_144
"""At most this many rows per file a compaction writes: what it holds in memory at once (a
step with more rows than this alone makes a file of its own)."""

SLICE_ROWS = 131_072
"""About this many rows per read of a compaction."""

Slice = tuple[str, str, int, int]
"""(record kind, run, first step, last step): the rows a compaction reads at once."""


def fragmented(file_rows: list[int | None]) -> bool:
    """Whether a ledger whose live files hold these many rows needs compacting: more than one
    file holds fewer than half of :data:`FILE_ROWS` (a compaction leaves at most one)."""
    return sum(1 for n in file_rows if n is None or n < FILE_ROWS // 2) > 1


def sorted_files(keys: pa.Table, read: Callable[[Slice], pa.Table]) -> Iterator[pa.Table]:
    """The ledger's rows in :data:`ORDER`, in tables of at most :data:`FILE_ROWS` rows.

    Args:
        keys: the :data:`ORDER` columns of every row of the snapshot compacted.
        read: the rows of one slice, from that snapshot.
    """
    pending: list[pa.Table] = []
    held = 0
    for cut in _slices(keys):
        rows = read(cut).sort_by([(c, "ascending") for c in ORDER])
        if pending and held + rows.num_rows > FILE_ROWS:
            yield pa.concat_tables(pending)
            pending, held = [], 0
        pending.append(rows)
        held += rows.num_rows
    if pending:
        yield pa.concat_tables(pending)


def _slices(keys: pa.Table) -> Iterator[Slice]:
    """Slices of about :data:`SLICE_ROWS` rows, in :data:`ORDER`."""
    counts = keys.select(list(ORDER)).group_by(list(ORDER), use_threads=False).aggregate(
        [([], "count_all")]).sort_by([(c, "ascending") for c in ORDER])
    cut: tuple[str, str, int] | None = None  # (record, run, first step) of the slice
    held = last = 0
    for record, run, step, n in zip(*(counts[c].to_pylist() for c in (*ORDER, "count_all")),
                                    strict=True):
        if cut is not None and ((record, run) != cut[:2] or held + n > SLICE_ROWS):
            yield (*cut, last)
            cut = None
        if cut is None:
            cut, held = (record, run, step), 0
        held += n
        last = step
    if cut is not None:
        yield (*cut, last)
