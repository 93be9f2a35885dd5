"""Every rank's side of a restore: choose, load, then claim (NOTE [ restore loads, then claims ]).

NOTE [ restore loads, then claims ]
Rank 0 chooses the checkpoint; every rank then checks that it sees the checkpoint's files and
that its model, optimizer, scheduler and ``extra`` fit them, loads them, and hands the reader
state to its dataloader (a LakeDataset or a Mixture checks the state is of its tables, plan and
schedule). A failure on any rank, whatever its cause, is raised on every rank before anything is
committed: only when every rank loaded everything does rank 0 claim the run (one ledger commit:
the ``restore`` event and the run's ownership). A restore that raises has committed nothing. A
read-only restore stops before the claim: it never commits and never takes the run over.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from lakeckpt_tables.checkpoint import readers
from lakeckpt_tables.checkpoint._failures import WRITE_FAILURES, describe_failure
from lakeckpt_tables.checkpoint._world import World, one_process
from lakeckpt_tables.checkpoint.restore_policy import Choice, RestorePolicy
from lakeckpt_tables.checkpoint.state import Parts, apply_state, build_state, check_fits
from lakeckpt_tables.errors import (
    CheckpointRestoreError,
    CommitConflictError,
    LakeckptError,
    RunFencedError,
    StateMismatchError,
)
from lakeckpt_tables.io.checkpoint_storage import CheckpointStorage
from lakeckpt_tables.ledger import CheckpointRecord
from lakeckpt_tables.reader import decode_state

__all__ = ["Loader"]

log = logging.getLogger(__name__)

_CLAIM_TRIES = 3
T = TypeVar("T")


class Loader:
    """Restore on every rank; ``policy`` is rank 0's (None elsewhere)."""

    def __init__(self, storage: CheckpointStorage, world: World, policy: RestorePolicy | None,
                 *, run_id: str, config_hash: str) -> None:
        self.storage = storage
        self.world = world
        self.policy = policy
        self.run_id = run_id
        self.config_hash = config_hash

    def restore(self, parts: Parts, dataloader: Any, step: int | None, tag: str | None, *,
                require: bool, read_only: bool,
                from_run: str | None = None) -> tuple[Choice, dict[str, Any] | None]:
        """Choose, load into ``parts`` and ``dataloader`` on every rank, then claim the run
        (unless ``read_only``); chosen and loaded again if another job committed to the run
        meanwhile. Returns the choice (its record None: fresh) and the decoded reader state."""
        for attempt in range(_CLAIM_TRIES):
            choice: Choice = self.world.decide(partial(
                self._choose, step, tag, require, read_only, from_run, dataloader is not None))
            record = choice.record
            reader = None if record is None else self._load(record, parts, dataloader)
            if read_only:
                return choice, reader
            try:
                self.world.decide(partial(self._claim, choice))
                return choice, reader
            except RunFencedError:
                raise
            except CommitConflictError as exc:
                if attempt + 1 == _CLAIM_TRIES:
                    raise
                log.warning("run %s: %s", self.run_id, exc)
        raise AssertionError("unreachable")

    def _load(self, record: CheckpointRecord, parts: Parts,
              dataloader: Any) -> dict[str, Any] | None:
        """Collective, before the claim: every rank sees the files, its state fits, and
        everything loads; the first failure of any rank is raised on all of them."""
        if record.config_hash != self.config_hash:
            log.warning("run %s: restoring step %d, saved under configuration %s, with "
                        "configuration %s; later checkpoints record the new one",
                        self.run_id, record.step, record.config_hash, self.config_hash)
        self.storage.check_visible(self.world, self.run_id, record.step, record.model_location,
                                   record.manifest)
        own = self.world.rank < record.world_size
        state = self._agreed(record, "checking the state given", lambda: self._fitting(
            record, build_state(parts, self.world.rank, reader="" if own else None,
                                run_id=self.run_id)))
        reader = None
        if record.reader_state:
            reader = decode_state(record.reader_state)
            if dataloader is not None:
                self._agreed(record, "loading the reader state into the dataloader",
                             partial(self._reader, record, dataloader, reader))
        self._agreed(record, "loading its files", partial(self._read, record, state))
        self._agreed(record, "handing the loaded state to the model, optimizer, scheduler "
                     "and extra", partial(apply_state, parts, state, self.world.rank))
        return reader

    def _fitting(self, record: CheckpointRecord, state: dict[str, Any]) -> dict[str, Any]:
        metadata = self.storage.reader(record.model_location).read_metadata()
        check_fits(state, metadata, run_id=self.run_id, step=record.step)
        return state

    def _reader(self, record: CheckpointRecord, dataloader: Any, reader: dict[str, Any]) -> None:
        try:
            readers.restore(dataloader, reader)
        except StateMismatchError as exc:  # the reader's words lack the run: add it
            raise type(exc)(f"run {self.run_id}: checkpoint step {record.step} cannot be "
                            f"loaded into this dataloader: {exc}. Nothing was committed and "
                            "the run is unchanged") from exc

    def _read(self, record: CheckpointRecord, state: dict[str, Any]) -> None:
        with one_process():
            from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

            dcp_load(state, storage_reader=self.storage.reader(record.model_location),
                     process_group=self.world.group, no_dist=not self.world.distributed)

    def _agreed(self, record: CheckpointRecord, doing: str, work: Callable[[], T]) -> T:
        """``work`` on every rank; if it failed on any, the first failure on all of them, a
        library error as it is, any other wrapped in a CheckpointRestoreError naming it."""
        problem: LakeckptError | None = None
        result: Any = None
        try:
            result = work()
        except LakeckptError as exc:
            problem = exc
        except WRITE_FAILURES as exc:  # DCP's CheckpointException is a BaseException
            problem = CheckpointRestoreError(
                f"run {self.run_id}: restoring step {record.step} (checkpoint "
                f"{record.checkpoint_id}) failed on rank {self.world.rank} while {doing}: "
                f"{describe_failure(exc)}. Nothing was committed and the run is unchanged "
                "(the objects given may be partly loaded)")
        problems = [p for p in self.world.gather(problem) if p is not None]
        if problems:
            raise problems[0]
        return result  # type: ignore[no-any-return]

    def _choose(self, step: int | None, tag: str | None, require: bool, read_only: bool,
                from_run: str | None, continued: bool) -> Choice:
        assert self.policy is not None
        return self.policy.choose(step, tag, require=require, read_only=read_only,
                                  from_run=from_run, continued=continued)

    def _claim(self, choice: Choice) -> None:
        assert self.policy is not None
        self.policy.claim(choice)
