"""``LakeDataset(..., pack_tokens=COLUMN, seq_len=L, eos_id=E)``: packed token sequences.

A :class:`PackedDataset` is the :class:`~lakeckpt_tables.LakeDataset` built when
``pack_tokens`` is given: the same source, pinning, state, resume paths and DataLoader
behaviour, but its rounds are planned in stream space (NOTE [ token plan ] in
``reader/token_plan.py``) and it yields ``{"input_ids": LongTensor[B, L], "position_ids":
LongTensor[B, L]}`` (NOTE [ packing ] in ``reader/packing.py``). ``batch_size`` counts
sequences. A slice's position counts sequences delivered, so the reader state keeps its shape
(``[round, position]`` per slice); the configuration names the packing (``"pack"``), and an
elastic re-plan's layout is one plain piece whose spans are stream intervals.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from lakeckpt_tables.errors import PackingError, StateMismatchError
from lakeckpt_tables.plan import Piece
from lakeckpt_tables.reader._torchdata import next_worker_in_turn
from lakeckpt_tables.reader.dataset import LakeDataset
from lakeckpt_tables.reader.packing import check_packing, check_token_column
from lakeckpt_tables.reader.rounds import Round
from lakeckpt_tables.reader.state import PlanShape, ReaderState
from lakeckpt_tables.reader.token_plan import TokenPlan, packed_batches, stream_sizes

__all__ = ["PackedDataset"]

log = logging.getLogger(__name__)

Batch = dict[str, Any]


class PackedDataset(LakeDataset):
    """Packed sequences of a token column (see the module docstring).

    Args:
        source: as :class:`~lakeckpt_tables.LakeDataset`.
        pack_tokens: the token column (a list of integers per row, one document per row).
        seq_len: tokens per sequence (>= 2).
        eos_id: appended after every document.
        **kwargs: :class:`~lakeckpt_tables.LakeDataset` options; ``batch_size`` counts
            sequences. Follow mode, ``refresh``, ``output="arrow"`` and ``columns`` other
            than the token column are refused.

    Raises:
        PackingError: ``seq_len < 2``, a column that is not a list of integers, or an option
            packing does not support.
    """

    def __init__(self, source: Any, *, pack_tokens: str, seq_len: int, eos_id: int,
                 **kwargs: Any) -> None:
        check_packing(seq_len, eos_id)
        unsupported = [k for k in ("follow", "refresh") if kwargs.get(k)]
        if kwargs.get("output", "torch") != "torch":
            unsupported.append("output")
        columns = kwargs.pop("columns", None)
        if columns is not None and list(columns) != [pack_tokens]:
            unsupported.append("columns")
        if unsupported:
            raise PackingError(f"pack_tokens={pack_tokens!r} reads a pinned snapshot's token "
                               f"column into torch sequences; drop {unsupported} (not "
                               "supported with packing)")
        if not isinstance(pack_tokens, str):
            raise PackingError(f"pack_tokens={pack_tokens!r}: name the token column")
        super().__init__(source, columns=[pack_tokens], **kwargs)
        check_token_column(self.snapshot.describe(), self.snapshot.schema, pack_tokens)
        self.pack_tokens, self.seq_len, self.eos_id = pack_tokens, seq_len, eos_id
        self._sizes: list[int] | None = None
        self.eos_in_documents = 0
        """eos ids found inside the documents this process packed (warned once)."""

    @property
    def config(self) -> dict[str, Any]:
        config = super().config
        config["pack"] = {"column": self.pack_tokens, "seq_len": self.seq_len,
                          "eos_id": self.eos_id}
        return config

    @property
    def planner(self) -> _PackedPlanner:  # type: ignore[override]
        return _PackedPlanner(self)

    def stream_sizes(self) -> list[int]:
        """Stream elements (tokens + eos) of each row group of the pinned snapshot."""
        if self._sizes is None:
            self._sizes = stream_sizes(self._row_reader, self.snapshot.units, self.pack_tokens)
        return self._sizes

    def __iter__(self) -> Iterator[Batch]:
        for ids, positions in self._sequences():
            batch: Batch = {"input_ids": torch.from_numpy(ids),
                            "position_ids": torch.from_numpy(positions)}
            yield self.transform(batch) if self.transform is not None else batch

    def _tables(self) -> Iterator[Any]:
        raise PackingError("a packed LakeDataset yields sequences, not Arrow tables: iterate "
                           "it directly or through a StatefulDataLoader")

    def _sequences(self) -> Iterator[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
        cursor = self._start_cursor()
        self._cursor = cursor
        from torch.utils.data import get_worker_info

        if get_worker_info() is None or self._resume_own:
            self._resume = None  # a later pass in this process starts afresh
        planner = self.planner
        index = cursor.epoch
        g = cursor.slice_index
        while index < self.epochs:
            plan = planner.token_plan(cursor.shape, index, cursor.layouts.get(index))
            if plan.tail and g == 0:
                log.warning("%s epoch %d: %d token(s) (with eos) cannot be split in lockstep "
                            "into sequences of %d over %d slices; they are not delivered",
                            self.snapshot.describe(), index, plan.tail, self.seq_len,
                            plan.slices)
            start = cursor.position if index == cursor.epoch else 0
            if index != cursor.epoch and plan.per_slice == 0:
                cursor.epoch, cursor.position = index, 0
            for ids, positions, position, inside in packed_batches(
                    plan, self.snapshot.units, g, start, read=self._read_row_group,
                    column=self.pack_tokens, seq_len=self.seq_len, eos_id=self.eos_id,
                    batch_size=self.batch_size):
                cursor.epoch, cursor.position = index, position
                self.eos_in_documents += inside
                yield ids, positions
            index += 1

    def round_plan(self, *args: Any, **kwargs: Any) -> Any:
        raise PackingError("consumption records of a packed LakeDataset are not implemented "
                           "yet (issue 21 item 3): save its state with dataset.state_dict()")

    round_at = round_plan


class _PackedPlanner:
    """What a packed reader state means (the questions ``RoundPlanner`` answers for rows)."""

    def __init__(self, dataset: PackedDataset) -> None:
        self.ds = dataset
        self.where = dataset.snapshot.describe()

    def token_plan(self, shape: PlanShape, epoch: int,
                   layout: Sequence[Piece] | None) -> TokenPlan:
        spans = None if layout is None else [s for piece in layout for s in piece.spans]
        return TokenPlan.of(self.ds.stream_sizes(), slices=shape[0] * shape[1],
                            seq_len=self.ds.seq_len, seed=self.ds.seed, epoch=epoch,
                            shuffle=self.ds.shuffle, layout=spans)

    def batches(self, plan: TokenPlan, batch_size: int) -> int:
        return math.ceil(plan.per_slice / batch_size)

    def own_round(self, rounds: Mapping[int, Round], index: int) -> dict[int, Round]:
        return {}

    def check(self, state: ReaderState) -> None:
        """Refuse a state that cannot be a position of its token plans.

        Raises:
            StateMismatchError: naming every problem found.
        """
        if state.plan is None:
            return
        problems = []
        total = sum(self.ds.stream_sizes())
        for index, layout in state.layouts.items():
            spans = [s for piece in layout for s in piece.spans]
            shuffled = any(p.seed is not None for p in layout)
            outside = any(not 0 <= a < b <= total or (b - a) % self.ds.seq_len
                          for a, b in spans)
            overlap = any(b0 < a1 for (_, a1), (b0, _) in itertools.pairwise(spans))
            if shuffled or outside or overlap:
                problems.append(f"round {index}: its layout is not sorted stream intervals of "
                                f"whole sequences within the {total} stream elements")
        for g, s in enumerate(state.slices):
            if s is None:
                continue
            index, position = s
            if index >= self.ds.epochs:
                problems.append(f"slice {g} stands in epoch {index} of a {self.ds.epochs}-epoch "
                                "pass")
                continue
            plan = self.token_plan(state.plan, index, state.layouts.get(index))
            if position > plan.per_slice:
                problems.append(f"slice {g} stands at sequence {position} of epoch {index}, past "
                                f"the {plan.per_slice} it delivers")
        if problems:
            raise StateMismatchError(f"{self.where}: packed reader state cannot be a position "
                                     f"of its plan {state.plan}: " + "; ".join(problems))

    def pass_finished(self, slice_index: int, shape: PlanShape,
                      layouts: Mapping[int, tuple[Piece, ...]], index: int, position: int,
                      rounds: Mapping[int, Round]) -> bool:
        if index >= self.ds.epochs:
            return True
        plan = self.token_plan(shape, index, layouts.get(index))
        return position >= plan.per_slice and index == self.ds.epochs - 1

    def resumed_slice(self, resume: ReaderState, shape: PlanShape, worker: int, *,
                      own: bool) -> int:
        """As ``RoundPlanner.resumed_slice``, counting batches of sequences."""
        workers = shape[1]
        mine = range(self.ds.rank * workers, (self.ds.rank + 1) * workers)
        held = [g for g in mine if resume.slices[g] is not None]
        if own and len(held) == 1:
            return held[0]
        if len(held) != workers:
            raise StateMismatchError(
                f"reader state has no position for rank {self.ds.rank} worker(s) "
                f"{[g - mine[0] for g in mine if g not in held]}; load the merged state of all "
                "workers (merge_states) or the loader's state")
        done, due = [], []
        origin = min(resume.layouts, default=0)
        for g in mine:
            epoch, position = resume.slices[g] or (origin, 0)
            d = n = 0
            for index in range(origin, self.ds.epochs):
                plan = self.token_plan(shape, index, resume.layouts.get(index))
                count = self.batches(plan, shape[2])
                n += count
                if index < epoch:
                    d += count
                elif index == epoch:
                    d += math.ceil(position / shape[2])
            done.append(d)
            due.append(n)
        return mine[(worker + next_worker_in_turn(done, due)) % workers]

    def reshape(self, state: ReaderState, shape: PlanShape) -> ReaderState:
        """``state`` as a reader of ``shape`` starts from it: the stream intervals not
        delivered, split again (NOTE [ token plan ]).

        Raises:
            StateMismatchError: the state does not cover every rank and worker.
        """
        if state.plan == shape:
            return state
        if not state.complete or state.plan is None:
            raise StateMismatchError(
                f"reader state was saved with (world_size, workers, batch_size)={state.plan}, "
                f"this reader runs {shape}; re-planning for another shape needs the merged "
                "state of every rank and worker (CheckpointManager saves it; or merge_states)")
        positions = state.positions()
        first = min(e for e, _ in positions)
        last = min(max(e for e, _ in positions), self.ds.epochs - 1)
        layouts: dict[int, tuple[Piece, ...]] = {}
        for index in range(first, last + 1):
            plan = self.token_plan(state.plan, index, state.layouts.get(index))
            delivered = [plan.per_slice if e > index else (n if e == index else 0)
                         for e, n in positions]
            layouts[index] = (Piece.plain(plan.remaining(delivered)),)
        return ReaderState(state.table, state.version, state.config, shape, layouts,
                           ((first, 0),) * (shape[0] * shape[1]), {}, state.policy)
