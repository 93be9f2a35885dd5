"""Mixture (NOTE [ mixture schedule ] in lakeckpt_tables/plan/schedule.py): a schedule that is
a pure function of (seed, draw) within 1% of the weights in every window, each source's rows
exactly once across resumes (dataset and loader paths, 0 and 2 workers, 3 ranks), a cycling
source's next pass its next epochs, named errors."""

from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lakeckpt_tables import Mixture
from lakeckpt_tables.errors import MixtureError, MixtureStateError, StateMismatchError
from lakeckpt_tables.mixture import schedule
from tests.conftest import Table, loader_for, raised_in_workers

WINDOW = 10_000


def worst_window_error(sources: np.ndarray, weights: list[float], window: int) -> float:
    """The largest |share - weight| of any source over every window of ``window`` draws."""
    total = sum(weights)
    worst = 0.0
    for k, w in enumerate(weights):
        counts = np.concatenate([[0], np.cumsum(sources == k)])
        shares = (counts[window:] - counts[:-window]) / window
        worst = max(worst, float(np.abs(shares - w / total).max()))
    return worst


@settings(max_examples=25, deadline=None)
@given(weights=st.lists(st.floats(0.01, 1.0), min_size=1, max_size=5),
       seed=st.integers(0, 2**40), start=st.integers(0, 2**50))
def test_every_window_of_10000_draws_is_within_a_tenth_of_a_percent_of_the_weights(
        weights, seed, start):
    draws = np.arange(start, start + 3 * WINDOW)
    sources = schedule(seed, weights, draws)
    assert worst_window_error(sources, weights, WINDOW) <= 0.001  # 10x inside the 1% promised


@pytest.mark.parametrize("workers", [2, 3, 8])
def test_each_workers_own_draws_keep_the_weights_too(workers):
    weights = [0.7, 0.2, 0.1]
    sources = schedule(7, weights, np.arange(workers * 3 * WINDOW))
    for w in range(workers):
        assert worst_window_error(sources[w::workers], weights, WINDOW) <= 0.002


def test_the_schedule_is_a_pure_function_of_seed_and_draw():
    weights = [3.0, 1.0]
    a = schedule(1, weights, np.arange(1000))
    assert (schedule(1, weights, np.arange(500, 1000)) == a[500:]).all()
    assert (schedule(1, [0.75, 0.25], np.arange(1000)) == a).all()  # normalized
    assert (schedule(2, weights, np.arange(1000)) != a).any()


def iid_worst(weights: list[float]) -> float:
    """For contrast: iid sampling is off by several times sqrt(window) in some window."""
    rng = np.random.default_rng(0)
    sources = rng.choice(len(weights), size=3 * WINDOW, p=np.array(weights) / sum(weights))
    return worst_window_error(sources, weights, WINDOW)


def test_iid_sampling_would_not_hold_the_bound_this_schedule_holds():
    assert iid_worst([0.5, 0.5]) > 0.001


# ------------------------------------------------------------------ over LakeDatasets


def mixture(delta: Table, iceberg: Table, *, on_exhausted: str = "stop", seed: int = 0,
            rank: int = 0, world_size: int = 1, batch_size: int = 16, epochs: int = 1,
            swap: bool = False) -> Mixture:
    web, code = (iceberg, delta) if swap else (delta, iceberg)
    kwargs: dict[str, Any] = {"batch_size": batch_size, "rank": rank, "world_size": world_size,
                              "epochs": epochs, "seed": 3}
    return Mixture({"web": web.dataset(**kwargs), "code": code.dataset(**kwargs)},
                   weights={"web": 0.7, "code": 0.3}, seed=seed, on_exhausted=on_exhausted)


def delivered(batches: Any) -> list[tuple[str, list[int]]]:
    return [(b["source"], b["id"].tolist()) for b in batches]


