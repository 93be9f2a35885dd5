"""Reader state size per checkpoint for a simulated table (a ``bench read`` figure).

DESIGN.md: at most 64 KB for a 10 TB table read by 128 ranks x 8 workers (the reference
design reports 35-45 MB). Measured as the run started and after an elastic resume on 64 ranks,
whose re-planned layout every later checkpoint of the epoch carries.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from lakeckpt_tables.plan import PlanPolicy, replan
from lakeckpt_tables.reader.state import ReaderState, encode_state
from lakeckpt_tables.tools.bench.data import ROW_GROUP_ROWS
from lakeckpt_tables.types import TableIdentity

__all__ = [
    "REFERENCE_STATE_BYTES",
    "STATE_TABLE_BYTES",
    "STATE_TARGET_BYTES",
    "StateSizeResult",
    "measure_state_size",
    "simulated_state",
]

STATE_TARGET_BYTES = 64 * 1024
STATE_TABLE_BYTES = 10 * 10**12
"""The simulated table of the state-size figure: 10 TB (DESIGN.md)."""
REFERENCE_STATE_BYTES = (35_000_000, 45_000_000)  # the reference design's reader state
_BATCH_SIZE = 8192


# -------------------------------------------------------------------------- state size


@dataclass(frozen=True)
class StateSizeResult:
    """Size of one checkpoint's reader state for a simulated table.

    Attributes:
        case: which state: ``"steady"`` (the plan the run started with) or an elastic re-plan.
        ranks: ranks of the state's plan.
        workers: DataLoader workers per rank.
        table_bytes: simulated table size.
        row_bytes: bytes per row assumed.
        rows_per_slice: rows each (rank, worker) slice of the original plan reads per epoch.
        layout_pieces: pieces in the state's re-planned layouts (0 without a re-plan).
        encoded_bytes: ``len(encode_state(state))``, what the ledger stores.
        json_bytes: the state as compact JSON, uncompressed.
    """

    case: str
    ranks: int
    workers: int
    table_bytes: int
    row_bytes: int
    rows_per_slice: int
    layout_pieces: int
    encoded_bytes: int
    json_bytes: int


def simulated_state(
    *,
    ranks: int = 128,
    workers: int = 8,
    table_bytes: int = STATE_TABLE_BYTES,
    row_bytes: int = 100,
    batch_size: int = _BATCH_SIZE,
    columns: Sequence[str] = ("id", "input_ids", "attention_mask", "labels", "source", "lang"),
    seed: int = 0,
) -> tuple[ReaderState, int]:
    """A reader state of ``ranks x workers`` slices at realistic positions, and rows per slice.

    Positions are drawn independently per slice (batch-aligned, somewhere in the epoch), which
    compresses worse than the near-equal positions of a real lockstep run: an upper bound.
    """
    slices = ranks * workers
    per_slice = table_bytes // row_bytes // slices
    rng = np.random.default_rng(seed)
    batches = rng.integers(0, max(per_slice // batch_size - 1, 1), size=slices)
    positions = tuple((0, int(b) * batch_size) for b in batches)
    identity = TableIdentity("delta", "s3://lake/warehouse/pretrain/tokens_10tb",
                             str(uuid.UUID(int=int(rng.integers(0, 2**62)))))
    config = {"seed": 1234, "shuffle": True, "shuffle_window": 4, "drop_last": False,
              "epochs": 1, "columns": list(columns)}
    state = ReaderState(identity, 4821, config, (ranks, workers, batch_size), {}, positions)
    return state, per_slice


def _replanned(state: ReaderState, rows: int, ranks: int) -> ReaderState:
    """``state`` resumed on ``ranks`` ranks: its unread rows re-planned (see ``plan.replan``)."""
    assert state.plan is not None
    old_ranks, workers, batch_size = state.plan
    full, rest = divmod(rows, ROW_GROUP_ROWS)
    unit_rows = np.full(full + (1 if rest else 0), ROW_GROUP_ROWS, dtype=np.int64)
    if rest:
        unit_rows[-1] = rest
    policy = PlanPolicy(batch_size=batch_size, world_size=old_ranks, workers=workers,
                        shuffle=bool(state.config["shuffle"]), seed=int(state.config["seed"]),
                        shuffle_window=int(state.config["shuffle_window"]),
                        drop_last=bool(state.config["drop_last"]))
    first, layouts = replan(unit_rows, policy, dict(state.layouts), state.positions())
    slices = ((first, 0),) * (ranks * workers)
    return replace(state, plan=(ranks, workers, batch_size), layouts=layouts, slices=slices)


def measure_state_size(*, ranks: int = 128, workers: int = 8, table_bytes: int = STATE_TABLE_BYTES,
                       row_bytes: int = 100, elastic_ranks: int | None = None) -> StateSizeResult:
    """Encoded and JSON size of :func:`simulated_state`.

    With ``elastic_ranks``, of that state after an elastic resume on ``elastic_ranks`` ranks
    (row groups of :data:`~lakeckpt_tables.tools.bench.data.ROW_GROUP_ROWS` rows assumed): the
    re-planned layout travels in every later checkpoint of the epoch.
    """
    state, per_slice = simulated_state(ranks=ranks, workers=workers, table_bytes=table_bytes,
                                       row_bytes=row_bytes)
    case = "steady"
    if elastic_ranks is not None:
        state = _replanned(state, table_bytes // row_bytes, elastic_ranks)
        case = f"after elastic re-plan {ranks}x{workers} -> {elastic_ranks}x{workers}"
    encoded = encode_state(state)
    raw = json.dumps(state.to_dict(), separators=(",", ":"), sort_keys=True)
    assert state.plan is not None
    return StateSizeResult(case, state.plan[0], workers, table_bytes, row_bytes, per_slice,
                           sum(len(p) for p in state.layouts.values()),
                           len(encoded.encode()), len(raw.encode()))
