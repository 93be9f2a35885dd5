"""DataLoader workers that hand batches over in coarse chunks (issue 12 item 4).

NOTE [ chunked hand-off ]
Handing one batch from a worker process to the training loop costs about a millisecond under
a DataLoader, whatever the dataset: at ~1k-row batches that is the whole budget. So workers
decode and cut batches as usual but hand them over ``chunk_rows`` rows at a time, as Arrow
tables (pickled by value: no shared-memory segment per tensor), and the main process converts
them batch by batch. A chunk is copied out of its decoded window first: a pickled Arrow slice
carries its whole parent buffer. Nothing about the rows changes:

- Order. Batches are emitted round-robin over the workers, one batch each in turn, skipping a
  worker that has no batch left: the order a ``StatefulDataLoader`` over the same dataset with
  the same ``num_workers`` gives. Chunks of different workers hold different batch counts (a
  chunk ends at a round), so chunks are buffered per worker. The DataLoader yields chunks
  round-robin over its live workers: when it skips one, that worker has ended.
- Position. Every chunk carries, for each of its batches, the (round, position) its worker's
  cursor stood at after it, and the worker's state after its last batch. The state of this
  loader is, per worker, that state with the position of the last batch *delivered to the
  loop*: rows handed over but not yet delivered are not counted. A chunk never spans two
  rounds, so a state's round descriptor is always its batch's.
- Resume. The state is a dataset state (inside ``{"dataset_state": ...}``, the shape of a
  0-worker ``StatefulDataLoader`` state), loaded through ``dataset.load_state_dict``: exact at
  any world size and worker count, and a finished pass stays finished.
  ``CheckpointManager.save(dataloader=...)`` and ``restore(dataloader=...)`` take this loader.
- Every worker sends a first chunk before any batch (empty if its slice is), so the state
  holds every slice as soon as the first batch is delivered.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from lakeckpt_tables.reader._torchdata import DATASET_STATE
from lakeckpt_tables.reader.convert import convert
from lakeckpt_tables.reader.dataset import LakeDataset
from lakeckpt_tables.reader.state import ReaderState, merge_states

__all__ = ["DEFAULT_CHUNK_ROWS", "ChunkedLoader"]

DEFAULT_CHUNK_ROWS = 64 * 1024
"""Rows per hand-off: 64 batches of 1k rows, so the per-hand-off cost is spread thin."""


@dataclass
class _Chunk:
    """What a worker hands over: batches (as one table), where each ends, the state after."""

    worker: int
    slice_index: int
    table: pa.Table | None
    rows: list[int]  # rows of each batch, in order
    marks: list[tuple[int, int]]  # (round, position) after each batch
    state: dict[str, Any]  # the worker's dataset state after the chunk (before it if empty)


class _Chunks(IterableDataset[_Chunk]):
    """Runs in each DataLoader worker: the dataset's batches, grouped into chunks."""

    def __init__(self, dataset: LakeDataset, chunk_rows: int) -> None:
        self.dataset = dataset
        self.chunk_rows = chunk_rows

    def __iter__(self) -> Iterator[_Chunk]:
        dataset = self.dataset
        info = get_worker_info()
        worker = 0 if info is None else info.id
        start = dataset.state_dict()  # the slice and where it starts, before any batch
        g = next(i for i, s in enumerate(ReaderState.from_dict(start).slices) if s is not None)
        yield _Chunk(worker, g, None, [], [], start)
        tables: list[pa.Table] = []
        rows: list[int] = []
        marks: list[tuple[int, int]] = []
        state: dict[str, Any] = start
        held = 0
        for table in dataset._tables():
            cursor = dataset._cursor
            assert cursor is not None  # set by _tables before its first batch
            if marks and marks[-1][0] != cursor.epoch:  # a chunk never spans two rounds
                yield _Chunk(worker, g, _concat(tables), rows, marks, state)
                tables, rows, marks, held = [], [], [], 0
            if not marks:  # the state of a batch of this round (its round descriptor)
                state = dataset.state_dict()
            tables.append(table)
            rows.append(table.num_rows)
            marks.append((cursor.epoch, cursor.position))
            held += table.num_rows
            if held >= self.chunk_rows:
                yield _Chunk(worker, g, _concat(tables), rows, marks, state)
                tables, rows, marks, held = [], [], [], 0
        if marks:
            yield _Chunk(worker, g, _concat(tables), rows, marks, state)


