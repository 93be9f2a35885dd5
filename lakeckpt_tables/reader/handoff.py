"""DataLoader workers that hand batches over in coarse chunks of tensors (issue 12 item 4).

NOTE [ chunked hand-off ]
Handing one batch from a worker process to the training loop costs about a millisecond under
a DataLoader, whatever the dataset: at ~1k-row batches that is the whole budget. So workers
decode, cut and *convert* batches as usual and hand them over ``chunk_rows`` rows at a time;
the main process only cuts batches out of a chunk, as views. Nothing about the rows changes:

- Tensors. A worker converts each batch as the dataset would (``convert``), then copies each
  column's batches end to end into one tensor allocated in shared memory: the only copy. Torch
  pickles a shared tensor as a file descriptor, so a chunk crosses the pipe as a few handles,
  not its bytes. A list column keeps its values end to end and each batch's own (rebased)
  offsets end to end, with the shape each batch had (2-D when its lengths were equal,
  ``Ragged`` otherwise): a batch in the main process is two views and its output is the
  dataset's, type for type. Strings and bytes travel as Python lists; ``output="arrow"`` as one
  Arrow table copied out of its decoded window (a pickled Arrow slice carries its whole parent
  buffer), converted batch by batch in the main process.
- Order. Batches are emitted round-robin over the workers, one batch each in turn, skipping a
  worker that has no batch left: the order a ``StatefulDataLoader`` over the same dataset with
  the same ``num_workers`` gives. Chunks of different workers hold different batch counts (a
  chunk ends at a round), so chunks are buffered per worker. The DataLoader yields chunks
  round-robin over its live workers: when it skips one, that worker has ended.
- Position. Every chunk carries, for each of its batches, the (round, position) its worker's
  cursor stood at after it, and the worker's state after its last batch. The state of this
  loader is, per worker, that state with the position of the last batch *delivered to the
  loop*: rows handed over but not yet delivered are not counted. A chunk never spans two
  rounds, so a state's round descriptor is always its batch's. Delivering a batch records
  (chunk, batch index) only; the state is built when ``state_dict()`` asks for it.
- Resume. The state is a dataset state (inside ``{"dataset_state": ...}``, the shape of a
  0-worker ``StatefulDataLoader`` state), loaded through ``dataset.load_state_dict``: exact at
  any world size and worker count, and a finished pass stays finished.
  ``CheckpointManager.save(dataloader=...)`` and ``restore(dataloader=...)`` take this loader.
- Every worker sends a first chunk before any batch (empty if its slice is), so the state
  holds every slice as soon as the first batch is delivered. Its next chunk holds one batch,
  and each one after that twice as many rows, up to ``chunk_rows``: the loop's first batch
  waits for one batch decoded, not for a whole chunk, and the workers' pipeline fills as fast.
- Pinned memory. With ``pin_memory=True`` the DataLoader's pin thread pins a chunk once (its
  few tensors); the batches cut from it are views of pinned memory.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from lakeckpt_tables.reader.arena import Column, pack
from lakeckpt_tables.reader.convert import Batch, convert
from lakeckpt_tables.reader.dataset import LakeDataset
from lakeckpt_tables.reader.loaders import DATASET_STATE
from lakeckpt_tables.reader.state import ReaderState, merge_states

__all__ = ["DEFAULT_CHUNK_ROWS", "ChunkedLoader"]

DEFAULT_CHUNK_ROWS = 64 * 1024
"""Rows per hand-off: 64 batches of 1k rows, so the per-hand-off cost is spread thin."""


# ------------------------------------------------------------------ chunks


@dataclass
class _Chunk:
    """What a worker hands over: batches (packed columns, or one Arrow table for
    ``output="arrow"``), where each ends, the state after."""

    worker: int
    slice_index: int
    columns: dict[str, Column] | pa.Table | None
    rows: list[int]  # rows of each batch, in order
    marks: list[tuple[int, int]]  # (round, position) after each batch
    state: dict[str, Any]  # the worker's dataset state after the chunk (before it if empty)

    def batch(self, j: int, lo: int, hi: int, output: str, nulls: str) -> Any:
        """Batch ``j`` (rows ``lo:hi`` of the chunk) in the dataset's output."""
        columns = self.columns
        if isinstance(columns, pa.Table):
            return convert(columns.slice(lo, hi - lo), output, nulls)
        assert columns is not None  # an empty chunk has no batch
        batch = Batch()  # the dataset's batch type (NOTE [ batches batched again ])
        for name, column in columns.items():
            batch[name] = column.cut(j, lo, hi)
        return batch

    def pin_memory(self) -> _Chunk:
        """The chunk with its tensors pinned (the DataLoader's ``pin_memory=True``)."""
        if not isinstance(self.columns, dict):
            return self
        return replace(self, columns={k: c.pin_memory() for k, c in self.columns.items()})


