"""A trainer callback installed on some ranks only, named at the start of training.

NOTE [ a callback on every rank ]
Every ledger commit is collective (the protocol's own gloo group, made by ``RunLedger``'s
first collective): a rank whose trainer lacks the integration's callback never joins it, and
the ranks with the callback would wait in it until the process group's timeout (30 minutes by
default), then fail with a generic "peer rank died". So when a callback starts, before any
collective of its own, each rank with it sets a key in the job's rendezvous store (the default
process group's, the one ``init_process_group`` made) and waits a bounded time for every
rank's key. No collective is used: a rank without the callback is running the trainer's own
collectives (DDP's all-reduce), which a barrier would mix with. The ranks whose key is absent
at the deadline are named (:class:`~lakeckpt_tables.errors.CallbackMissingError`). The wait is
short because the trainers reach the hook in step: Lightning's ``setup`` hooks follow its
``pre_setup`` barrier, the Hugging Face Trainer's ``on_train_begin`` follows Accelerate's
``prepare`` (DDP broadcasts the parameters).

Keys are numbered per run and process (the n-th start of the run's callback in this process
meets the n-th on the other ranks), and torchrun's agent prefixes its store per restart, so an
earlier fit's keys never stand in for a rank.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from lakeckpt_tables.errors import CallbackMissingError

__all__ = ["DEFAULT_PEER_TIMEOUT", "require_every_rank"]

log = logging.getLogger(__name__)

DEFAULT_PEER_TIMEOUT = 120.0
"""Seconds a callback waits at start for the same callback on every other rank: ranks reach
the hook within seconds of each other (NOTE [ a callback on every rank ]); 120 s leaves a slow
rank room and is 15 times shorter than torch's default collective timeout."""

_starts: dict[str, int] = {}


def require_every_rank(callback: str, run_id: str, timeout: float) -> None:
    """Return once every rank has started ``callback`` for ``run_id`` (not collective: call it
    where the callback starts, before its first collective). A world of one returns at once.

    Args:
        callback: how the user adds the callback, for the message
            (``"LakeLedger(...) to the Trainer's callbacks"``).
        run_id: the run.
        timeout: seconds to wait for the other ranks.

    Raises:
        CallbackMissingError: some ranks did not start it within ``timeout``; names them.
        ValueError: ``timeout`` is not positive (the store would wait without a deadline).
    """
    if not timeout > 0:
        raise ValueError(f"run {run_id}: peer_timeout must be a positive number of seconds, "
                         f"got {timeout!r}")
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    store = _default_store()
    if store is None:
        log.warning("run %s: torch.distributed has no default store here: whether every rank "
                    "has the callback is not checked", run_id)
        return
    rank, size = dist.get_rank(), dist.get_world_size()
    start = _starts[run_id] = _starts.get(run_id, 0) + 1
    keys = [f"lakeckpt/callback/{run_id}/{start}/{r}" for r in range(size)]
    store.set(keys[rank], b"1")
    try:
        store.wait(keys, timedelta(seconds=timeout))
        return
    except RuntimeError:  # torch's DistStoreError (a RuntimeError): the deadline passed
        pass
    missing = [r for r in range(size) if not _present(store, keys[r])]
    if not missing:
        return  # they came at the deadline
    raise CallbackMissingError(
        f"run {run_id}: rank(s) {missing} of {size} did not start the ledger's callback within "
        f"{timeout:g} s while rank {rank} did: their trainer lacks it, so every checkpoint "
        "save would wait for them in the ledger commit's collectives until the process "
        f"group's timeout. Add {callback} on every rank (the same code on all ranks), or, if "
        "those ranks are only slow to start, raise the callback's peer_timeout. Nothing was "
        "committed or claimed")


def _default_store() -> Any:
    """The default process group's store; through torch internals (no public accessor), so
    any change there means None."""
    try:
        return dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None


def _present(store: Any, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except RuntimeError:  # the store itself is gone: the rank is not known to be there
        return False
