"""What torch's DataLoader and torchdata's StatefulDataLoader do with a LakeDataset, in one place.

The loader's state keys, its worker round-robin, what its own ``load_state_dict`` can and cannot
resume (torchdata 0.11), and how a loader that batches the dataset's batches again is caught are
facts of torch's and torchdata's implementations, not of ours: when they change, this module
(and its tests, ``tests/test_reader_resume.py``, ``tests/test_reader_errors.py``) is what
changes. It sits below the dataset: it knows a reader state (``reader/state.py``) and the batch
type (``reader/convert.py``), and a loader's dataset only by what it can do
(:class:`ResumableDataset`).

NOTE [ torchdata's end-of-pass trap ]
A loader state taken after the loader raised ``StopIteration`` carries
``_iterator_finished=True``. ``loader.load_state_dict(that)`` then restores the workers with
their (finished) states, sees a finished iterator and throws it away: the next ``iter()``
starts a fresh pass in new workers that are handed no state at all. A worker cannot tell that
state from one taken right after the last batch (the worker snapshots are identical; only the
main process's flag differs), and no code of ours runs in the main process on that path. So a
worker restored by torchdata whose slice has delivered its whole pass refuses with
:class:`~lakeckpt_tables.errors.ResumePathError` (:func:`refuse_finished_pass`), naming
``dataset.load_state_dict``, which reads the whole loader state (flag included) in the main
process and resumes a finished pass as finished. Without workers torchdata loads the state into
the main process's dataset, and both paths are exact.

NOTE [ batches batched again ]
The dataset makes the batches, so its loader must be built with ``batch_size=None``. A loader
left at its default (``batch_size=1``) or given another batch size collates the dataset's
batches into batches of batches: ``id`` comes out as ``[1, B]`` and a ``Ragged`` gains a
dimension, silently. torch's ``default_collate`` looks a batch's type up in
``default_collate_fn_map`` (the extension point its documentation shows) before anything else,
so the reader's batch type (:class:`~lakeckpt_tables.reader.convert.Batch`) and Arrow batches
are registered there with a collate function that raises, on the loader's first batch, naming
the fix. A loader with ``batch_size=None`` never collates: it costs nothing per batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NoReturn, Protocol, runtime_checkable

import pyarrow as pa
from torch.utils.data._utils.collate import default_collate_fn_map

from lakeckpt_tables.errors import CheckpointError, ResumePathError, StateMismatchError
from lakeckpt_tables.reader.convert import Batch
from lakeckpt_tables.reader.state import STATE_FORMAT, ReaderState, merge_states

__all__ = [
    "DATASET_STATE",
    "ResumableDataset",
    "dataset_of",
    "is_loader_state",
    "next_worker_in_turn",
    "parse_state",
    "reader_state_of",
    "refuse_finished_pass",
    "restore_reader",
    "states_from_loader",
]

SNAPSHOT = "_snapshot"
WORKER_SNAPSHOTS = "_worker_snapshots"
DATASET_STATE = "dataset_state"
ITERATOR_FINISHED = "_iterator_finished"

def is_loader_state(state: Any) -> bool:
    """Whether ``state`` is a ``StatefulDataLoader.state_dict()`` (with or without workers)."""
    return isinstance(state, Mapping) and (SNAPSHOT in state or DATASET_STATE in state)


def states_from_loader(loader_state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The dataset states inside a torchdata ``StatefulDataLoader.state_dict()``.

    Works for ``num_workers=0`` (one state) and for worker processes (one per worker).

    Raises:
        StateMismatchError: the loader state holds no dataset state.
    """
    snapshot = loader_state.get(SNAPSHOT)
    found: list[Any]
    if isinstance(snapshot, Mapping):
        workers = snapshot.get(WORKER_SNAPSHOTS, {})
        if not isinstance(workers, Mapping):
            raise StateMismatchError("the DataLoader state is corrupt: its worker snapshots "
                                     f"are a {type(workers).__name__}, not a dict")
        found = [w.get(DATASET_STATE) if isinstance(w, Mapping) else None
                 for _, w in sorted(workers.items(), key=lambda kv: str(kv[0]))]
    else:
        found = [loader_state.get(DATASET_STATE)]
    states = [s for s in found if s is not None]
    if not states:
        raise StateMismatchError(
            "the DataLoader state holds no LakeDataset state: was it taken from a "
            "StatefulDataLoader over a LakeDataset?"
        )
    return states


def parse_state(state: Any) -> ReaderState:
    """A reader state from what ``load_state_dict`` may be given: a dataset state, merged
    states (as a dict or as :func:`merge_states` returns them), or a loader's state (its
    workers' states merged).

    Raises:
        StateMismatchError: not a reader state, another format version, or corrupt.
    """
    if isinstance(state, ReaderState):  # what merge_states returns
        return state
    if is_loader_state(state) and state.get("format") != STATE_FORMAT:
        return merge_states(states_from_loader(state))
    return ReaderState.from_dict(state)