class _Chunks(IterableDataset[_Chunk]):
    """Runs in each DataLoader worker: the dataset's batches, converted, grouped into chunks."""

    def __init__(self, dataset: LakeDataset, chunk_rows: int) -> None:
        self.dataset = dataset
        self.chunk_rows = chunk_rows

    def __iter__(self) -> Iterator[_Chunk]:
        dataset = self.dataset
        info = get_worker_info()
        worker = 0 if info is None else info.id
        # NOTE [ no threads in a worker ]: the worker processes already keep the cores busy;
        # read-ahead threads in each only add switching (a worker's pass of half the token
        # table: 0.29 s of CPU with them, 0.22 s without). Object-store prefetch (I/O, not
        # decoding) is the dataset's and stays on.
        read_ahead = None if info is None else 0
        start = dataset.state_dict()  # the slice and where it starts, before any batch
        g = next(i for i, s in enumerate(ReaderState.from_dict(start).slices) if s is not None)
        yield _Chunk(worker, g, None, [], [], start)
        arrow = dataset.output == "arrow"
        tables: list[pa.Table] = []
        batches: list[dict[str, Any]] = []
        rows: list[int] = []
        marks: list[tuple[int, int]] = []
        state: dict[str, Any] = start
        held = 0
        limit = 1  # rows: the first chunk is one batch, then the limit doubles to chunk_rows

        def chunk() -> _Chunk:
            columns = _concat(tables) if arrow else pack(batches)
            return _Chunk(worker, g, columns, rows, marks, state)

        for table in dataset._tables(read_ahead=read_ahead):
            cursor = dataset._cursor
            assert cursor is not None  # set by _tables before its first batch
            if marks and marks[-1][0] != cursor.epoch:  # a chunk never spans two rounds
                yield chunk()
                tables, batches, rows, marks, held = [], [], [], [], 0
            if not marks:  # the state of a batch of this round (its round descriptor)
                state = dataset.state_dict()
            if arrow:
                tables.append(table)
            else:
                batches.append(convert(table, dataset.output, dataset.nulls))
            rows.append(table.num_rows)
            marks.append((cursor.epoch, cursor.position))
            held += table.num_rows
            if held >= limit:
                yield chunk()
                tables, batches, rows, marks, held = [], [], [], [], 0
                limit = min(max(limit, table.num_rows) * 2, self.chunk_rows)
        if marks:
            yield chunk()


