"""Re-planned layouts travel in every reader state as compact integer columns (issue 23;
NOTE [ compact layouts ] in ``lakeckpt_tables.plan.layout_codec``): exact, a few dozen KB at
256 x 8 slices, and the JSON form of earlier states still loads and reads the same rows."""

from __future__ import annotations

import base64
import json
import re
import zlib
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from conftest import Table, loader_for, take
from hypothesis import given, settings
from hypothesis import strategies as st

from lakeckpt_tables.errors import StateMismatchError
from lakeckpt_tables.plan import (
    FEISTEL,
    LEGACY,
    SHUFFLERS,
    EpochPlan,
    Piece,
    PlanPolicy,
    decode_layout,
    encode_layout,
    replan,
)
from lakeckpt_tables.reader import ReaderState, merge_states, states_from_loader
from lakeckpt_tables.types import TableIdentity

spans = st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 2**20)).map(
    lambda s: (s[0], s[0] + s[1])), max_size=4)


@st.composite
def pieces(draw: st.DrawFn) -> Piece:
    own = tuple(draw(spans))
    total = sum(b - a for a, b in own)
    hi = draw(st.integers(0, total))
    seed = draw(st.none() | st.integers(0, 2**63 - 1))
    if seed is None:
        return Piece(own, None, draw(st.integers(0, hi)), hi)
    return Piece(own, seed, draw(st.integers(0, hi)), hi, draw(st.sampled_from(SHUFFLERS)))


@settings(deadline=None, max_examples=300)
@given(layout=st.lists(pieces(), max_size=12).flatmap(
    lambda ps: st.just(ps) | st.just(ps + ps[:2])))  # some seeds used twice
def test_a_layout_round_trips_exactly_through_its_compact_json_form(
        layout: list[Piece]) -> None:
    encoded = json.loads(json.dumps(encode_layout(layout)))
    assert decode_layout(encoded) == tuple(layout)
    assert decode_layout([p.to_json() for p in layout]) == tuple(layout)  # the older form


ARGS: dict[str, Any] = {"batch_size": 9, "seed": 4, "shuffle_window": 2, "epochs": 2}


def _run(table: Table, world: int, steps: int | None,
         state: dict[str, Any] | None) -> tuple[list[list[list[int]]], dict[str, Any]]:
    """Every rank of ``world`` reads ``steps`` batches from ``state``: batches, merged state."""
    runs, states = [], []
    for rank in range(world):
        dataset = table.dataset(**ARGS, rank=rank, world_size=world)
        if state is not None:
            dataset.load_state_dict(state)
        loader = loader_for(dataset, 0)
        runs.append(take(loader, steps))
        states.extend(states_from_loader(loader.state_dict()))
    return runs, json.loads(json.dumps(merge_states(states).to_dict()))


def _as_earlier_versions_wrote(state: dict[str, Any]) -> dict[str, Any]:
    layouts = {e: [p.to_json() for p in decode_layout(v)] for e, v in state["layouts"].items()}
    return {**state, "layouts": layouts}


def test_a_state_whose_layouts_are_in_the_older_json_form_reads_the_same_rows(
        delta_table: Table) -> None:
    """2 ranks, then 3 (a re-plan: layouts), then the rest on 3 ranks and, re-planned again,
    on 2: the same batches from the compact state as from its older JSON form."""
    _, state = _run(delta_table, 3, 4, _run(delta_table, 2, 7, None)[1])
    assert all(isinstance(v, dict) for v in state["layouts"].values()) and state["layouts"]
    old = _as_earlier_versions_wrote(state)
    assert all(isinstance(v, list) for v in old["layouts"].values())
    assert ReaderState.from_dict(old) == ReaderState.from_dict(state)
    for world in (3, 2):
        assert _run(delta_table, world, None, old)[0] == _run(delta_table, world, None, state)[0]


@pytest.mark.parametrize(("change", "named"), [
    (lambda c: {**c, "columns": c["columns"][:-9] + "012345678"}, "compact layout is damaged"),
    (lambda c: {**c, "columns": c["columns"] + "\\"}, "compact layout is damaged"),
    (lambda c: {**c, "pieces": c["pieces"] + 1}, "compact layout is damaged"),
    (lambda c: {**c, "shufflers": []}, "compact layout is damaged"),
    (lambda c: {**c, "extra": 1}, "a layout is a list of pieces or a dict with keys"),
    (lambda c: encode_layout([Piece(((2**62, 2**62 + 1),), None, 0, 1)] * 2),
     "spans past any table"),
])
def test_a_damaged_compact_layout_is_refused_as_a_corrupt_state(change: Any,
                                                                  named: str) -> None:
    units = np.full(64, 100)
    policy = PlanPolicy(batch_size=10, world_size=2, workers=2, seed=1)
    plan = EpochPlan(units, policy)
    _, layouts = replan(units, policy, {}, [(0, int(plan.batch_ends(g)[2])) for g in range(4)])
    assert any(p.seed is not None for p in layouts[0])
    state = _state((3, 2, 10), layouts, [(0, 0)] * 6).to_dict()
    state["layouts"]["0"] = change(state["layouts"]["0"])
    with pytest.raises(StateMismatchError, match="reader state is corrupt") as info:
        ReaderState.from_dict(state)
    assert named in str(info.value)