def next_worker_in_turn(done: Sequence[int], due: Sequence[int]) -> int:
    """Which worker torchdata's loader polls next, given each worker's batches yielded
    (``done``) and batches it has in the pass (``due``).

    NOTE [ worker rotation ]
    A loader polls its workers round-robin from worker 0, skipping exhausted ones: round ``j``
    polls, in worker order, every worker with more than ``j`` batches. So the workers that
    yielded the most form a prefix of the current round and the last of them went last; the
    next is the first worker after it that still has batches. A fresh loader starts at worker
    0, so a state loaded into the dataset hands worker 0 that slice, worker 1 the one after,
    and so on, and the rank's batch order stays that of an uninterrupted run.
    """
    workers = len(done)
    if workers <= 1:
        return 0
    most = max(done)
    last = max(i for i, d in enumerate(done) if d == most) if most else -1
    for step in range(1, workers + 1):
        i = (last + step) % workers
        if done[i] < due[i]:
            return i
    return 0


def refuse_finished_pass(where: str, worker: int, rank: int) -> NoReturn:
    """NOTE [ torchdata's end-of-pass trap ]: a DataLoader worker handed, by
    ``loader.load_state_dict``, a state whose pass it has delivered whole."""
    raise ResumePathError(
        f"{where}: DataLoader worker {worker} of rank {rank} was restored by "
        "StatefulDataLoader.load_state_dict at the end of its pass; torchdata (0.11) cannot "
        "tell a finished pass from one it restarts afresh in new workers, so the pass could be "
        "delivered twice. Resume through the dataset instead: dataset.load_state_dict(saved) "
        "before iterating the loader (CheckpointManager.restore does this)")


@runtime_checkable
class ResumableDataset(Protocol):
    """What the checkpoint manager asks of a loader's dataset: its reader state, and the plans
    that account for it (``lakeckpt_tables.plan.accounting.Planner``)."""

    @property
    def follows(self) -> bool: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...
    def reshape(self, state: Any, shape: Any) -> Any: ...
    def round_plan(self, index: int, shape: Any, layouts: Any, known: Any) -> Any: ...
    def round_at(self, index: int, shape: Any, layouts: Any, known: Any) -> Any: ...


def dataset_of(dataloader: Any) -> ResumableDataset:
    """The dataset (a :class:`~lakeckpt_tables.LakeDataset`) a ``StatefulDataLoader`` reads.

    Raises:
        StateMismatchError: not a loader over a LakeDataset.
        CheckpointError: a loader that re-batches the dataset's batches.
    """
    dataset = getattr(dataloader, "dataset", None)
    if not isinstance(dataset, ResumableDataset):
        over = "no dataset" if dataset is None else f"a {type(dataset).__name__}"
        raise StateMismatchError(
            f"dataloader must be a torchdata StatefulDataLoader over a LakeDataset or a "
            f"Mixture, got a {type(dataloader).__name__} over {over}: build it as "
            "StatefulDataLoader(dataset, batch_size=None)")
    if getattr(dataloader, "batch_size", None) is not None:
        raise CheckpointError("build the StatefulDataLoader with batch_size=None: the "
                              "LakeDataset yields whole batches")
    return dataset


def reader_state_of(dataloader: Any) -> ReaderState:
    """The merged reader state of every worker of ``dataloader`` (what it has yielded)."""
    dataset_of(dataloader)
    return merge_states(states_from_loader(dataloader.state_dict()))


def restore_reader(dataloader: Any, state: ReaderState) -> None:
    """Resume ``dataloader`` from ``state`` through the dataset (NOTE [ torchdata's end-of-pass
    trap ]): exact at any world size and worker count, a finished pass stays finished."""
    dataset_of(dataloader).load_state_dict(state.to_dict())


def _refuse_batches_of_batches(batch: Sequence[Any], *,
                               collate_fn_map: Any = None) -> NoReturn:
    """NOTE [ batches batched again ]: ``default_collate`` was handed dataset batches."""
    first = batch[0]
    rows = first.num_rows if isinstance(first, pa.RecordBatch) else _rows(first)
    raise TypeError(
        f"a DataLoader is collating {len(batch)} LakeDataset batch(es) of {rows} rows into one "
        f"(every tensor would gain a leading dimension of {len(batch)}): the LakeDataset makes "
        "the batches itself. Build the loader with batch_size=None, e.g. "
        "StatefulDataLoader(dataset, batch_size=None, num_workers=N), and set the rows per "
        "batch with LakeDataset(..., batch_size=...)")


def _rows(batch: Mapping[str, Any]) -> int | str:
    for value in batch.values():
        return len(value.offsets) - 1 if hasattr(value, "offsets") else len(value)
    return "?"


default_collate_fn_map.setdefault(Batch, _refuse_batches_of_batches)
default_collate_fn_map.setdefault(pa.RecordBatch, _refuse_batches_of_batches)
