"""``LakeDataset(..., pack_tokens=COLUMN, seq_len=L, eos_id=E)``: packed token sequences.

A packing ``LakeDataset`` has the same source, pinning, state, resume paths and DataLoader
behaviour as any other, but its epochs are planned in stream space (NOTE [ token plan ] in
``token_plan.py``: :class:`TokenPlanner`, what ``ReaderConfig.planner`` returns) and it yields
``{"input_ids": LongTensor[B, L], "position_ids": LongTensor[B, L]}`` (NOTE [ packing ] in
``stream.py``; :func:`sequences`). ``batch_size`` counts sequences. A slice's
position counts sequences delivered, so the reader state keeps its shape (``[round,
position]`` per slice); the configuration names the packing (``"pack"``), and an elastic
re-plan's layout is one plain piece whose spans are stream intervals.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from lakeckpt_tables.errors import PackingError, StateMismatchError
from lakeckpt_tables.plan import Piece
from lakeckpt_tables.reader.convert import Batch
from lakeckpt_tables.reader.loaders import next_worker_in_turn
from lakeckpt_tables.reader.options import Packing, ReaderOptions
from lakeckpt_tables.reader.packing.token_plan import (
    StreamSizes,
    TokenPlan,
    packed_batches,
    stream_sizes,
)
from lakeckpt_tables.reader.planner import Cursor, rank_slices, require_whole
from lakeckpt_tables.reader.rounds import Round, RoundSequence
from lakeckpt_tables.reader.state import PlanShape, ReaderState
from lakeckpt_tables.sources.base import Snapshot

__all__ = ["StreamSizes", "TokenPlanner", "sequences"]

log = logging.getLogger(__name__)


def sequences(planner: TokenPlanner, read: Any, transform: Any,
              cursor: Cursor) -> Iterator[Batch]:
    """The slice's packed batches from ``cursor`` on, epoch after epoch; the cursor stands at
    each one's end (sequences delivered) when it is yielded. ``read`` reads a unit's row group
    (the reader's cache), ``transform`` is the dataset's."""
    packing, units = planner.packing, planner.snapshot.units
    if packing.text is not None:  # NOTE [ text tokenized on the fly ] (tokenize.py)
        read = _tokenizing(read, packing.column, packing.text, planner.where)
    g, index = cursor.slice_index, cursor.epoch
    while planner.epochs is None or index < planner.epochs:
        plan = planner.token_plan(cursor.shape, index, cursor.layouts.get(index))
        start = cursor.position if index == cursor.epoch else 0
        if plan.tail and g == 0 and start == 0:  # once per pass: not again at a resume in it
            _warn_tail(planner.where, index, plan)
        if index != cursor.epoch and plan.per_slice == 0:
            cursor.epoch, cursor.position = index, 0
        for ids, positions, position, inside in packed_batches(
                plan, units, g, start, read=read, column=packing.column,
                seq_len=packing.seq_len, eos_id=packing.eos_id, batch_size=cursor.shape[2],
                read_ahead=planner.read_ahead, eos_free=planner.footers().eos_free):
            cursor.epoch, cursor.position = index, position
            cursor.eos_inside += inside  # counted with the batch that delivers the token
            batch = Batch(input_ids=torch.from_numpy(ids),
                          position_ids=torch.from_numpy(positions))
            yield transform(batch) if transform is not None else batch
        index += 1


def _tokenizing(read: Any, column: str, text: Any, where: str) -> Any:
    """``read`` with the text column's documents as token ids."""
    def tokenized(unit: Any) -> Any:
        table = read(unit)
        at = table.schema.get_field_index(column)
        return table.set_column(at, column, text.encode(table.column(column), where))

    return tokenized


def _warn_tail(where: str, epoch: int, plan: TokenPlan) -> None:
    """The pass's tokens that no sequence delivers (the ledger records them too)."""
    if plan.slices == 1:
        why = f"do not fill a sequence of {plan.seq_len}"
    else:
        why = (f"cannot be split in lockstep into sequences of {plan.seq_len} over "
               f"{plan.slices} slices")
    log.warning("%s epoch %d: its last %d token(s) (with eos) %s; they are not delivered "
                "(CheckpointManager records them in the ledger as an 'undelivered' event)",
                where, epoch, plan.tail, why)


class TokenPlanner:
    """What a packing reader state means: the questions ``RoundPlanner`` answers for rows,
    answered for token plans (NOTE [ token plan ])."""

    refreshes = False
    follows = False

    def __init__(self, packing: Packing, options: ReaderOptions, snapshot: Snapshot,
                 sizes: dict[int, StreamSizes], rounds: RoundSequence) -> None:
        """``sizes``: what the footers say per version, a cache the reader's configuration
        keeps."""
        self.packing, self.snapshot, self.sizes, self.rounds = packing, snapshot, sizes, rounds
        o = options
        self.rank, self.seed, self.shuffle = o.rank, o.seed, o.shuffle
        self.read_ahead = o.read_ahead
        self.epochs = rounds.epochs  # None: endless (ReaderConfig.cycle)
        self.where = snapshot.describe()

    def footers(self) -> StreamSizes:
        """What the footers say of each row group of the pinned snapshot."""
        snapshot = self.snapshot
        sizes = self.sizes.get(snapshot.version)
        if sizes is None:
            packing = self.packing
            if packing.text is not None:  # counted once per snapshot and tokenizer, kept
                from lakeckpt_tables.reader.packing.tokenize import text_stream_sizes

                key = {**snapshot.identity.to_json(), "version": snapshot.version,
                       "rows": self.where}
                sizes = StreamSizes(*text_stream_sizes(
                    snapshot.row_reader(), snapshot.units, packing.column, packing.text,
                    packing.eos_id, cache=str(packing.cache), key=key, where=self.where))
            else:
                sizes = stream_sizes(snapshot.row_reader(), snapshot.units, packing.column,
                                     packing.eos_id)
            self.sizes[snapshot.version] = sizes
        return sizes

    def stream_sizes(self) -> list[int]:
        """Stream elements (tokens + eos) of each row group of the pinned snapshot."""
        return self.footers().sizes

    def token_plan(self, shape: PlanShape, epoch: int,
                   layout: Sequence[Piece] | None) -> TokenPlan:
        spans = None if layout is None else [s for piece in layout for s in piece.spans]
        return TokenPlan.of(self.stream_sizes(), slices=shape[0] * shape[1],
                            seq_len=self.packing.seq_len, seed=self.seed, epoch=epoch,
                            shuffle=self.shuffle, layout=spans)

    def round_plan(self, *args: Any, **kwargs: Any) -> Any:
        raise PackingError("a packing LakeDataset has token plans, not row plans: account for "
                           "it with checkpoint.consumption (NOTE [ packed accounting ])")

    round_at = round_plan

    def _last(self, epoch: int) -> int:
        """The last epoch to look at for slices standing at most in ``epoch``."""
        return epoch if self.epochs is None else min(epoch, self.epochs - 1)

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
        total = sum(self.stream_sizes())
        for index, layout in state.layouts.items():
            spans = [s for piece in layout for s in piece.spans]
            shuffled = any(p.seed is not None for p in layout)
            outside = any(not 0 <= a < b <= total or (b - a) % self.packing.seq_len
                          for a, b in spans)
            overlap = any(b0 < a1 for (_, a1), (b0, _) in itertools.pairwise(spans))
            if shuffled or outside or overlap:
                problems.append(f"round {index}: its layout is not sorted stream intervals of "
                                f"whole sequences within the {total} stream elements")
        for g, s in enumerate(state.slices):
            if s is None:
                continue
            index, position = s
            if self.epochs is not None and index >= self.epochs:
                problems.append(f"slice {g} stands in epoch {index} of a {self.epochs}-epoch "
                                "pass")
                continue
            plan = self.token_plan(state.plan, index, state.layouts.get(index))
            if position > plan.per_slice:
                problems.append(f"slice {g} stands at sequence {position} of epoch {index}, past "
                                f"the {plan.per_slice} it delivers")
        if problems:
            raise StateMismatchError(f"{self.where}: packed reader state cannot be a position "
                                     f"of its plan {state.plan}: " + "; ".join(problems))

    def pass_finished(self, cursor: Cursor) -> bool:
        """Whether a slice standing at ``cursor`` has delivered its whole pass."""
        if self.epochs is None:
            return False
        if cursor.epoch >= self.epochs:
            return True
        plan = self.token_plan(cursor.shape, cursor.epoch, cursor.layouts.get(cursor.epoch))
        return cursor.position >= plan.per_slice and cursor.epoch == self.epochs - 1

    def resumed_slice(self, resume: ReaderState, shape: PlanShape, worker: int, *,
                      own: bool) -> int:
        """As ``RoundPlanner.resumed_slice``, counting batches of sequences."""
        mine, held = rank_slices(resume, shape, self.rank, own=own)
        if held is not None:
            return held
        done, due = [], []
        origin = min(resume.layouts, default=0)
        last = self.epochs - 1 if self.epochs is not None else max(
            s[0] for g in mine if (s := resume.slices[g]) is not None)
        for g in mine:
            epoch, position = resume.slices[g] or (origin, 0)
            d = n = 0
            for index in range(origin, last + 1):
                plan = self.token_plan(shape, index, resume.layouts.get(index))
                count = self.batches(plan, shape[2])
                n += count
                if index < epoch:
                    d += count
                elif index == epoch:
                    d += math.ceil(position / shape[2])
            done.append(d)
            due.append(n if self.epochs is not None else n + 1)  # endless: never runs dry
        return mine[(worker + next_worker_in_turn(done, due)) % len(mine)]

    def reshape(self, state: ReaderState, shape: PlanShape) -> ReaderState:
        """``state`` as a reader of ``shape`` starts from it: the stream intervals not
        delivered, split again (NOTE [ token plan ]).

        Raises:
            StateMismatchError: the state does not cover every rank and worker.
        """
        if state.plan == shape:
            return state
        require_whole(state, shape)
        positions = state.positions()
        first = min(e for e, _ in positions)
        last = self._last(max(e for e, _ in positions))
        layouts: dict[int, tuple[Piece, ...]] = {}
        for index in range(first, last + 1):
            plan = self.token_plan(state.plan, index, state.layouts.get(index))
            delivered = [plan.per_slice if e > index else (n if e == index else 0)
                         for e, n in positions]
            layouts[index] = (Piece.plain(plan.remaining(delivered)),)
        slices = shape[0] * shape[1]  # slice 0 carries on the old slices' eos count
        return ReaderState(state.table, state.version, state.config, shape, layouts,
                           ((first, 0),) * slices, {}, state.policy,
                           (state.eos_total,) + (0,) * (slices - 1))
