"""Every contact with torchdata's ``StatefulDataLoader`` internals, in one place (torchdata 0.11).

The loader's state keys, its worker round-robin, and what its own ``load_state_dict`` can and
cannot resume are facts of torchdata's implementation, not of ours: when torchdata changes, this
module (and its tests, ``tests/test_reader_resume.py``) is what changes.

NOTE [ torchdata's end-of-pass trap ]
A loader state taken after the loader raised ``StopIteration`` carries
``_iterator_finished=True``. ``loader.load_state_dict(that)`` then restores the workers with
their (finished) states, sees a finished iterator and throws it away: the next ``iter()``
starts a fresh pass in new workers that are handed no state at all. A worker cannot tell that
state from one taken right after the last batch (the worker snapshots are identical; only the
main process's flag differs), and no code of ours runs in the main process on that path. So a
worker restored by torchdata whose slice has delivered its whole pass refuses with
:class:`~lakeckpt_tables.errors.ResumePathError`, naming ``dataset.load_state_dict``, which
reads the whole loader state (flag included) in the main process and resumes a finished pass
as finished. Without workers torchdata loads the state into the main process's dataset, and
both paths are exact.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lakeckpt_tables.errors import StateMismatchError

if TYPE_CHECKING:
    from lakeckpt_tables.reader.dataset import LakeDataset
    from lakeckpt_tables.reader.state import ReaderState

__all__ = [
    "dataset_of",
    "is_loader_state",
    "next_worker_in_turn",
    "reader_state_of",
    "restore_reader",
    "states_from_loader",
]

SNAPSHOT = "_snapshot"
WORKER_SNAPSHOTS = "_worker_snapshots"
DATASET_STATE = "dataset_state"
ITERATOR_FINISHED = "_iterator_finished"

# StatefulDataLoader.__init__ calls torch.set_vital, a no-op torch deprecated with a UserWarning
# that every run of a loader this library is used with printed. The call is torchdata's, so the
# filter names its module: a set_vital call of anyone else still warns. (docs/limits.md)
warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning,
                        module=r"torchdata\.stateful_dataloader\.stateful_dataloader\Z")


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


def dataset_of(dataloader: Any) -> LakeDataset:
    """The :class:`LakeDataset` a ``StatefulDataLoader`` reads.

    Raises:
        StateMismatchError: not a loader over a LakeDataset.
        CheckpointError: a loader that re-batches the dataset's batches.
    """
    from lakeckpt_tables.errors import CheckpointError
    from lakeckpt_tables.reader.dataset import LakeDataset

    dataset = getattr(dataloader, "dataset", None)
    if not isinstance(dataset, LakeDataset):
        raise StateMismatchError(
            f"dataloader must be a StatefulDataLoader over a LakeDataset, got {dataloader!r}")
    if getattr(dataloader, "batch_size", None) is not None:
        raise CheckpointError("build the StatefulDataLoader with batch_size=None: the "
                              "LakeDataset yields whole batches")
    return dataset


def reader_state_of(dataloader: Any) -> ReaderState:
    """The merged reader state of every worker of ``dataloader`` (what it has yielded)."""
    from lakeckpt_tables.reader.state import merge_states

    dataset_of(dataloader)
    return merge_states(states_from_loader(dataloader.state_dict()))


def restore_reader(dataloader: Any, state: ReaderState) -> None:
    """Resume ``dataloader`` from ``state`` through the dataset (NOTE [ torchdata's end-of-pass
    trap ]): exact at any world size and worker count, a finished pass stays finished."""
    dataset_of(dataloader).load_state_dict(state.to_dict())
