"""A real training run over simulated ranks, committed to a ledger as CheckpointManager does.

Two ``LakeDataset`` readers (rank 0 and 1 of a world of 2) are iterated in lockstep; at each
checkpoint their loaders' states are merged, the consumption since the previous checkpoint is
derived exactly as the manager derives it, and one ledger commit holds it all. The ids each
checkpoint's batches actually carried are kept, so audits can be compared with them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import WriterProperties, write_deltalake
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.checkpoint.consumption import consumed_between, segment_events
from lakeckpt_tables.ledger import CheckpointRecord, LedgerEvent
from lakeckpt_tables.reader.loaders import states_from_loader
from lakeckpt_tables.reader.state import ReaderState, encode_state, merge_states

ROWS = 400
"""Rows of the audit test table: ids 0..399, user = id % 50."""


def write_table(path: Path, rows: int = ROWS) -> None:
    """Four appends (files) of ``rows / 4`` rows, 30-row row groups; ``user_id = id % 50``."""
    props = WriterProperties(max_row_group_size=30)
    step = rows // 4
    for start in range(0, rows, step):
        ids = np.arange(start, start + step, dtype=np.int64)
        write_deltalake(str(path), pa.table({"id": ids, "user_id": ids % 50}), mode="append",
                        writer_properties=props)


def id_of(file: str, row_group: int, row: int, _cache: dict[Any, Any] = {}) -> int:  # noqa: B006
    """The id at (file, row group, live row) of a table without deletes."""
    key = (file, row_group)
    if key not in _cache:
        _cache[key] = pq.ParquetFile(file).read_row_group(row_group, columns=["id"])["id"]
    return int(_cache[key][row].as_py())


@dataclass
class Run:
    """What a simulated run trained: ids per committed checkpoint id, in commit order."""

    run_id: str
    ids: dict[str, list[int]] = field(default_factory=dict)
    records: list[CheckpointRecord] = field(default_factory=list)


class SimulatedRun:
    """Ranks of one run simulated in one process, committing through ``ledger``."""

    def __init__(self, table: Path | Any, ledger: Any, run_id: str, *, world: int = 2,
                 batch: int = 7, window: int = 3, epochs: int = 1, seed: int = 5,
                 **options: Any) -> None:
        """``table``: a Delta table's path, or a function making a source."""
        self.table, self.ledger, self.world = table, ledger, world
        self.make_source = table if callable(table) else lambda: DeltaSource(str(table))
        self.kwargs: dict[str, Any] = {"batch_size": batch, "shuffle_window": window,
                                       "seed": seed, "columns": ["id"], **options}
        if not options.get("follow"):
            self.kwargs["epochs"] = epochs
        self.run = Run(run_id)
        self.baseline: ReaderState | None = None
        self.pending: list[int] = []
        self.step = 0
        self._start(None)

    def _start(self, state: ReaderState | None) -> None:
        self.datasets = [LakeDataset(self.make_source(), rank=r, world_size=self.world,
                                     **self.kwargs)
                         for r in range(self.world)]
        if state is not None:
            for d in self.datasets:
                d.load_state_dict(state.to_dict())
        self.loaders = [StatefulDataLoader(d, batch_size=None) for d in self.datasets]
        self.iters = [iter(loader) for loader in self.loaders]

    def train(self, steps: int) -> bool:
        """``steps`` lockstep steps (fewer at the end of the pass); False when it ended."""
        for _ in range(steps):
            try:
                batches = [next(it) for it in self.iters]
            except StopIteration:
                return False
            self.step += 1
            for b in batches:
                self.pending.extend(int(i) for i in b["id"])
        return True

    def checkpoint(self, tags: tuple[str, ...] = ()) -> CheckpointRecord:
        states = [s for loader in self.loaders for s in states_from_loader(loader.state_dict())]
        state = merge_states(states)
        consumed = consumed_between(self.datasets[0], self.baseline, state)
        events = [LedgerEvent(n, d)
                  for n, d in segment_events(self.datasets[0], self.baseline, state)]
        record = CheckpointRecord(
            run_id=self.run.run_id, checkpoint_id=uuid.uuid4().hex, step=self.step,
            parent_id=self.run.records[-1].checkpoint_id if self.run.records else None,
            model_location=f"{self.run.run_id}/step-{self.step}", manifest={},
            reader_state=encode_state(state), source=state.table,
            source_version=state.version, world_size=self.world, tags=tags,
            config_hash="test", wall_time_s=float(self.step))
        committed = self.ledger.commit(record, consumed, events)
        self.run.records.append(committed)
        self.run.ids[committed.checkpoint_id] = self.pending
        self.pending = []
        self.baseline = state
        return committed

    def resize(self, world: int) -> None:
        """Elastic resume from the last checkpoint at another world size (lost: pending)."""
        assert self.baseline is not None
        self.pending = []
        self.world = world
        self._start(self.baseline)

    def restore(self, record: CheckpointRecord) -> None:
        """Resume from ``record`` (an older checkpoint: what came after it is lost)."""
        from lakeckpt_tables.reader.state import decode_state

        self.baseline = ReaderState.from_dict(decode_state(record.reader_state))
        self.run.records.append(record)  # the next checkpoint's parent
        self.pending = []
        self._start(self.baseline)
