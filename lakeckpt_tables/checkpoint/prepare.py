"""Phase 1 of a checkpoint on one rank: write the shard, capture reader state and consumption.

See NOTE [ two-phase commit ] in :mod:`lakeckpt_tables.checkpoint.manager`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from lakeckpt_tables.checkpoint._failures import WRITE_FAILURES, describe_failure
from lakeckpt_tables.checkpoint._world import World, one_process
from lakeckpt_tables.checkpoint.commit import Attempt, Prepared, failed
from lakeckpt_tables.checkpoint.deletions import honor_deletions
from lakeckpt_tables.checkpoint.readers import capture
from lakeckpt_tables.checkpoint.restore_policy import DCP_METADATA
from lakeckpt_tables.checkpoint.state import Parts, build_state
from lakeckpt_tables.hooks import reached as crash_point  # test seam: no hook in production
from lakeckpt_tables.io.checkpoint_storage import CheckpointStorage

__all__ = ["Preparer"]

log = logging.getLogger(__name__)


class _Writer(FsspecWriter):
    """DCP's file writer with a crash point after a rank's data files, before ``.metadata``."""

    def __init__(self, path: str, rank: int, **storage_options: Any) -> None:
        super().__init__(path, **storage_options)
        self._rank = rank

    def write_data(self, plan: Any, planner: Any) -> Any:
        future = super().write_data(plan, planner)
        future.wait()  # the data files of this rank are on disk; .metadata comes later
        crash_point("prepare:mid_write", self._rank)
        return future


class Preparer:
    """This rank's phase 1, sync or in the background (``async_save``)."""

    def __init__(self, storage: CheckpointStorage, world: World, run_id: str, *,
                 async_save: bool) -> None:
        self.storage = storage
        self.world = world
        self.run_id = run_id
        self.async_save = async_save

    def prepare(self, location: str, parts: Parts, dataloader: Any,
                baseline: Mapping[str, Any] | None) -> tuple[Prepared, Future[Any] | None]:
        """Write the shard and capture the reader; a failure is a value, not an exception."""
        rank = self.world.rank
        try:
            crash_point("prepare:before_write", rank)
            reader, consumed, events = self.capture_reader(dataloader, baseline)
            honored = honor_deletions(self.world, dataloader)  # collective
            if honored is not None:  # this state goes on without rows deleted since
                reader, excluded = honored
                events = [*events, *excluded]
            state = build_state(parts, rank, reader=json.dumps(reader), run_id=self.run_id)
            writer = self.storage.writer(location, _Writer, rank)
            if self.async_save:
                response = dcp_async_save(state, storage_writer=writer,
                                          process_group=self.world.group,
                                          no_dist=not self.world.distributed)
                future = (response.upload_completion
                          if isinstance(response, AsyncSaveResponse) else response)
                return Prepared(True, reader=reader, consumed=consumed, events=events), future
            with one_process():
                dcp_save(state, storage_writer=writer, process_group=self.world.group,
                         no_dist=not self.world.distributed)
            manifest = self.checksums(location)
            crash_point("prepare:after_write", rank)
            return Prepared(True, manifest=manifest, reader=reader, consumed=consumed,
                            events=events), None
        except WRITE_FAILURES as exc:  # DCP's CheckpointException is a BaseException
            log.error("rank %d failed to prepare checkpoint %s: %s", rank, location,
                      describe_failure(exc))
            return failed(exc), None

    def capture_reader(self, dataloader: Any, baseline: Mapping[str, Any] | None) -> Any:
        """The reader state, consumption and events of a save (``checkpoint/readers.py``); a
        method, so that ``lakeckpt bench checkpoint`` can time it."""
        return capture(dataloader, baseline)

    def finish(self, attempt: Attempt) -> None:
        """Wait for a background write; its checksums, or the failure, go into the attempt."""
        if attempt.future is not None and attempt.prepared.ok:
            try:
                attempt.future.result()
                attempt.prepared.manifest = self.checksums(attempt.location)
            except WRITE_FAILURES as exc:  # reported to every rank by the commit phase
                attempt.prepared = failed(exc)

    def checksums(self, location: str) -> dict[str, Any]:
        """This rank's files: its DCP data files, and ``.metadata`` on rank 0."""
        prefix = f"__{self.world.rank}_"
        names = [n for n in self.storage.list(location) if n.startswith(prefix)]
        if self.world.rank == 0:
            names.append(DCP_METADATA)
        return self.storage.checksums(location, names)
