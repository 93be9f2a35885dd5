"""``Mixture``: several datasets mixed by weight, the schedule a pure function of (seed, draw).

NOTE [ mixture schedule ] (``plan/schedule.py``): draw ``i``'s source is a pure function of
(seed, ``i``), computed alone by every rank and worker.

DataLoader workers: worker ``w`` of ``W`` takes draws ``w, w + W, w + 2W, ...``. torchdata's
loader polls workers round-robin, so the loader yields draws in order and the global schedule
holds; and each worker's own draws (the sequence with step ``W * A``) are low-discrepancy too,
so every worker reads its slice of every source at the weights' pace and the workers' slices
of a source run out together.

Exhaustion: ``on_exhausted="stop"`` ends the mixture (in that worker) at the first draw whose
source has no batch left; the other sources' rows not read are not delivered in this pass (a
resume from a finished mixture stays finished). ``"cycle"`` starts that source's next pass.

NOTE [ cycling sources ]
A :class:`~lakeckpt_tables.LakeDataset`'s next pass is its next epochs: the mixture reads
:func:`~lakeckpt_tables.reader.dataset.cycling` copies, which never end (``epochs=k``: epochs
``0..k-1`` are the first pass, ``k..2k-1`` the second...), each epoch its own permutation. The
pass is in the source's own state (its slices' epochs): a resume seeks, an elastic change
re-plans, the ledger names the epoch that read each row. A slice that would get no batch in an
epoch is refused at the start (it would be read for ever). Any other source starts its next
pass with ``iter(source)`` again, and the position counts those restarts (``passes``).

NOTE [ sources that move ]
A source whose table must move to a newer version does so at its pass boundary: build it with
``refresh="epoch"`` (one epoch per pass) in a cycling Mixture. Pass ``p`` of it is its epoch
``p``, pinned by the mixture (``set_epoch(p)``) when the pass starts: the first pass when the
mixture starts iterating (after a resume, the epoch the source's state stands in, at its
version: ``resume_epoch``), each next one when the previous is exhausted, at the version newest
then (rank 0 resolves it for every rank: NOTE [ re-pinned epochs ] in ``reader/rounds.py``;
ranks reach a source's pass boundary at the same draw, since each of its epochs gives every
rank as many batches). Every pass's rows are read once at its pinned version, which the
source's state names per epoch: a resume re-pins the epochs the state stands in at their own
versions (a state saved at the boundary, the pass finished, moves on the resumed run's next draw
of it, as it would have). DataLoader workers cannot re-pin (each would look at its own time, and
a pin is a collective): such a mixture is refused in workers. Each move is recorded
(``source_version`` in ``checkpoint/recipe.py``).

NOTE [ mixture resume ]
A worker's draws and its slices of the sources stay paired: the worker that takes old worker
``o``'s position resumes exactly ``o``'s slice of every source. Loaded into the mixture (the
dataset path), the worker holding the smallest next draw goes first (new worker 0), as the old
loader would have polled it next, so the loader yields the draws in the uninterrupted order.
Loaded by torchdata's loader, each worker gets its own state back. A source whose slice has
delivered its whole pass is exhausted at the mixture's next draw of it, as without a resume
(the mixture's own end is what NOTE [ torchdata's end-of-pass trap ] is about). At another
world size the sources' merged states are re-planned by the sources (elastic) and every rank
goes on from the same draw. At another number of DataLoader workers per rank, worker ``w`` of
``W`` goes on from draw ``d + w`` (``d``: the first draw no old worker delivered), taking every
``W``-th, and every source re-plans its merged state for the new slices (sources must be
LakeDatasets: another dataset cannot re-plan its rows). Rows stay exactly once per pass, and
the schedule goes on from ``d``, as after an elastic change.

Weights may follow a schedule (NOTE [ weight schedules ] in ``mixture/weights.py``) and may
change at a resume (NOTE [ recipe changes ] in ``checkpoint/recipe.py``): a worker's draws not
delivered yet take the new weights, the sources' cursors do not move.

State (JSON-clean, ``format`` = :data:`MIXTURE_FORMAT`): the schedule's configuration, per
worker its next draw, restarts (``passes``) and end, each source's table and own state: every
row of a source is delivered once per pass, by that source's own accounting.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from lakeckpt_tables.errors import MixtureError, MixtureStateError, StateMismatchError
from lakeckpt_tables.mixture.state import (
    KEY_CONFIG,
    KEY_FORMAT,
    KEY_POSITIONS,
    KEY_SOURCES,
    KEY_TABLES,
    KEY_WORKERS,
    KEYS,
    MIXTURE_FORMAT,
    Position,
    Resume,
    is_reader_state,
    merge_positions,
    merged_source_state,
    same_json,
)
from lakeckpt_tables.mixture.weights import WeightSchedule, as_schedule, weights_config
from lakeckpt_tables.plan.schedule import (
    scheduled,
    scheduled_per_draw,
    thresholds,
    thresholds_per_draw,
)
from lakeckpt_tables.reader.dataset import LakeDataset, cycling
from lakeckpt_tables.reader.loaders import is_loader_state, states_from_loader

__all__ = ["SOURCE_KEY", "Mixture"]

SOURCE_KEY = "source"
"""The key naming the source of each batch."""

OnExhausted = Literal["stop", "cycle"]
_POLICIES, _BLOCK = ("stop", "cycle"), 4096  # _BLOCK: draws computed at once



class Mixture(IterableDataset[dict[str, Any]]):
    """Batches of several datasets, mixed by weight (NOTE [ mixture schedule ]).

    Each batch is a source's batch (a dict) with its source's name under ``"source"``.

    Args:
        sources: name -> dataset (a :class:`~lakeckpt_tables.LakeDataset`, or any
            ``IterableDataset`` with ``state_dict()``/``load_state_dict()``).
        weights: name -> positive weight (normalized; the names must be those of
            ``sources``), or a :class:`~lakeckpt_tables.mixture.WeightSchedule` (or its JSON)
            of weights that change with the draw or step (NOTE [ weight schedules ]).
        seed: the schedule's seed.
        on_exhausted: ``"stop"`` ends the mixture when a source runs out; ``"cycle"`` starts
            that source's next pass (a LakeDataset's next epochs: NOTE [ cycling sources ];
            a ``refresh="epoch"`` one's next epoch at its table's newest version, in the
            main process: NOTE [ sources that move ]).
        retire: sources of ``sources`` that this run no longer draws from (NOTE [ sources
            that change ]): not named by ``weights``; the rows they had not delivered at the
            resumed state are recorded by the next checkpoint. A source of ``sources`` that
            the resumed state lacks is added: it starts its first pass.

    Raises:
        MixtureError: weights not positive, or not naming exactly the sources; an unknown
            ``on_exhausted``; ``"cycle"`` over a follower; iterating a cycling mixture of a
            ``refresh="epoch"`` source in DataLoader workers.
    """

    def __init__(self, sources: Mapping[str, Any], *,
                 weights: Mapping[str, float] | WeightSchedule | Mapping[str, Any],
                 seed: int = 0, on_exhausted: OnExhausted = "stop",
                 retire: Sequence[str] = ()) -> None:
        super().__init__()
        unknown = sorted(set(retire) - set(sources))
        if unknown:
            raise MixtureError(f"retire={unknown} names no source of {sorted(sources)}: give "
                               "the retired source's dataset in sources too (its undelivered "
                               "rows are counted from it)")
        self.retired = {n: sources[n] for n in sorted(retire)}
        sources = {n: s for n, s in sources.items() if n not in self.retired}
        if not sources:
            raise MixtureError("a Mixture needs at least one source")
        self.schedule = as_schedule(weights, list(sources))
        if on_exhausted not in _POLICIES:
            raise MixtureError(f"on_exhausted={on_exhausted!r}: pass 'stop' (end the mixture "
                               "when a source runs out) or 'cycle' (start its next pass)")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise MixtureError(f"seed={seed!r}: pass an int")
        self.names = sorted(sources)
        self.sources = {n: _cycling(n, sources[n]) if on_exhausted == "cycle" else sources[n]
                        for n in self.names}
        self.seed, self.on_exhausted = seed, on_exhausted
        # the refresh="epoch" sources it re-pins at their pass boundaries (NOTE [ sources
        # that move ])
        self.repinning = [n for n in self.names if on_exhausted == "cycle"
                          and isinstance(sources[n], LakeDataset) and sources[n].refresh]
        self._repinned: dict[str, int] = {}  # repinning source -> the epoch it reads
        constant = self.schedule.constant
        self._thresholds = None if constant is None else thresholds(
            [constant[n] for n in self.names])
        self._resume: Resume | None = None
        self._live: tuple[int, int, Position] | None = None  # workers, worker, position
        self.retiring: dict[str, Any] = {}  # retired source -> its state at the resume
        self.added: list[str] = []  # sources the resumed state lacked

    @property
    def config(self) -> dict[str, Any]:
        """What defines the schedule: a state loads into a mixture with the same seed and
        policy; its weights may change at a resume (NOTE [ recipe changes ])."""
        return {"seed": self.seed, "on_exhausted": self.on_exhausted,
                "weights": weights_config(self.schedule)}

    def source_of(self, draws: np.ndarray[Any, Any]) -> list[str]:
        """The source names of ``draws`` (NOTE [ mixture schedule ])."""
        return [self.names[i] for i in self._schedule(np.asarray(draws))]

    def _schedule(self, draws: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        if self._thresholds is not None:
            return scheduled(self.seed, self._thresholds, draws)
        bounds = thresholds_per_draw(self.schedule.weights(draws))
        return scheduled_per_draw(self.seed, bounds, draws)

    # -------------------------------------------------------------------------- reading

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        position = self._start(workers, worker)
        self._live = (workers, worker, position)
        self._refuse_workers()
        for name in self.repinning:  # NOTE [ sources that move ]: the pass its state is in
            self._repinned[name] = self.sources[name].resume_epoch
            self.sources[name].set_epoch(self._repinned[name])
        if self.on_exhausted == "cycle":
            for name, source in self.sources.items():
                _check_epoch_delivers(name, source, workers, worker)
        iterators: dict[str, Iterator[Any]] = {}
        first, block = 0, np.empty(0, dtype=np.int64)
        while not position.ended:
            j = (position.draw - first) // workers  # this worker takes every workers-th draw
            if not 0 <= j < len(block):
                first, j = position.draw, 0
                block = self._schedule(first + workers * np.arange(_BLOCK, dtype=np.uint64))
            name = self.names[int(block[j])]
            batch = self._next(name, iterators, position)
            if batch is None:
                position.ended = True
                return
            position.draw += workers
            yield _tagged(batch, name)

    def _refuse_workers(self) -> None:
        """NOTE [ sources that move ]: only the main process re-pins a source's passes."""
        if self.repinning and get_worker_info() is not None:
            raise MixtureError(
                f"source {self.repinning[0]!r} is a refresh='epoch' reader: a cycling Mixture "
                "re-pins it at its pass boundaries in the main process, which DataLoader "
                "workers cannot do; use num_workers=0, or build the source without refresh")

    def _next(self, name: str, iterators: dict[str, Iterator[Any]],
              position: Position) -> Any | None:
        """The next batch of source ``name``; None when the mixture ends."""
        it = iterators.get(name)
        if it is None:
            it = iterators[name] = iter(self.sources[name])
        try:
            return next(it)
        except StopIteration:
            pass
        if self.on_exhausted == "stop":
            return None
        position.passes[name] = position.passes.get(name, 0) + 1
        if name in self.repinning:  # its next pass (epoch) reads the newest version
            self._repinned[name] += 1
            self.sources[name].set_epoch(self._repinned[name])
        it = iterators[name] = iter(self.sources[name])
        try:
            return next(it)
        except StopIteration:
            # a pass with nothing in it: cycling would spin for ever
            raise MixtureError(f"source {name!r} delivers no batch in a whole pass (in this "
                               "DataLoader worker): it has too few rows for its ranks x "
                               "workers, or its reader ends at once; use on_exhausted='stop' "
                               "or give it rows") from None

    def _start(self, workers: int, worker: int) -> Position:
        """This worker's position, its sources resumed to match (NOTE [ mixture resume ])."""
        resume, self._resume = self._resume, None  # a later pass starts afresh
        if resume is None or resume.workers is None:  # nothing loaded, or nothing drawn yet
            return Position(worker)
        held = [i for i, p in enumerate(resume.positions) if p is not None]
        if resume.workers != workers:
            return self._rescheduled(resume, workers, worker, held)
        if len(held) == 1 and get_worker_info() is not None:
            old = held[0]  # handed its own state by torchdata's loader
        elif len(held) == workers:
            live = [i for i in held if not resume.positions[i].ended] or held  # type: ignore[union-attr]
            first = min(live, key=lambda i: resume.positions[i].draw)  # type: ignore[union-attr]
            old = (first + worker) % workers
        else:
            raise MixtureStateError(
                f"the mixture state holds positions of DataLoader workers {held} of "
                f"{workers}; load the whole loader state (all workers)")
        for name, source in self.sources.items():
            if name in resume.sources:  # (an added source starts its first pass)
                _resume_source(name, source, resume.sources[name], workers, old)
        position = resume.positions[old]
        assert position is not None
        return Position(position.draw, dict(position.passes), position.ended)


    def _rescheduled(self, resume: Resume, workers: int, worker: int,
                     held: list[int]) -> Position:
        """This worker's position at another worker count (NOTE [ mixture resume ]): the
        draws go on from the first no old worker delivered, and every source re-plans its
        merged state for the new slices."""
        if len(held) != resume.workers:
            raise MixtureStateError(
                f"the mixture state holds positions of DataLoader workers {held} of "
                f"{resume.workers}; load the whole loader state (all workers) to resume with "
                f"{workers}")
        fixed = [n for n, s in self.sources.items() if not isinstance(s, LakeDataset)]
        if fixed:
            raise MixtureStateError(
                f"the mixture state was saved by {resume.workers} DataLoader worker(s) per "
                f"rank and is resumed with {workers}, but source(s) {fixed} are not "
                "LakeDatasets and cannot re-plan their rows for other workers; resume with "
                f"{resume.workers} worker(s)")
        for name, source in self.sources.items():  # another shape: the merged state re-plans
            if name in resume.sources:
                _resume_source(name, source, resume.sources[name], workers, worker)
        first = min(p.draw for p in resume.positions if p is not None)
        return Position(first + worker)

    # ----------------------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """The mixture's position (torchdata ``Stateful``), JSON-clean: per worker its next
        draw, passes and end, and each source's own state. In a DataLoader worker it holds
        that worker's position only (the loader keeps one per worker)."""
        self._refuse_workers()
        if self._live is not None:
            workers, worker, position = self._live
            positions: list[Any] = [None] * workers
            positions[worker] = position.to_json()
        elif self._resume is not None and self._resume.workers is not None:
            workers = self._resume.workers
            positions = [None if p is None else p.to_json() for p in self._resume.positions]
        else:
            workers, positions = None, []
        return {KEY_FORMAT: MIXTURE_FORMAT, KEY_CONFIG: self.config, KEY_WORKERS: workers,
                KEY_POSITIONS: positions,
                KEY_TABLES: {n: _identity(s) for n, s in self.sources.items()},
                KEY_SOURCES: {n: s.state_dict() for n, s in self.sources.items()}}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume from a mixture state, or a ``StatefulDataLoader`` state over a Mixture.

        Raises:
            MixtureStateError: the state names a source this mixture lacks, lacks one it has,
                or a source's table identity changed.
            StateMismatchError: another schedule (seed, weights, policy), another format, or
                a damaged state; a source's own state refused by that source.
        """
        states: list[Mapping[str, Any]]
        if is_loader_state(state_dict) and state_dict.get(KEY_FORMAT) != MIXTURE_FORMAT:
            states = list(states_from_loader(state_dict))
        else:
            states = [state_dict]
        for state in states:
            _check_state(self, state)
        saved = set(states[0][KEY_SOURCES])
        workers, positions = merge_positions(sorted(saved | set(self.names)), states)
        for p in positions:  # a retired source's restarts are its own no more
            if p is not None:
                p.passes = {n: k for n, k in p.passes.items() if n in self.sources}
        sources = {n: [s[KEY_SOURCES][n] for s in states] for n in self.names if n in saved}
        self.added = [n for n in self.names if n not in saved]
        self.retiring = {n: merged_source_state(n, [s[KEY_SOURCES][n] for s in states])
                         for n in self.retired if n in saved}
        if get_worker_info() is None:
            # checked (and a version adopted) here; each worker resumes its own part as it
            # starts (NOTE [ mixture resume ])
            for name, source in self.sources.items():
                if name in sources:
                    source.load_state_dict(merged_source_state(name, sources[name]))
            for name, state in self.retiring.items():  # checked: its rows are counted
                self.retired[name].load_state_dict(state)
        self._resume = Resume(workers, positions, sources)
        self._live = None

    def source_states(self, state_dict: Mapping[str, Any] | list[Mapping[str, Any]]
                      ) -> dict[str, Any]:
        """Each source's whole state in a mixture state, a loader state over the mixture, or a
        list of either (every rank's): its workers' and ranks' states merged. This is what
        per-source accounting reads (the consumption of source ``key`` is that of its reader
        state, the records named by ``key``).

        Raises:
            MixtureStateError, StateMismatchError: as :meth:`load_state_dict`.
        """
        given = state_dict if isinstance(state_dict, list) else [state_dict]
        states: list[Mapping[str, Any]] = []
        for one in given:
            if is_loader_state(one) and one.get(KEY_FORMAT) != MIXTURE_FORMAT:
                states.extend(states_from_loader(one))
            else:
                states.append(one)
        for state in states:
            _check_state(self, state)
        return {n: merged_source_state(n, [s[KEY_SOURCES][n] for s in states])
                for n in self.names if n in states[0][KEY_SOURCES]}


def _check_state(mixture: Mixture, state: Any) -> None:
    """Refuse a state this mixture cannot continue, saying what differs."""
    if not isinstance(state, Mapping) or state.get(KEY_FORMAT) != MIXTURE_FORMAT:
        found = state.get(KEY_FORMAT) if isinstance(state, Mapping) else type(state).__name__
        raise StateMismatchError(f"not a mixture state (format {found!r}, this Mixture "
                                 f"reads {MIXTURE_FORMAT!r})")
    if set(state) != set(KEYS):
        raise StateMismatchError(f"mixture state is corrupt: keys {sorted(state)}, "
                                 f"expected {sorted(KEYS)}")
    names = set(mixture.names) | set(mixture.retired)
    for key in (KEY_SOURCES, KEY_TABLES):
        if not isinstance(state[key], Mapping):
            raise StateMismatchError(f"mixture state is corrupt: {key} is not a dict")
        unknown = sorted(set(state[key]) - names)
        if unknown:
            raise MixtureStateError(
                f"the mixture state names source(s) {unknown} that this Mixture lacks (its "
                f"sources: {mixture.names}); build the Mixture with the sources of the run, "
                f"or retire them: Mixture(..., retire={unknown}) with their datasets in "
                "sources (their undelivered rows are recorded)")
    if set(state[KEY_SOURCES]) != set(state[KEY_TABLES]):
        raise StateMismatchError("mixture state is corrupt: its sources and tables differ")
    everyone = {**mixture.sources, **mixture.retired}
    for name in sorted(set(state[KEY_TABLES])):
        saved, ours = state[KEY_TABLES][name], _identity(everyone[name])
        if saved is not None and ours is not None and not same_json(saved, ours):
            raise MixtureStateError(
                f"source {name!r} is another table than the state's: the state read "
                f"{saved}, this Mixture's {name!r} reads {ours}; build it over the run's "
                "table")
    saved, ours = state[KEY_CONFIG], mixture.config
    if not isinstance(saved, Mapping) or set(saved) != set(ours):
        raise StateMismatchError(f"mixture state is corrupt: its config is {saved!r}")
    for key, meaning in (("seed", "the schedule's seed"), ("on_exhausted", "the policy")):
        if not same_json(saved[key], ours[key]):  # weights may change (NOTE [ recipe changes ])
            raise StateMismatchError(
                f"mixture state has {key}={saved[key]!r}, this Mixture {key}={ours[key]!r}: "
                f"{meaning} cannot change within a run; build the Mixture with {key}="
                f"{saved[key]!r}, or start a new run")


def _resume_source(name: str, source: Any, states: list[Any], workers: int, old: int) -> None:
    """Resume ``source`` in the worker that takes old worker ``old``'s position: with the
    saved plan, exactly that worker's slice of the source (the draws and the slice stay
    paired); after an elastic change, the whole merged state (the source re-plans it)."""
    from lakeckpt_tables.errors import ResumePathError

    state = merged_source_state(name, states)
    if is_reader_state(state) and state.get("plan") is not None:
        plan = state["plan"]
        shape = (getattr(source, "world_size", None), workers, getattr(source, "batch_size", None))
        if (plan["world_size"], plan["workers"], plan["batch_size"]) == shape:
            g = source.rank * workers + old
            state = {**state, "slices": [p if i == g else None
                                         for i, p in enumerate(state["slices"])]}
    try:
        source.load_state_dict(state)
    except ResumePathError:
        # NOTE [ torchdata's end-of-pass trap ] is about the mixture's pass, which the mixture
        # position tracks; a source's slice that delivered its whole pass is exhausted: the
        # mixture's next draw of it stops or cycles, as it would have without the resume
        if get_worker_info() is None:
            raise


def _cycling(name: str, source: Any) -> Any:
    """``source`` as a cycling mixture reads it (NOTE [ cycling sources ]; a refresh='epoch'
    reader as it is: NOTE [ sources that move ])."""
    if isinstance(source, LakeDataset) and source.refresh is not None:
        return source
    try:
        return cycling(source) if isinstance(source, LakeDataset) else source
    except ValueError as exc:
        raise MixtureError(f"source {name!r}: {exc}; or use on_exhausted='stop'") from None


def _check_epoch_delivers(name: str, source: Any, workers: int, worker: int) -> None:
    """Refuse a cycling source of which this worker gets no batch per epoch (read for ever)."""
    planner = getattr(source, "planner", None)
    if planner is None or getattr(planner, "epochs", 0) is not None:
        return  # not a cycling LakeDataset
    shape, g = (source.world_size, workers, source.batch_size), source.rank * workers + worker
    if hasattr(planner, "token_plan"):  # packed: every slice gets the same sequences
        batches = planner.token_plan(shape, 0, None).per_slice
    else:
        plan = planner.plan(planner.policy(shape), planner.rounds.get(0, {}, wait=False), None)
        batches = plan.batch_count(g)
    if batches == 0:
        raise MixtureError(f"source {name!r} gives no batch per epoch to rank {source.rank} "
                           f"DataLoader worker {worker} of {workers}: cycling it would read it "
                           "for ever. Give it more rows or fewer ranks x workers, or use "
                           "on_exhausted='stop'")


def _identity(source: Any) -> dict[str, str] | None:
    identity = getattr(getattr(source, "snapshot", None), "identity", None)
    return None if identity is None else identity.to_json()


def _tagged(batch: Any, name: str) -> dict[str, Any]:
    """The batch with its source's name: a dict in place (its type kept: a reader's
    ``Batch`` is what a loader that would batch it again recognizes), anything else wrapped."""
    if isinstance(batch, dict):
        batch[SOURCE_KEY] = name
        return batch
    return {"batch": batch, SOURCE_KEY: name}
