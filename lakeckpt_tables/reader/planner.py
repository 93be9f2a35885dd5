"""What a reader state means: the plans of a reader's rounds, checked and re-planned.

``LakeDataset`` reads; this module answers the questions asked of a state before and after
reading: is it a position of the plan it claims (``check``), where does a reader of another
shape start from it (``reshape``), which slice does a DataLoader worker continue
(``resumed_slice``), and what is round ``k``'s plan for the consumption records
(``round_plan``, ``round_at``: the :class:`~lakeckpt_tables.plan.accounting.Planner` the
checkpoint code asks). Rounds are listed again from the table (``reader/rounds.py``) without
waiting; the plans themselves are pure (``lakeckpt_tables.plan``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from lakeckpt_tables.errors import StateMismatchError
from lakeckpt_tables.plan import EpochPlan, Piece, PlanPolicy, replan_rounds
from lakeckpt_tables.plan.shuffle import BALANCED
from lakeckpt_tables.plan.validate import layout_problem, position_problem
from lakeckpt_tables.reader.loaders import next_worker_in_turn
from lakeckpt_tables.reader.rounds import Round, RoundSequence, RoundUnits, Tails
from lakeckpt_tables.reader.state import PlanShape, ReaderState

__all__ = ["Cursor", "RoundPlanner", "rank_slices", "require_whole"]


@dataclass
class Cursor:
    """Where one process's slice stands: the live part of the reader state (the reading loop
    moves it after every batch)."""

    slice_index: int
    shape: PlanShape
    layouts: dict[int, tuple[Piece, ...]]
    epoch: int  # the round: an epoch, or a follow segment (lakeckpt_tables.reader.rounds)
    position: int
    rounds: dict[int, Round]
    eos_inside: int = 0  # a packing reader's eos ids inside delivered documents (state.py)
    deletes_seen: int | None = None  # deletes="honor": the last commit observed (state.py)
    exclusions_seen: int | None = None  # exclusions=: the list version applied (state.py)


def require_whole(state: ReaderState, shape: PlanShape) -> None:
    """Refuse to re-plan for ``shape`` a state that does not cover every rank and worker."""
    if not state.complete or state.plan is None:
        raise StateMismatchError(
            f"reader state was saved with (world_size, workers, batch_size)={state.plan}, "
            f"this reader runs {shape}; re-planning for another shape needs the merged "
            "state of every rank and worker (CheckpointManager saves it; or merge_states)")


def rank_slices(resume: ReaderState, shape: PlanShape, rank: int, *,
                own: bool) -> tuple[range, int | None]:
    """The slices of ``rank`` in ``shape``, and the one a worker keeps when torchdata handed it
    its own state (``own``; None otherwise). A state that lacks a position of one of the rank's
    workers is refused: only a merged or a loader's state resumes a whole rank.
    """
    workers = shape[1]
    mine = range(rank * workers, (rank + 1) * workers)
    held = [g for g in mine if resume.slices[g] is not None]
    if own and len(held) == 1:
        return mine, held[0]
    if len(held) != workers:
        raise StateMismatchError(
            f"reader state has no position for rank {rank} worker(s) "
            f"{[g - mine[0] for g in mine if g not in held]}; load the merged state of all "
            "workers (merge_states) or the loader's state")
    return mine, None


@dataclass(frozen=True)
class RoundPlanner:
    """The plans of one reader's rounds (a value: rebuilt when the reader re-pins).

    Attributes:
        rounds: the reader's rounds (epochs of a snapshot, or follow segments).
        shuffle, seed, shuffle_window, drop_last: the plan options that define the rows.
        epochs: epochs of a pinned pass; None: endless (``ReaderConfig.cycle``).
        follows: rounds are follow segments.
        refreshes: ``refresh="epoch"``: each epoch pins its own version.
        rank: this process's rank.
        where: the table and version, for messages.
        shuffler: how windows are permuted (NOTE [ keyed permutation ] in plan/shuffle.py).
    """

    rounds: RoundSequence
    shuffle: bool
    seed: int
    shuffle_window: int
    drop_last: bool
    epochs: int | None
    follows: bool
    refreshes: bool
    rank: int
    where: str
    shuffler: str = BALANCED

    @property
    def pinned(self) -> bool:
        """A pass of ``epochs`` epochs of one snapshot (neither followed nor re-pinned)."""
        return not self.follows and not self.refreshes

    def policy(self, shape: PlanShape) -> PlanPolicy:
        """The plan policy of a reader of ``shape`` (world size, workers, batch size)."""
        world, workers, batch = shape
        return PlanPolicy(batch_size=batch, world_size=world, workers=workers,
                          shuffle=self.shuffle, seed=self.seed,
                          shuffle_window=self.shuffle_window, drop_last=self.drop_last,
                          shuffler=self.shuffler)

    def plan(self, policy: PlanPolicy, rnd: Round, layout: Sequence[Piece] | None) -> EpochPlan:
        """Round ``rnd``'s plan under ``policy`` (and an elastic re-plan's ``layout``)."""
        return self.rounds.units(rnd).plan(policy, segment=rnd.segment, epoch=rnd.epoch,
                                           layout=layout)

    def known_round(self, index: int, known: Mapping[int, Round], tails: Tails) -> Round:
        """Round ``index`` of a reader state, listed again without waiting for new commits."""
        rnd = self.rounds.get(index, known, wait=False, tails=tails)
        if rnd is None:
            raise StateMismatchError(f"{self.where}: round {index} of the reader state cannot "
                                     "be listed again from the table")
        return rnd

    def own_round(self, rounds: Mapping[int, Round], index: int) -> dict[int, Round]:
        """The descriptor a state needs for round ``index`` (see ``needs_descriptor``)."""
        rnd = rounds.get(index)
        return {index: rnd} if rnd is not None and self.rounds.needs_descriptor(rnd) else {}

    # ------------------------------------------------------------------- the Planner protocol

    def round_plan(self, index: int, shape: PlanShape,
                   layouts: Mapping[int, tuple[Piece, ...]],
                   known: Mapping[int, Round]) -> tuple[EpochPlan, RoundUnits]:
        """Round ``index``'s plan for ``shape`` and its units (for consumption records)."""
        policy = self.policy(shape)
        rnd = self.known_round(index, known, Tails(policy, layouts))
        return self.plan(policy, rnd, layouts.get(index)), self.rounds.units(rnd)

    def round_at(self, index: int, shape: PlanShape, layouts: Mapping[int, tuple[Piece, ...]],
                 known: Mapping[int, Round]) -> Round | None:
        """Round ``index`` as a reader of ``shape`` with ``layouts`` forms it (follow segments
        carry the tail of the round before: NOTE [ segment tails are carried ]), listed
        without waiting for new commits; None when it is not formed yet or past the end."""
        return self.rounds.get(index, known, wait=False, tails=Tails(self.policy(shape), layouts))

    def reshape(self, state: ReaderState, shape: PlanShape) -> ReaderState:
        """``state`` as a reader of ``shape`` starts from it: its undelivered rows re-planned.

        Raises:
            StateMismatchError: the state does not cover every rank and worker.
        """
        if state.plan == shape:
            return state
        require_whole(state, shape)
        old = self.policy(state.plan)
        tails = Tails(old, state.layouts)
        known = dict(state.rounds)

        def plan_for(index: int, layout: Sequence[Piece] | None) -> EpochPlan:
            rnd = known[index] = self.known_round(index, known, tails)
            return self.plan(old, rnd, layout)

        first, layouts = replan_rounds(plan_for, dict(state.layouts), state.positions(),
                                       carried=self.follows)
        rounds = {r: d for r, d in known.items()
                  if r >= first and self.rounds.needs_descriptor(d)}
        return ReaderState(state.table, state.version, state.config, shape,
                           layouts, ((first, 0),) * (shape[0] * shape[1]), rounds, state.policy,
                           deletes_seen=state.deletes_seen,
                           exclusions_seen=state.exclusions_seen)

    # ------------------------------------------------------------------------ a loaded state

    def check(self, state: ReaderState) -> None:
        """Refuse a state that cannot be a position of the plan it claims
        (``lakeckpt_tables.plan.validate`` says what can and cannot be told).

        Raises:
            StateMismatchError: naming every problem found.
        """
        if state.plan is None:
            return
        policy = self.policy(state.plan)
        tails = Tails(policy, state.layouts)
        known = dict(state.rounds)
        problems = [f"round descriptor {key} names round {rnd.index}"
                    for key, rnd in known.items() if rnd.index != key]
        indices = {s[0] for s in state.slices if s is not None} | set(state.layouts)
        for index in sorted(indices):
            if self.pinned and self.epochs is not None and index >= self.epochs:
                problems.append(f"it stands in epoch {index} of a {self.epochs}-epoch pass")
                continue
            if self.refreshes and index not in known:
                continue  # a re-pinned epoch not begun: pinned by set_epoch later
            rnd = self.known_round(index, known, tails)
            known[index] = rnd
            layout = state.layouts.get(index)
            if layout is not None:
                problem = layout_problem(layout, int(self.rounds.units(rnd).rows.sum()))
                if problem is not None:
                    problems.append(f"round {index}: {problem}")
                    continue
            plan = self.plan(policy, rnd, layout)
            problems.extend(p for g, s in enumerate(state.slices)
                            if s is not None and s[0] == index
                            and (p := position_problem(plan, g, s[1])) is not None)
        if problems:
            raise StateMismatchError(
                f"{self.where}: reader state cannot be a position of its plan "
                f"{state.plan} (world_size, workers, batch_size): " + "; ".join(problems))

    def pass_finished(self, cursor: Cursor) -> bool:
        """Whether a slice standing at ``cursor`` has delivered its whole pass: nothing is left
        in its round, and no epoch or segment follows it."""
        index, policy, layouts = cursor.epoch, self.policy(cursor.shape), cursor.layouts
        rnd = self.rounds.get(index, cursor.rounds, wait=False, tails=Tails(policy, layouts))
        if rnd is None:
            return True
        plan = self.plan(policy, rnd, layouts.get(index))
        if cursor.position < plan.delivered_rows(cursor.slice_index):
            return False  # mid-round
        if self.pinned and (self.epochs is None or index < self.epochs - 1):
            return False  # epochs remain in this pass
        follow = self.rounds.follow  # a follower's pass ends only at until_version or idle
        return follow is None or follow.max_idle is not None or self.rounds.at_end(rnd.to)

    def resumed_slice(self, resume: ReaderState, shape: PlanShape, worker: int, *,
                      own: bool) -> int:
        """The slice DataLoader worker ``worker`` continues when resuming at the same shape.

        A worker handed its own state by torchdata's ``load_state_dict`` (``own``) keeps the
        slice it holds. A state loaded into the dataset carries no round-robin position, so
        worker 0 takes the slice the old loader would have polled next, worker 1 the one after,
        and so on (NOTE [ worker rotation ] in ``reader/loaders.py``).
        """
        mine, held = rank_slices(resume, shape, self.rank, own=own)
        if held is not None:
            return held
        return mine[(worker + self._next_in_turn(resume, shape)) % len(mine)]

    def _next_in_turn(self, resume: ReaderState, shape: PlanShape) -> int:
        """Which of this rank's workers the old loader would have polled next."""
        workers = shape[1]
        if workers == 1:
            return 0
        # Every slice of the rank started together at the origin: the pass start, or the
        # first epoch of the last elastic re-plan. Count batches yielded and due since then.
        origin = min(resume.layouts, default=0)
        mine = [s for s in resume.slices[self.rank * workers:(self.rank + 1) * workers] if s]
        endless = self.pinned and self.epochs is None
        last = self.epochs - 1 if self.pinned and self.epochs is not None else max(
            e for e, _ in mine)
        policy, known = self.policy(shape), dict(resume.rounds)
        tails = Tails(policy, resume.layouts)
        plans = []  # (round index, plan): a follow segment's plan.epoch is always 0
        for index in range(origin, last + 1):
            rnd = self.rounds.get(index, known, wait=False, tails=tails)
            if rnd is not None:
                plans.append((index, self.plan(policy, rnd, resume.layouts.get(index))))
        done, due = [], []
        for g in range(self.rank * workers, (self.rank + 1) * workers):
            epoch, position = resume.slices[g] or (origin, 0)
            d = n = 0
            for index, plan in plans:
                count = plan.batch_count(g)
                n += count
                if index < epoch:
                    d += count
                elif index == epoch:
                    d += int(np.searchsorted(plan.batch_ends(g), position, side="right"))
            done.append(d)
            # a follower or an endless pass never runs dry
            due.append(n + 1 if self.follows or endless else n)
        return next_worker_in_turn(done, due)