def per_source(run: list[tuple[str, list[int]]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {"web": [], "code": []}
    for name, ids in run:
        out[name] += ids
    return out


def test_each_batch_names_its_source_and_follows_the_schedule(delta_table, iceberg_table):
    mix = mixture(delta_table, iceberg_table)
    run = delivered(mix)
    assert [name for name, _ in run] == mix.source_of(np.arange(len(run)))
    ids = per_source(run)
    # "stop": web (70%) runs out first; every row it has is delivered once, code's a prefix
    assert sorted(ids["web"]) == delta_table.ids.tolist()
    code = [i for b in iceberg_table.dataset(batch_size=16, seed=3) for i in b["id"].tolist()]
    assert 0 < len(ids["code"]) < iceberg_table.rows and ids["code"] == code[:len(ids["code"])]


def test_cycle_reads_a_sources_next_epochs_as_its_next_pass(delta_table, iceberg_table):
    mix = mixture(delta_table, iceberg_table, on_exhausted="cycle", epochs=2)
    run = delivered(itertools.islice(mix, 100))
    ids = per_source(run)
    rows = delta_table.rows
    assert len(ids["web"]) > 2 * rows  # a second pass (epochs 2 and 3) started
    # the passes are the source's epochs 0, 1, 2, ...: each its own permutation of every row
    epochs = [i for b in delta_table.dataset(batch_size=16, seed=3, epochs=4)
              for i in b["id"].tolist()]
    assert ids["web"] == epochs[:len(ids["web"])]
    assert ids["web"][2 * rows:3 * rows] != ids["web"][:rows]
    state = mix.state_dict()
    assert state["positions"][0]["passes"] == {}  # the pass is in the source's own state
    assert state["sources"]["web"]["slices"][0][0] == 2
    assert state["sources"]["web"]["config"]["cycle"] is True
    with pytest.raises(StateMismatchError, match="cycle"):  # not a 2-epoch reader's position
        delta_table.dataset(batch_size=16, seed=3, epochs=2).load_state_dict(
            state["sources"]["web"])
    with pytest.raises(MixtureError, match=r"'web'.*follow=True.*on_exhausted='stop'"):
        Mixture({"web": delta_table.dataset(follow=True, max_idle=0.1)}, weights={"web": 1},
                on_exhausted="cycle")


def test_a_cycling_source_with_no_batch_per_epoch_for_a_worker_is_refused(delta_table):
    few = delta_table.dataset(batch_size=512, drop_last=True)
    with pytest.raises(MixtureError, match=r"'web' gives no batch per epoch.*for ever"):
        next(iter(Mixture({"web": few}, weights={"web": 1}, on_exhausted="cycle")))


@pytest.mark.parametrize("on_exhausted", ["stop", "cycle"])
def test_resuming_at_every_draw_delivers_the_uninterrupted_run(delta_table, iceberg_table,
                                                              on_exhausted):
    limit = 45
    whole = delivered(itertools.islice(mixture(delta_table, iceberg_table,
                                               on_exhausted=on_exhausted), limit))
    for stop in range(0, limit, 4):
        first = mixture(delta_table, iceberg_table, on_exhausted=on_exhausted)
        head = delivered(itertools.islice(first, stop))
        saved = json.loads(json.dumps(first.state_dict()))
        second = mixture(delta_table, iceberg_table, on_exhausted=on_exhausted)
        second.load_state_dict(saved)
        assert head + delivered(itertools.islice(second, limit - stop)) == whole, stop


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", ["loader", "dataset"])
def test_two_workers_resume_exactly_through_either_path(delta_table, iceberg_table, path):
    whole = delivered(loader_for(mixture(delta_table, iceberg_table), 2))
    assert sorted(per_source(whole)["web"]) == delta_table.ids.tolist()
    stop = 13
    loader = loader_for(mixture(delta_table, iceberg_table), 2)
    head = delivered(itertools.islice(loader, stop))
    saved = loader.state_dict()
    del loader
    mix = mixture(delta_table, iceberg_table)
    again = loader_for(mix, 2)
    if path == "loader":
        again.load_state_dict(saved)
    else:
        mix.load_state_dict(saved)
    assert head + delivered(again) == whole


def test_ranks_draw_the_same_sources_in_lockstep(delta_table, iceberg_table):
    runs = [delivered(mixture(delta_table, iceberg_table, rank=r, world_size=3))
            for r in range(3)]
    assert len({len(run) for run in runs}) == 1
    assert len({tuple(name for name, _ in run) for run in runs}) == 1
    web = sorted(i for run in runs for i in per_source(run)["web"])
    assert len(web) == len(set(web))  # each row once across ranks


def test_elastic_three_to_two_ranks_continues_the_schedule_exactly_once(delta_table,
                                                                        iceberg_table):
    mixes = [mixture(delta_table, iceberg_table, rank=r, world_size=3) for r in range(3)]
    heads = [delivered(itertools.islice(m, 5)) for m in mixes]
    saved = [m.state_dict() for m in mixes]
    rest = []
    for r in range(2):
        m = mixture(delta_table, iceberg_table, rank=r, world_size=2)
        m.load_state_dict(saved[0] | {"sources": {
            n: _merged([s["sources"][n] for s in saved]) for n in ("web", "code")}})
        rest.append(delivered(m))
    names = [name for name, _ in rest[0]]
    assert names == [name for name, _ in rest[1]]
    assert names == mixes[0].source_of(np.arange(5, 5 + len(names)))
    web = [i for run in heads + rest for i in per_source(run)["web"]]
    assert sorted(web) == delta_table.ids.tolist()  # web ran out: every row once


def _merged(states: list[dict[str, Any]]) -> dict[str, Any]:
    from lakeckpt_tables.reader.state import merge_states

    return merge_states(states).to_dict()


# ------------------------------------------------------------------------ named errors


@pytest.mark.parametrize("weights, match", [
    ({"web": 0.7, "code": 0.0}, "positive"),
    ({"web": 0.7, "code": -1}, "positive"),
    ({"web": 0.7, "code": float("nan")}, "positive"),
    ({"web": 1.0}, "one weight per source"),
    ({"web": 0.5, "code": 0.3, "books": 0.2}, "one weight per source"),
])
def test_bad_weights_are_refused_by_name(delta_table, weights, match):
    sources = {"web": delta_table.dataset(), "code": delta_table.dataset()}
    with pytest.raises(MixtureError, match=match):
        Mixture(sources, weights=weights)
    with pytest.raises(MixtureError, match="on_exhausted='never'"):
        Mixture(sources, weights={"web": 1, "code": 1}, on_exhausted="never")  # type: ignore


def test_states_of_other_sources_or_tables_are_refused_by_name(delta_table, iceberg_table):
    mix = mixture(delta_table, iceberg_table)
    next(iter(mix))
    state = mix.state_dict()
    one = Mixture({"web": delta_table.dataset(batch_size=16, seed=3)}, weights={"web": 1})
    with pytest.raises(MixtureStateError, match=r"names source\(s\) \['code'\] that this"):
        one.load_state_dict(state)
    three = Mixture({**{n: s for n, s in mixture(delta_table, iceberg_table).sources.items()},
                     "books": delta_table.dataset(batch_size=16, seed=3)},
                    weights={"web": 1, "code": 1, "books": 1})
    three.load_state_dict(state)  # a source may join at a resume (tests/test_mixture_recipe.py)
    assert three.added == ["books"]
    swapped = mixture(delta_table, iceberg_table, swap=True)
    with pytest.raises(MixtureStateError, match="source 'code' is another table"):
        swapped.load_state_dict(state)
    reseeded = mixture(delta_table, iceberg_table, seed=1)
    with pytest.raises(StateMismatchError, match="seed"):
        reseeded.load_state_dict(state)


def test_a_mixture_of_packed_datasets_resumes_exactly(delta_table, iceberg_table):
    def mix() -> Mixture:
        kwargs: dict[str, Any] = {"pack_tokens": "tokens", "columns": ["tokens"], "seq_len": 8,
                                  "eos_id": -1, "batch_size": 3}
        return Mixture({"web": delta_table.dataset(**kwargs),
                        "code": iceberg_table.dataset(**kwargs)},
                       weights={"web": 0.7, "code": 0.3}, on_exhausted="cycle")

    def seqs(batches: Any) -> list[tuple[str, list[list[int]]]]:
        return [(b["source"], b["input_ids"].tolist()) for b in batches]

    whole = seqs(itertools.islice(mix(), 70))
    assert {name for name, _ in whole} == {"web", "code"}
    for stop in (0, 17, 50):
        first = mix()
        head = seqs(itertools.islice(first, stop))
        again = mix()
        again.load_state_dict(json.loads(json.dumps(first.state_dict())))
        assert head + seqs(itertools.islice(again, 70 - stop)) == whole


@pytest.mark.timeout(60)
def test_source_states_merge_each_sources_workers_and_ranks(delta_table, iceberg_table):
    from lakeckpt_tables.reader.state import ReaderState

    loader = loader_for(mixture(delta_table, iceberg_table), 2)
    run = delivered(itertools.islice(loader, 9))
    states = mixture(delta_table, iceberg_table).source_states(loader.state_dict())
    del loader
    for name in ("web", "code"):
        state = ReaderState.from_dict(states[name])
        assert state.complete and state.plan == (1, 2, 16)
        # the rows its workers delivered are the rows of its batches the loader yielded
        assert sum(position for _, position in state.positions()) == sum(
            len(ids) for n, ids in run if n == name) > 0
    ranks = [mixture(delta_table, iceberg_table, rank=r, world_size=3) for r in range(3)]
    for m in ranks:
        next(iter(m))
    merged = ranks[0].source_states([m.state_dict() for m in ranks])
    assert ReaderState.from_dict(merged["web"]).complete


@pytest.mark.timeout(60)
def test_cycle_under_two_workers_resumes_exactly_through_the_loader(delta_table, iceberg_table):
    def loader() -> Any:
        return loader_for(mixture(delta_table, iceberg_table, on_exhausted="cycle"), 2)

    whole = delivered(itertools.islice(loader(), 70))
    first = loader()
    head = delivered(itertools.islice(first, 41))  # past web's first pass in both workers
    saved = first.state_dict()
    del first
    again = loader()
    again.load_state_dict(saved)
    assert head + delivered(itertools.islice(again, 29)) == whole


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("before", "after"), [(2, 0), (0, 2)])
def test_another_worker_count_goes_on_with_the_schedule_and_each_row_once(
        delta_table, iceberg_table, before, after):
    loader = loader_for(mixture(delta_table, iceberg_table), before)
    head = delivered(itertools.islice(loader, 13))
    saved = loader.state_dict()
    del loader
    mix = mixture(delta_table, iceberg_table)
    mix.load_state_dict(saved)
    rest = delivered(loader_for(mix, after))
    assert [name for name, _ in rest[:10]] == mix.source_of(np.arange(13, 23))
    web = per_source(head)["web"] + per_source(rest)["web"]
    assert sorted(web) == delta_table.ids.tolist()  # web ran out: every row once
    code = per_source(head)["code"] + per_source(rest)["code"]
    assert len(code) == len(set(code))


def test_another_worker_count_is_refused_by_name_for_a_source_that_cannot_re_plan(
        delta_table, iceberg_table):
    class Rows(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield from ({"id": torch.tensor([i])} for i in range(100))

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    def mix() -> Mixture:
        return Mixture({"web": delta_table.dataset(batch_size=16, seed=3), "other": Rows()},
                       weights={"web": 0.5, "other": 0.5})

    first = mix()
    delivered(itertools.islice(first, 4))
    again = mix()
    again.load_state_dict(first.state_dict())
    with raised_in_workers(MixtureStateError, r"source\(s\) \['other'\] are not LakeDatasets"):
        next(iter(loader_for(again, 2)))


def test_a_cycling_mixture_resumed_elastic_in_a_second_pass_gives_each_row_once_an_epoch(
        delta_table, iceberg_table):
    from collections import Counter

    mixes = [mixture(delta_table, iceberg_table, rank=r, world_size=3, on_exhausted="cycle")
             for r in range(3)]
    heads = [delivered(itertools.islice(m, 20)) for m in mixes]  # web's epoch 1 began
    saved = mixes[0].source_states([m.state_dict() for m in mixes])
    assert max(s[0] for s in saved["web"]["slices"]) == 1
    rest = []
    for r in range(2):
        m = mixture(delta_table, iceberg_table, rank=r, world_size=2, on_exhausted="cycle")
        m.load_state_dict(mixes[r].state_dict() | {"sources": saved})
        rest.append(delivered(itertools.islice(m, 30)))
    assert [n for n, _ in rest[0]] == [n for n, _ in rest[1]] == mixes[0].source_of(
        np.arange(20, 50))
    web = Counter(i for run in heads + rest for i in per_source(run)["web"])
    full = sum(web.values()) // delta_table.rows  # epochs delivered whole (the next begun)
    assert full >= 2 and set(web) == set(delta_table.ids.tolist())
    assert set(web.values()) <= {full, full + 1}  # each row once per epoch
