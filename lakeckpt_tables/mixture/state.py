"""A Mixture's state, defined once: its JSON form, how it is checked, parsed and merged, and
the one answer to "is this state one reader's or a mixture's, and what are its readers' states"
(:func:`reader_states`, :func:`paired_reader_states`) that checkpoints, eos counts, replays
and verification all ask.

No torch: audits read mixture states (which sources a checkpoint read) without importing it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lakeckpt_tables.errors import MixtureStateError, StateMismatchError

__all__ = [
    "KEYS",
    "KEY_CONFIG",
    "KEY_FORMAT",
    "KEY_POSITIONS",
    "KEY_SOURCES",
    "KEY_TABLES",
    "KEY_WORKERS",
    "MIXTURE_FORMAT",
    "Position",
    "Resume",
    "is_mixture_state",
    "is_reader_state",
    "merge_mixture_states",
    "merge_positions",
    "merged_source_state",
    "paired_reader_states",
    "reader_states",
    "same_json",
]

MIXTURE_FORMAT = "lakeckpt.mixture/1"
KEY_FORMAT, KEY_CONFIG, KEY_WORKERS = "format", "config", "workers"
KEY_POSITIONS, KEY_TABLES, KEY_SOURCES = "positions", "tables", "sources"
KEYS = (KEY_FORMAT, KEY_CONFIG, KEY_WORKERS, KEY_POSITIONS, KEY_TABLES, KEY_SOURCES)


@dataclass
class Position:
    """Where one worker's mixture stands."""

    draw: int  # the next draw this worker takes
    passes: dict[str, int] = field(default_factory=dict)  # passes started after the first
    ended: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"draw": self.draw, "passes": dict(self.passes), "ended": self.ended}

    @classmethod
    def from_json(cls, value: Any, names: list[str]) -> Position:
        if not isinstance(value, Mapping) or set(value) != {"draw", "passes", "ended"}:
            raise ValueError(f"a mixture position has keys draw, passes, ended; got {value!r}")
        draw, passes, ended = value["draw"], value["passes"], value["ended"]
        if not natural(draw) or not isinstance(ended, bool) or not isinstance(passes, Mapping):
            raise ValueError(f"bad mixture position {value!r}")
        if set(passes) - set(names) or not all(natural(p) for p in passes.values()):
            raise ValueError(f"a mixture position's passes name sources {names}; got {value!r}")
        return cls(draw, dict(passes), ended)


def natural(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def merge_mixture_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One mixture state from those of several DataLoader workers and ranks (what a
    checkpoint keeps): every worker's position, and each source's states merged. Ranks take
    the same draws in lockstep, so their positions of a worker agree.

    Raises:
        StateMismatchError: states of other mixtures (schedule, sources, tables), or
            positions that disagree.
    """
    first = states[0]
    for other in states[1:]:
        for key in (KEY_FORMAT, KEY_CONFIG, KEY_TABLES):
            if not same_json(first.get(key), other.get(key)):
                raise StateMismatchError(f"cannot merge mixture states with different {key}: "
                                         f"{first.get(key)} vs {other.get(key)}")
        if set(other.get(KEY_SOURCES, ())) != set(first.get(KEY_SOURCES, ())):
            raise StateMismatchError("cannot merge mixture states of different sources")
    names = sorted(first[KEY_SOURCES])
    workers, positions = merge_positions(names, states)
    return {KEY_FORMAT: MIXTURE_FORMAT, KEY_CONFIG: first[KEY_CONFIG], KEY_WORKERS: workers,
            KEY_POSITIONS: [None if p is None else p.to_json() for p in positions],
            KEY_TABLES: first[KEY_TABLES],
            KEY_SOURCES: {n: merged_source_state(n, [s[KEY_SOURCES][n] for s in states])
                          for n in names}}


def is_mixture_state(state: Any) -> bool:
    """Whether ``state`` is a mixture state (not a loader's state over a mixture)."""
    return isinstance(state, Mapping) and state.get(KEY_FORMAT) == MIXTURE_FORMAT


def reader_states(state: Mapping[str, Any] | None) -> dict[str | None, Any]:
    """The readers' states in a checkpoint's merged reader state, by Mixture source key in
    name order (a lone reader's under None; a state of nothing read yet, None: no reader)."""
    if state is None:
        return {}
    if is_mixture_state(state):
        return dict(sorted(state[KEY_SOURCES].items()))
    return {None: state}


def paired_reader_states(after: Mapping[str, Any], before: Mapping[str, Any] | None
                         ) -> list[tuple[str | None, Any, Any | None]]:
    """Each reader of ``after`` (key, its state, its state in ``before`` or None when
    ``before`` has no such reader): what accounting between two checkpoints walks."""
    was = reader_states(before)
    return [(key, state, was.get(key)) for key, state in reader_states(after).items()]


def merge_positions(names: list[str], states: Sequence[Mapping[str, Any]]
                     ) -> tuple[int | None, list[Position | None]]:
    workers = None
    positions: list[Position | None] = []
    for state in states:
        w = state[KEY_WORKERS]
        if w is None:
            continue
        try:
            parsed = [None if p is None else Position.from_json(p, names)
                      for p in state[KEY_POSITIONS]]
        except ValueError as exc:
            raise StateMismatchError(f"mixture state is corrupt: {exc}") from exc
        if not natural(w) or w == 0 or len(parsed) != w:
            raise StateMismatchError(f"mixture state is corrupt: {w!r} workers, "
                                     f"{len(parsed)} positions")
        if workers is None:
            workers, positions = w, [None] * w
        elif w != workers:
            raise StateMismatchError(f"mixture states of {workers} and {w} workers cannot "
                                     "be merged")
        for i, p in enumerate(parsed):
            if p is not None:
                if positions[i] is not None and positions[i] != p:
                    raise StateMismatchError(f"two mixture states disagree on worker {i}")
                positions[i] = p
    return workers, positions


@dataclass
class Resume:
    """A loaded mixture state: per worker its position, per source the states saved."""

    workers: int | None
    positions: list[Position | None]
    sources: dict[str, list[Any]]


def is_reader_state(state: Any) -> bool:
    from lakeckpt_tables.reader.state import STATE_FORMAT

    return isinstance(state, Mapping) and state.get("format") == STATE_FORMAT


def merged_source_state(name: str, states: list[Any]) -> Any:
    """One source's states of several workers (and ranks) as one (reader states merge;
    anything else must come from one worker)."""
    if len(states) == 1:
        return states[0]
    from lakeckpt_tables.reader.state import merge_states

    if all(is_reader_state(s) for s in states):
        return merge_states(states).to_dict()
    raise MixtureStateError(f"source {name!r}'s states of {len(states)} DataLoader workers "
                            "cannot be merged (not LakeDataset states); resume through the "
                            "loader (loader.load_state_dict)")


def same_json(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