def _form(n: int, values: list[int], shufflers: tuple[str, ...] = ()) -> dict[str, Any]:
    """A compact layout of ``n`` pieces holding ``values`` (the columns, flat)."""
    planes = np.array(values, dtype="<i8").view(np.uint8).reshape(-1, 8).T.tobytes()
    return {"pieces": n, "shufflers": list(shufflers),
            "columns": base64.b85encode(zlib.compress(planes)).decode()}


@pytest.mark.parametrize(("form", "named"), [
    (_form(1, [0, 1, 0, 5, 0]), "5 values for 1 pieces of 1 spans"),  # no "cut" column
    (_form(1, [0, 1, 0, 5, 0, 0, 7]), "a seed no piece uses"),
    (_form(1, [1, 1, 0, 5, 0, 0, 1, 7], (FEISTEL,)), "a piece using no seed"),  # seed 1
    (_form(1, [1, 1, 0, 5, 0, 0, 0, 7], ("pcg65",)), "unknown shuffler"),
    (_form(1, [0, 1, -1, 5, 0, 0]), "spans or [lo, hi) out of range"),
    (_form(1, [0, 1, 0, 5, 3, 3]), "spans or [lo, hi) out of range"),
])
def test_compact_columns_that_do_not_add_up_are_refused_naming_what(form: dict[str, Any],
                                                                      named: str) -> None:
    assert decode_layout(_form(1, [1, 1, 0, 5, 2, 1, 0, 7], (FEISTEL,))) == (
        Piece(((0, 5),), 7, 2, 4, FEISTEL),)  # the columns of one well-formed piece
    with pytest.raises(ValueError, match=re.escape(named)):
        decode_layout(form)


def _state(shape: tuple[int, int, int], layouts: dict[int, tuple[Piece, ...]],
           slices: list[tuple[int, int] | None]) -> ReaderState:
    identity = TableIdentity("delta", "s3://lake/warehouse/pretrain/tokens_10tb",
                             "8d1f0c7e-3a52-4f1e-9b6c-2f0d6a9e4b11")
    config = {"seed": 1234, "shuffle": True, "shuffle_window": 128, "drop_last": False,
              "epochs": 1, "columns": ["id", "input_ids", "attention_mask", "labels"]}
    return ReaderState(identity, 4821, config, shape, layouts, tuple(slices))


def _worker_bytes(state: ReaderState) -> int:
    """A DataLoader worker's ``state_dict()``: its own slice, the others null, as JSON."""
    worker = replace(state, slices=(state.slices[0],) + (None,) * (len(state.slices) - 1))
    return len(json.dumps(worker.to_dict(), separators=(",", ":")))


def test_every_worker_state_stays_under_64_kb_after_two_elastic_re_plans_of_256_ranks(
) -> None:
    """256 x 8 slices over 10^5 files x 8 row groups of ~4,096 rows, re-planned onto 192 x 8
    and, a way on, onto 128 x 8: every worker's state <= 64 KB (247 KiB and 360 KiB as JSON
    pieces). Positions as a lockstep run leaves them: every slice at the same batch, the
    first workers of each rank one ahead (the loader polls them in turn). The layouts hold
    two pieces per old slice: 4,096, then 5,632 or more."""
    rng = np.random.default_rng(23)
    units = rng.integers(3_900, 4_300, 800_000)
    sizes = []
    layouts: dict[int, tuple[Piece, ...]] = {}
    policy = PlanPolicy(batch_size=1024, world_size=256, workers=8, seed=1234)
    for ranks, step in ((192, 100), (128, 450)):
        plan = EpochPlan(units, policy, layout=layouts.get(0))
        ahead = rng.integers(0, 8, policy.world_size)
        positions = [(0, int(plan.batch_ends(g)[step + (g % 8 < ahead[g // 8])]))
                     for g in range(policy.slices)]
        _, layouts = replan(units, policy, layouts, positions)
        policy = replace(policy, world_size=ranks)
        sizes.append(_worker_bytes(_state((ranks, 8, 1024), layouts, [(0, 0)] * (ranks * 8))))
    assert len(layouts[0]) >= 5_632
    assert max(sizes) <= 64 * 1024, sizes


def test_the_states_of_every_worker_share_one_decoded_layout() -> None:
    """Rank 0 merges every worker's state, each carrying the same layout: decoded once
    (1,024 states of 5,600 pieces took 29 s decoded one by one)."""
    layout = tuple(Piece(((i * 10, i * 10 + 10),), i if i % 2 else None, 0, 10,
                         SHUFFLERS[-1] if i % 2 else LEGACY) for i in range(50))
    states = [json.loads(json.dumps(_state((2, 1, 5), {0: layout}, s).to_dict()))
              for s in ([(0, 5), None], [None, (0, 10)])]
    first, second = (ReaderState.from_dict(s).layouts[0] for s in states)
    assert first == layout and first is second
    assert merge_states(states).layouts == {0: layout}
    assert encode_layout(first) == states[0]["layouts"]["0"]