class ChunkedLoader:
    """Batches of ``dataset`` read and converted by DataLoader workers, handed over in chunks.

    Iterate it as a ``StatefulDataLoader(dataset, batch_size=None, num_workers=...)``: the same
    batches in the same order, cut out of shared-memory chunks in the main process
    (``transform`` applied there). ``state_dict()`` counts the rows delivered to the loop
    (NOTE [ chunked hand-off ]). With ``num_workers=0`` it iterates the dataset in this process
    (read-ahead threads decode ahead), so the worker count stays a setting of one loader.

    Args:
        dataset: the reader; its batch size, shuffle and output are kept.
        num_workers: DataLoader worker processes; 0 reads in this process.
        chunk_rows: rows a worker hands over at a time (whole batches; a chunk ends at a round);
            a worker's first chunks are smaller (one batch, then doubling), so the first batch
            does not wait for a whole chunk.
        prefetch_chunks: chunks each worker prepares ahead (the DataLoader's prefetch factor).
        pin_memory: pin each chunk in page-locked memory (the DataLoader's pin thread), so
            batches move to an accelerator without blocking.
        multiprocessing_context: as for a DataLoader (``"fork"`` by default: workers start in
            ~0.06 s; see DESIGN.md on deltalake and fork).

    Raises:
        ValueError: ``num_workers`` < 0, ``chunk_rows`` < 1, or a ``follow=True`` dataset
            with workers.
    """

    batch_size = None  # the dataset makes the batches (CheckpointManager checks this)

    def __init__(self, dataset: LakeDataset, *, num_workers: int,
                 chunk_rows: int = DEFAULT_CHUNK_ROWS, prefetch_chunks: int = 2,
                 pin_memory: bool = False,
                 multiprocessing_context: str | None = "fork") -> None:
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an int >= 0, got {num_workers!r}")
        if not isinstance(chunk_rows, int) or chunk_rows < 1:
            raise ValueError(f"chunk_rows must be a positive int, got {chunk_rows!r}")
        if dataset.follow is not None and num_workers:
            # a worker waiting for the next commit would hold the end of the segment it read
            raise ValueError("follow=True: a chunk would wait for the next commit to fill up; "
                             "use num_workers=0 or StatefulDataLoader(dataset, batch_size=None)")
        self.dataset = dataset
        self.num_workers = num_workers
        self.chunk_rows = chunk_rows
        self.prefetch_chunks = prefetch_chunks
        self.pin_memory = pin_memory
        self.multiprocessing_context = multiprocessing_context
        # worker -> (chunk, index of its last batch delivered; -1: none, its start state)
        self._delivered: dict[int, tuple[_Chunk, int]] = {}

    def __iter__(self) -> Iterator[Any]:
        if not self.num_workers:
            return iter(self.dataset)
        return self._chunked()

    def _chunked(self) -> Iterator[Any]:
        loader = DataLoader(_Chunks(self.dataset, self.chunk_rows), batch_size=None,
                            num_workers=self.num_workers, prefetch_factor=self.prefetch_chunks,
                            pin_memory=self.pin_memory,
                            multiprocessing_context=self.multiprocessing_context,
                            collate_fn=_as_is)
        chunks = iter(loader)
        try:
            yield from self._deliver(chunks)
        finally:  # left, ended or failed: the workers stop now
            _stop_workers(chunks)

    def _deliver(self, chunks: Iterator[_Chunk]) -> Iterator[Any]:
        """The batches of the workers' chunks, in the order of a StatefulDataLoader's
        round-robin over the workers' batches."""
        workers = self.num_workers
        pending: list[deque[tuple[_Chunk, int, int, int]]] = [deque() for _ in range(workers)]
        self._delivered = {}
        for _ in range(workers):  # every worker's first chunk: its start state, no batch
            first: _Chunk = next(chunks)
            self._delivered[first.worker] = (first, -1)
        ended = [False] * workers  # no chunk will come from this worker any more
        source = 0  # the worker whose chunk the DataLoader yields next, in its round-robin
        dataset = self.dataset
        output, nulls, transform = dataset.output, dataset.nulls, dataset.transform
        delivered = self._delivered
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
                chunk, j, lo, hi = pending[w].popleft()
                delivered[w] = (chunk, j)
                batch = chunk.batch(j, lo, hi, output, nulls)
                yield transform(batch) if transform is not None else batch
            w = (w + 1) % workers

    def state_dict(self) -> dict[str, Any]:
        """The rows delivered to the loop, per slice: a dataset state in a loader's shape."""
        if not self.num_workers or len(self._delivered) < self.num_workers:
            return {DATASET_STATE: self.dataset.state_dict()}
        states = []
        for chunk, j in self._delivered.values():
            state = ReaderState.from_dict(chunk.state)
            states.append(state if j < 0 else state.with_slice(chunk.slice_index,
                                                                chunk.marks[j]))
        return {DATASET_STATE: merge_states(states).to_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a state of this loader, a ``StatefulDataLoader`` or the dataset: the
        next iteration continues it (``dataset.load_state_dict``)."""
        self.dataset.load_state_dict(state)
        self._delivered = {}


def _stop_workers(chunks: Iterator[Any]) -> None:
    """Stop the DataLoader's workers now rather than when its iterator is collected.

    A worker's error is re-raised by a frame that holds it, so the error, its traceback and the
    DataLoader's iterator form a reference cycle. Left to the cyclic garbage collector, which
    clears the weak references of the iterator's queues before its ``__del__`` runs, the stop
    signal is never sent and ``__del__`` waits 5 s per worker before terminating it, at some
    later step of the loop. Stopping twice is harmless: the iterator stops once.
    """
    stop = getattr(chunks, "_shutdown_workers", None)
    if stop is not None:
        stop()


def _batches_of(chunk: _Chunk) -> Iterator[tuple[_Chunk, int, int, int]]:
    """(chunk, batch index, first row, end row) of each batch of ``chunk``."""
    lo = 0
    for j, rows in enumerate(chunk.rows):
        yield chunk, j, lo, lo + rows
        lo += rows


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