class ChunkedLoader:
    """Batches of ``dataset`` read by DataLoader workers and handed over in chunks.

    Iterate it as a ``StatefulDataLoader(dataset, batch_size=None, num_workers=...)``: the same
    batches in the same order, converted (and ``transform`` applied) in the main process.
    ``state_dict()`` counts the rows delivered to the loop (NOTE [ chunked hand-off ]).

    Args:
        dataset: the reader; its batch size, shuffle and output are kept.
        num_workers: DataLoader worker processes (at least 1).
        chunk_rows: rows a worker hands over at a time (whole batches; a chunk ends at a round).
        prefetch_chunks: chunks each worker prepares ahead (the DataLoader's prefetch factor).
        multiprocessing_context: as for a DataLoader (``"fork"`` by default: workers start in
            ~0.06 s; see DESIGN.md on deltalake and fork).

    Raises:
        ValueError: ``num_workers`` < 1, ``chunk_rows`` < 1, or a ``follow=True`` dataset.
    """

    batch_size = None  # the dataset makes the batches (CheckpointManager checks this)

    def __init__(self, dataset: LakeDataset, *, num_workers: int,
                 chunk_rows: int = DEFAULT_CHUNK_ROWS, prefetch_chunks: int = 2,
                 multiprocessing_context: str | None = "fork") -> None:
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers!r} (without workers "
                             "iterate the dataset or a StatefulDataLoader over it)")
        if not isinstance(chunk_rows, int) or chunk_rows < 1:
            raise ValueError(f"chunk_rows must be a positive int, got {chunk_rows!r}")
        if dataset.follow is not None:
            # a worker waiting for the next commit would hold the end of the segment it read
            raise ValueError("follow=True: a chunk would wait for the next commit to fill up; "
                             "use StatefulDataLoader(dataset, batch_size=None) instead")
        self.dataset = dataset
        self.num_workers = num_workers
        self.chunk_rows = chunk_rows
        self.prefetch_chunks = prefetch_chunks
        self.multiprocessing_context = multiprocessing_context
        self._delivered: dict[int, ReaderState] = {}  # worker -> state at its last delivery

    def __iter__(self) -> Iterator[Any]:
        loader = DataLoader(_Chunks(self.dataset, self.chunk_rows), batch_size=None,
                            num_workers=self.num_workers, prefetch_factor=self.prefetch_chunks,
                            multiprocessing_context=self.multiprocessing_context,
                            collate_fn=_as_is)
        chunks = iter(loader)
        workers = self.num_workers
        pending: list[deque[tuple[pa.Table, tuple[int, int], _Chunk]]] = [
            deque() for _ in range(workers)]
        self._delivered = {}
        for _ in range(workers):  # every worker's first chunk: its start state, no batch
            first: _Chunk = next(chunks)
            self._delivered[first.worker] = ReaderState.from_dict(first.state)
        ended = [False] * workers  # no chunk will come from this worker any more
        source = 0  # the worker whose chunk the DataLoader yields next, in its round-robin
        dataset = self.dataset
        w = 0
        while not all(ended) or any(pending):
            while not pending[w] and not ended[w]:
                chunk: _Chunk | None = next(chunks, None)
                if chunk is None:
                    ended = [True] * workers
                    break
                while source != chunk.worker:  # the DataLoader skipped it: it has ended
                    ended[source] = True
                    source = (source + 1) % workers
                source = _next_live(ended, chunk.worker)
                pending[chunk.worker].extend(_batches_of(chunk))
            if pending[w]:
                table, mark, chunk = pending[w].popleft()
                self._delivered[w] = ReaderState.from_dict(chunk.state).with_slice(
                    chunk.slice_index, mark)
                batch = convert(table, dataset.output, dataset.nulls)
                yield dataset.transform(batch) if dataset.transform is not None else batch
            w = (w + 1) % workers

    def state_dict(self) -> dict[str, Any]:
        """The rows delivered to the loop, per slice: a dataset state in a loader's shape."""
        if len(self._delivered) < self.num_workers:
            return {DATASET_STATE: self.dataset.state_dict()}
        return {DATASET_STATE: merge_states(self._delivered.values()).to_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a state of this loader, a ``StatefulDataLoader`` or the dataset: the
        next iteration continues it (``dataset.load_state_dict``)."""
        self.dataset.load_state_dict(state)
        self._delivered = {}


def _batches_of(chunk: _Chunk) -> Iterator[tuple[pa.Table, tuple[int, int], _Chunk]]:
    offset = 0
    for rows, mark in zip(chunk.rows, chunk.marks, strict=True):
        assert chunk.table is not None
        yield chunk.table.slice(offset, rows), mark, chunk
        offset += rows


def _next_live(ended: list[bool], after: int) -> int:
    """The worker after ``after`` in the DataLoader's round-robin (``after`` itself if alone)."""
    n = len(ended)
    return next((i % n for i in range(after + 1, after + n) if not ended[i % n]), after)


def _as_is(item: Any) -> Any:
    return item


def _concat(tables: list[pa.Table]) -> pa.Table:
    """The batches as one table that owns only their rows: a pickled Arrow slice carries its
    whole parent buffer (a window of half a million rows per batch), so copy them out."""
    table = tables[0] if len(tables) == 1 else pa.concat_tables(tables,
                                                                 promote_options="permissive")
    columns = [pa.concat_arrays(c.chunks) if c.num_chunks else pa.array([], c.type)
               for c in table.columns]
    return pa.Table.from_arrays(columns, schema=table.schema)
