"""A reader state is checked against the plan it claims before it is trusted (issue 13 item 4).

Hypothesis mutates a valid state (ints, lists, keys, types) and loads it: every mutation is
either refused with a StateMismatchError or is one the state alone cannot reveal (named in
``lakeckpt_tables.plan.validate``): a position moved to another batch end of its slice, the
table's location or pinned version, the follow policy. An accepted state with a changed layout
must still read every row at most once per epoch across ranks, with ranks in lockstep.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from typing import Any

import numpy as np
import pytest
from conftest import Table, loader_for, take
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from lakeckpt_tables.errors import LakeckptError, StateMismatchError
from lakeckpt_tables.reader import ReaderState, merge_states, states_from_loader

ARGS: dict[str, Any] = {"batch_size": 9, "seed": 4, "shuffle_window": 2, "epochs": 2}
Path = tuple[Any, ...]


def _states(table: Table) -> dict[str, Any]:
    """A complete state of 3 ranks mid-pass after an elastic resume from 2 (it has layouts)."""
    def run(world: int, steps: int, state: dict[str, Any] | None) -> dict[str, Any]:
        states = []
        for rank in range(world):
            dataset = table.dataset(**ARGS, rank=rank, world_size=world)
            if state is not None:
                dataset.load_state_dict(state)
            loader = loader_for(dataset, 0)
            take(loader, steps)
            states.extend(states_from_loader(loader.state_dict()))
        return merge_states(states).to_dict()

    return json.loads(json.dumps(run(3, 4, run(2, 7, None))))


@pytest.fixture(scope="module")
def valid(delta_table: Table) -> dict[str, Any]:
    return _states(delta_table)


def leaves(node: Any, path: Path = ()) -> dict[Path, Any]:
    if isinstance(node, dict):
        out: dict[Path, Any] = {path: "{}"} if not node else {}
        for k, v in node.items():
            out.update(leaves(v, (*path, k)))
        return out
    if isinstance(node, list):
        out = {path: "[]"} if not node else {}
        for i, v in enumerate(node):
            out.update(leaves(v, (*path, i)))
        return out
    return {path: node}


def nodes(node: Any, path: Path = ()) -> list[Path]:
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out.extend(nodes(v, (*path, k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(nodes(v, (*path, i)))
    return out


junk = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(),
                 st.text(max_size=3), st.just([]), st.just({}), st.just([[0, 1]]))


@st.composite
def mutated(draw: st.DrawFn, state: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(state)
    for _ in range(draw(st.integers(1, 2))):
        paths = nodes(out)[1:]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = out
        for key in path[:-1]:
            parent = parent[key]
        key, value = path[-1], parent[path[-1]]
        action = draw(st.sampled_from(["int", "small", "junk", "delete", "duplicate",
                                       "rename"]))
        if action == "int" or (action == "small" and isinstance(value, int)):
            delta = draw(st.integers(-40, 40)) if action == "small" else None
            parent[key] = (value + delta if delta is not None and isinstance(value, int)
                           and not isinstance(value, bool) else draw(st.integers(-(2**70),
                                                                                 2**70)))
        elif action == "junk" or action == "small":
            parent[key] = draw(junk)
        elif action == "delete":
            del parent[key]
        elif action == "duplicate":
            if isinstance(value, list) and value:
                value.append(copy.deepcopy(value[draw(st.integers(0, len(value) - 1))]))
            else:
                parent[key] = [value, value]
        elif isinstance(parent, dict):
            parent[str(key) + "x"] = parent.pop(key)
    return out


UNDETECTABLE = {("table", "location"), ("version",),
                # a known shuffler, or none (the form of a state older than shufflers' names):
                # the state decides the order (NOTE [ keyed permutation ] in plan/shuffle.py)
                ("config", "shuffler")}


def accepted_is_explained(dataset: Any, original: dict[str, Any], state: dict[str, Any],
                          table: Table) -> None:
    """An accepted mutation must be of a kind the state alone cannot reveal, or harmless."""
    before, after = leaves(original), leaves(state)
    changed = {p for p in set(before) | set(after) if before.get(p, KeyError) !=
               after.get(p, KeyError) or type(before.get(p)) is not type(after.get(p))}
    parsed = ReaderState.from_dict(state)
    assert parsed.plan is not None
    layouts = dict(parsed.layouts)
    layouts_changed = False
    for path in changed:
        if path in UNDETECTABLE or path[:1] == ("policy",):
            continue
        if (path[:1] == ("slices",) and len(path) >= 2 and isinstance(path[1], int)
                and path[1] < len(state["slices"]) and state["slices"][path[1]] is None):
            continue  # another rank's slice dropped: harmless here, refused where it is used
        if len(path) == 3 and path[0] == "slices" and path in after:
            # a slice moved to another of its batch ends (in its epoch, or another one)
            epoch, position = state["slices"][path[1]]
            plan, _ = dataset.round_plan(epoch, parsed.plan, layouts, {})
            ends = plan.batch_ends(path[1]).tolist()
            assert epoch < ARGS["epochs"] and position in [0, *ends], \
                f"accepted a position off its batches: {path} = {state['slices'][path[1]]}"
            continue
        if path[:1] == ("layouts",):
            layouts_changed = True
            continue
        if path == ("plan", "batch_size"):
            # another batch size whose batch ends hold every position (1 holds any): a
            # state records rows delivered, not how they were batched
            for g, (epoch, position) in enumerate(parsed.positions()):
                plan, _ = dataset.round_plan(epoch, parsed.plan, layouts, {})
                assert position in [0, *plan.batch_ends(g).tolist()], path
            continue
        raise AssertionError(f"accepted a state changed at {path}: "
                             f"{before.get(path)!r} -> {after.get(path)!r}")
    if layouts_changed:
        # a layout may name other rows (undetectable), but never one row twice, and the
        # ranks stay in lockstep
        world = parsed.plan[0]
        per_epoch: dict[int, Counter[int]] = {0: Counter(), 1: Counter()}
        lengths = []
        for rank in range(world):
            resumed = table.dataset(**ARGS, rank=rank, world_size=world)
            resumed.load_state_dict(state)
            run = take(loader_for(resumed, 0))
            lengths.append(len(run))
            epoch, position = parsed.slices[rank] or (0, 0)
            plan, _ = dataset.round_plan(epoch, parsed.plan, layouts, {})
            ends = plan.batch_ends(rank)
            left = len(ends) - int(np.searchsorted(ends, position, side="right"))
            for i, batch in enumerate(run):
                per_epoch[epoch if i < left else epoch + 1].update(batch)
        assert len(set(lengths)) == 1, "ranks out of lockstep"
        for counter in per_epoch.values():
            assert max(counter.values(), default=1) == 1, "a row delivered twice in an epoch"
            assert set(counter) <= set(table.ids.tolist())


@pytest.mark.timeout(300)
@settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.generate])
@given(data=st.data())
def test_a_mutated_state_is_refused_by_name_or_is_a_change_the_state_cannot_reveal(
        delta_table: Table, valid: dict[str, Any], data: st.DataObject) -> None:
    if data.draw(st.booleans(), label="layouts as JSON pieces (the form of older states)"):
        layouts = ReaderState.from_dict(valid).layouts
        valid = {**valid, "layouts": {str(e): [p.to_json() for p in ps]
                                      for e, ps in layouts.items()}}
    state = data.draw(mutated(valid))
    dataset = delta_table.dataset(**ARGS, rank=0, world_size=3)
    try:
        dataset.load_state_dict(state)
    except StateMismatchError:
        return
    except LakeckptError as exc:  # named, though not a state error: say which
        raise AssertionError(f"a damaged state raised {type(exc).__name__}") from exc
    accepted_is_explained(dataset, valid, state, delta_table)


@pytest.mark.parametrize(("path", "value", "named"), [
    (("slices", 0, 1), 4, "ends none of its batches"),
    (("slices", 1, 1), 10_000, "past the"),
    (("slices", 2, 0), 2, "epoch 2 of a 2-epoch pass"),
    (("layouts",), {"0": [[[[0, 30]], None, 0, 30], [[[20, 40]], None, 0, 20]]},
     "same rows twice"),
    (("layouts",), {"0": [[[[0, 400]], None, 0, 400]]}, "outside the round's 387"),
    (("layouts",), {"0": [[[[0, 20]], 7, 0, 12], [[[0, 20]], 7, 10, 20]]},
     "overlapping cuts of one window"),
    (("version",), "0", "expected an int"),
])
def test_a_state_that_cannot_be_a_position_of_its_plan_is_refused_naming_why(
        delta_table: Table, valid: dict[str, Any], path: Path, value: Any, named: str) -> None:
    state = copy.deepcopy(valid)
    node = state
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    dataset = delta_table.dataset(**ARGS, rank=0, world_size=3)
    with pytest.raises(StateMismatchError, match=named):
        dataset.load_state_dict(state)
