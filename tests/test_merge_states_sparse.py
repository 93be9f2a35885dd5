"""merge_states in one pass over sparse states (rank 0 merges ranks x workers of them at every
save): the same merge as a fold of pairs, every held slice found, conflicts refused by name."""

from __future__ import annotations

import random

import pytest

from lakeckpt_tables.errors import StateMismatchError
from lakeckpt_tables.reader import merge_states
from lakeckpt_tables.reader.state import STATE_FORMAT

RANKS, WORKERS = 64, 8


def _state(held: dict[int, list[int]], *, seed: int = 0) -> dict[str, object]:
    slices: list[list[int] | None] = [None] * (RANKS * WORKERS)
    for g, pos in held.items():
        slices[g] = pos
    return {"format": STATE_FORMAT,
            "table": {"format": "delta", "location": "/t", "table_id": "id"},
            "version": 3, "config": {"seed": seed}, "policy": {},
            "plan": {"world_size": RANKS, "workers": WORKERS, "batch_size": 8},
            "layouts": {}, "slices": slices}


@pytest.mark.timeout(10)
def test_every_held_slice_of_many_sparse_states_is_merged() -> None:
    rng = random.Random(7)
    want: dict[int, list[int]] = {}
    states = []
    for rank in range(RANKS):  # each rank holds its workers' slices, some scattered
        own = {g: [rng.randrange(3), rng.randrange(10**6)]
               for g in range(rank * WORKERS, (rank + 1) * WORKERS) if rng.random() < 0.9}
        want.update(own)
        states.append(_state(own))
    rest = [g for g in range(RANKS * WORKERS) if g not in want]
    states.append(_state({g: [0, g] for g in rest}))  # the missing ones, in one state
    want.update({g: [0, g] for g in rest})
    states.insert(5, {**_state({}), "plan": None, "slices": []})  # nothing read yet: ignored
    merged = merge_states(states)
    assert merged.complete
    assert merged.slices == tuple(tuple(want[g]) for g in range(RANKS * WORKERS))


@pytest.mark.timeout(10)
def test_a_conflicting_slice_or_config_among_many_states_is_refused_by_name() -> None:
    states = [_state({g: [0, g]}) for g in range(0, RANKS * WORKERS, 3)]
    last = RANKS * WORKERS - 2  # held by the last state
    with pytest.raises(StateMismatchError, match=f"disagree on slice {last}"):
        merge_states([*states, _state({last: [0, 1]})])
    assert merge_states([*states, _state({last: [0, last]})]).slices[last] == (0, last)
    with pytest.raises(StateMismatchError, match="different config"):
        merge_states([*states, _state({1: [0, 1]}, seed=1)])
