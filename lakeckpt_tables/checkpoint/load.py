"""Every rank's side of a restore: choose, check, claim, then load (NOTE [ what restore skips ]).

Rank 0 chooses; every rank then checks that it sees the checkpoint's files and that its model
and optimizer fit them; only then does rank 0 claim the run. A restore that fails before the
claim has committed nothing: no event, no ownership.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from lakeckpt_tables.checkpoint._world import World, one_process
from lakeckpt_tables.checkpoint.restore_policy import Choice, RestorePolicy
from lakeckpt_tables.checkpoint.state import Parts, apply_state, build_state, check_fits
from lakeckpt_tables.errors import CommitConflictError, LakeckptError, RunFencedError
from lakeckpt_tables.io.checkpoint_storage import CheckpointStorage
from lakeckpt_tables.ledger import CheckpointRecord

__all__ = ["Loader"]

log = logging.getLogger(__name__)

_CLAIM_TRIES = 3


class Loader:
    """Restore on every rank; ``policy`` is rank 0's (None elsewhere)."""

    def __init__(self, storage: CheckpointStorage, world: World, policy: RestorePolicy | None,
                 *, run_id: str, config_hash: str) -> None:
        self.storage = storage
        self.world = world
        self.policy = policy
        self.run_id = run_id
        self.config_hash = config_hash

    def claim(self, parts: Parts, step: int | None, tag: str | None,
              require: bool) -> tuple[CheckpointRecord | None, dict[str, Any]]:
        """The checkpoint to load (None: fresh) and the state dict to load it into, once the
        run is claimed; chosen again if another job committed to the run meanwhile."""
        for attempt in range(_CLAIM_TRIES):
            choice: Choice = self.world.decide(partial(self._choose, step, tag, require))
            record = choice.record
            own = record is not None and self.world.rank < record.world_size
            state = {} if record is None else build_state(
                parts, self.world.rank, reader="" if own else None, run_id=self.run_id)
            if record is not None:
                self._check(record, state)
            try:
                self.world.decide(partial(self._claim, choice))
                return record, state
            except RunFencedError:
                raise
            except CommitConflictError as exc:
                if attempt + 1 == _CLAIM_TRIES:
                    raise
                log.warning("run %s: %s", self.run_id, exc)
        raise AssertionError("unreachable")

    def load(self, record: CheckpointRecord, state: dict[str, Any], parts: Parts) -> None:
        """Load the checkpoint's files into ``state`` and hand them to ``parts``."""
        with one_process():
            from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

            dcp_load(state, storage_reader=self.storage.reader(record.model_location),
                     process_group=self.world.group, no_dist=not self.world.distributed)
        apply_state(parts, state, self.world.rank)

    def _choose(self, step: int | None, tag: str | None, require: bool) -> Choice:
        assert self.policy is not None
        return self.policy.choose(step, tag, require=require)

    def _claim(self, choice: Choice) -> None:
        assert self.policy is not None
        self.policy.claim(choice)

    def _check(self, record: CheckpointRecord, state: dict[str, Any]) -> None:
        """Collective, before the claim: every rank sees the files and its state fits."""
        if record.config_hash != self.config_hash:
            log.warning("run %s: restoring step %d, saved under configuration %s, with "
                        "configuration %s; later checkpoints record the new one",
                        self.run_id, record.step, record.config_hash, self.config_hash)
        self.storage.check_visible(self.world, self.run_id, record.step, record.model_location,
                                   record.manifest)
        problem: LakeckptError | None = None
        try:
            metadata = self.storage.reader(record.model_location).read_metadata()
            check_fits(state, metadata, run_id=self.run_id, step=record.step)
        except LakeckptError as exc:
            problem = exc
        problems = [p for p in self.world.gather(problem) if p is not None]
        if problems:
            raise problems[0]
