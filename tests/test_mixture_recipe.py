"""Recipes that change mid-run (NOTE [ weight schedules ] in lakeckpt_tables/mixture/weights.py,
NOTE [ recipe changes ] in lakeckpt_tables/checkpoint/recipe.py): weights that follow a schedule
stay within a point of the weights in force over any 10,000 draws; a resume into other weights
goes on from the resumed draw with every source's rows once, recorded in the ledger; the seed
and policy cannot change."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lakeckpt_tables import DeltaSource, LakeDataset, Mixture
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.errors import MixtureError, StateMismatchError
from lakeckpt_tables.ledger import DeltaLedger
from lakeckpt_tables.mixture import WeightSchedule
from lakeckpt_tables.plan.schedule import scheduled_per_draw, thresholds_per_draw
from tests.conftest import file_ranges, loader_for, write_delta

WINDOW = 10_000
TABLES = {"web": ((90, 61, 113, 47, 76), 0), "code": ((60, 41, 50), 10_000),
          "books": ((45, 38), 20_000)}


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("recipe")
    out = {}
    for name, (sizes, start) in TABLES.items():
        write_delta(root / name, file_ranges(sizes, start))
        out[name] = str(root / name)
    return out


def source(tables: dict[str, str], name: str, **kwargs: Any) -> LakeDataset:
    kwargs.setdefault("batch_size", 8)
    return LakeDataset(DeltaSource(tables[name]), columns=["id"], seed=4, **kwargs)


def ids_of(name: str) -> list[int]:
    sizes, start = TABLES[name]
    return list(range(start, start + sum(sizes)))


# ----------------------------------------------------------------- the pure schedule


def drawn(seed: int, schedule: WeightSchedule, draws: np.ndarray) -> np.ndarray:
    return scheduled_per_draw(seed, thresholds_per_draw(schedule.weights(draws)), draws)


def worst_window_error(sources: np.ndarray, weights: np.ndarray) -> float:
    """The largest |share - weights in force| of any source over any WINDOW draws; the
    weights in force over a window are the mean of its draws' weights."""
    worst = 0.0
    for k in range(weights.shape[1]):
        got = np.concatenate([[0], np.cumsum(sources == k)])
        due = np.concatenate([[0], np.cumsum(weights[:, k])])
        off = np.abs((got[WINDOW:] - got[:-WINDOW]) - (due[WINDOW:] - due[:-WINDOW]))
        worst = max(worst, float(off.max()) / WINDOW)
    return worst


@pytest.mark.parametrize("seed", [0, 7, 2**40 + 3])
def test_every_window_of_10000_draws_is_within_a_point_of_the_weights_in_force(seed):
    steps = WeightSchedule([
        {"at": 0, "weights": {"web": 0.7, "code": 0.3, "books": 0}},
        {"at": 10_000, "weights": {"web": 0.7, "code": 0.3, "books": 0},
         "to": {"web": 0.3, "code": 0.5, "books": 0.2}, "until": 25_000},
        {"at": 30_000, "weights": {"web": 0.1, "code": 0.1, "books": 0.8}},
    ], by="step", batches_per_step=2)
    draws = np.arange(90_000)
    weights, sources = steps.weights(draws), drawn(seed, steps, draws)
    # a resume at draw 41,111 into an anneal by draw: the old weights before, the new after
    later = WeightSchedule.anneal({"web": 0.2, "code": 0.2, "books": 0.6},
                                  {"web": 0.9, "code": 0.05, "books": 0.05},
                                  first=50_000, last=70_000)
    cut = draws < 41_111
    weights = np.where(cut[:, None], weights, later.weights(draws))
    sources = np.where(cut, sources, drawn(seed, later, draws))
    web = 2  # sources by name: books, code, web
    assert (sources[60_000:80_000] == web).mean() == pytest.approx((0.725 + 0.9) / 2, abs=0.002)
    for workers in (1, 3):  # each DataLoader worker's own draws keep the weights too
        for w in range(workers):
            assert worst_window_error(sources[w::workers], weights[w::workers]) <= 0.002  # 5x
            # inside the point promised


def test_a_constant_stretch_of_a_schedule_draws_what_constant_weights_draw(tables):
    plain = Mixture({"web": source(tables, "web"), "code": source(tables, "code")},
                    weights={"web": 0.7, "code": 0.3}, seed=5)
    later = WeightSchedule.piecewise({0: {"web": 7, "code": 3}, 500: {"web": 1, "code": 1}})
    scheduled = Mixture({"web": source(tables, "web"), "code": source(tables, "code")},
                        weights=later, seed=5)
    assert scheduled.source_of(np.arange(500)) == plain.source_of(np.arange(500))
    assert scheduled.source_of(np.arange(500, 5500)).count("web") == pytest.approx(2500, abs=5)
    # a schedule of one constant phase is constant weights: the same state
    same = Mixture({"web": source(tables, "web"), "code": source(tables, "code")},
                   weights=WeightSchedule.piecewise({0: {"web": 0.7, "code": 0.3}}), seed=5)
    assert same.config == plain.config


def test_a_schedule_is_plain_data_in_the_mixture_state(tables):
    schedule = WeightSchedule.anneal({"web": 7, "code": 3}, {"web": 3, "code": 7}, first=4,
                                     last=12, by="step", batches_per_step=2)
    mix = Mixture({"web": source(tables, "web"), "code": source(tables, "code")},
                  weights=schedule, seed=1)
    recorded = json.loads(json.dumps(mix.state_dict()))["config"]["weights"]
    assert recorded == {"by": "step", "batches_per_step": 2, "phases": [
        {"at": 0, "weights": {"code": 0.3, "web": 0.7}},
        {"at": 4, "weights": {"code": 0.3, "web": 0.7}, "to": {"code": 0.7, "web": 0.3},
         "until": 12}]}
    again = Mixture({"web": source(tables, "web"), "code": source(tables, "code")},
                    weights=recorded, seed=1)  # the JSON builds the same schedule
    assert again.source_of(np.arange(64)) == mix.source_of(np.arange(64))
    assert schedule.in_force(16) == {"code": 0.5, "web": 0.5}  # step 8: half way


@pytest.mark.parametrize("phases, match", [
    ([{"at": 1, "weights": {"web": 1, "code": 1}}], "the first at 0"),
    ([{"at": 0, "weights": {"web": 1, "code": 1}}, {"at": 0, "weights": {"web": 1, "code": 2}}],
     "each later"),
    ([{"at": 0, "weights": {"web": 1, "code": 0}}, {"at": 5, "weights": {"web": 1}}],
     "phase 1 .* names sources"),
    ([{"at": 0, "weights": {"web": 0, "code": 0}}], "some positive"),
    ([{"at": 0, "weights": {"web": 1, "code": -1}}], "weights >= 0"),
    ([{"at": 0, "weights": {"web": 1, "code": 1}, "to": {"web": 1, "code": 2}}], "'until'"),
    ([{"at": 3, "weights": {"web": 1, "code": 1}, "to": {"web": 1, "code": 2}, "until": 3}],
     "until"),
    ([{"at": 0, "weights": {"web": 1, "code": 1}, "to": {"web": 1, "code": 2}, "until": 9},
      {"at": 5, "weights": {"web": 1, "code": 1}}], "ends at 9, after phase 1 starts at 5"),
])
def test_bad_schedules_are_refused_by_name(phases, match):
    with pytest.raises(MixtureError, match=match):
        WeightSchedule(phases)


def test_a_schedule_naming_other_sources_is_refused(tables):
    with pytest.raises(MixtureError, match=r"names \['books', 'web'\] but the sources"):
        Mixture({"web": source(tables, "web"), "code": source(tables, "code")},
                weights=WeightSchedule.piecewise({0: {"web": 1, "books": 1}}))
    with pytest.raises(MixtureError, match="by='epoch'"):
        WeightSchedule([{"at": 0, "weights": {"web": 1}}], by="epoch")  # type: ignore[arg-type]


# ----------------------------------------------------------------- a resume into other weights


def two(tables: dict[str, str], weights: Any, seed: int = 2, on_exhausted: str = "stop",
        **kwargs: Any) -> Mixture:
    return Mixture({"web": source(tables, "web", **kwargs),
                    "code": source(tables, "code", **kwargs)},
                   weights=weights, seed=seed, on_exhausted=on_exhausted)


ANNEAL = WeightSchedule.anneal({"web": 0.7, "code": 0.3}, {"web": 0.1, "code": 0.9},
                               first=12, last=30)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_into_other_weights_goes_on_from_the_resumed_draw_each_row_once(
        tables, workers):
    stop = 11
    loader = loader_for(two(tables, {"web": 0.7, "code": 0.3}), workers)
    head = [(b["source"], b["id"].tolist()) for b in itertools.islice(loader, stop)]
    saved = json.loads(json.dumps(loader.state_dict()))
    del loader
    resumed = two(tables, ANNEAL)
    again = loader_for(resumed, workers)
    again.load_state_dict(saved)
    rest = [(b["source"], b["id"].tolist()) for b in again]
    assert [s for s, _ in rest] == resumed.source_of(np.arange(stop, stop + len(rest)))
    assert [s for s, _ in head] == two(tables, {"web": 7, "code": 3}).source_of(np.arange(stop))
    run = head + rest
    for name in ("web", "code"):
        got = [i for s, ids in run if s == name for i in ids]
        assert len(got) == len(set(got))  # each row at most once per pass
    # the anneal toward code makes code run out first ("stop"): every row of it once
    assert sorted(i for s, ids in run if s == "code" for i in ids) == ids_of("code")


def test_another_seed_or_policy_is_still_refused_by_name(tables):
    first = two(tables, {"web": 0.7, "code": 0.3})
    next(iter(first))
    state = first.state_dict()
    with pytest.raises(StateMismatchError, match=r"seed=2, this Mixture seed=3.*seed=2"):
        two(tables, ANNEAL, seed=3).load_state_dict(state)
    with pytest.raises(StateMismatchError, match="on_exhausted='stop', this Mixture "
                                                 "on_exhausted='cycle'"):
        two(tables, ANNEAL, on_exhausted="cycle").load_state_dict(state)


def consumed(root: Path, run: str) -> Counter[str]:
    """Rows the ledger records per source key (a shuffled read's record counts its rows)."""
    seen: Counter[str] = Counter()
    for rec in DeltaLedger(str(root / "_ledger")).consumption(run_id=run).to_pylist():
        seen[rec["source_key"]] += rec["rows"]
    return seen


def events(root: Path, run: str, name: str) -> list[tuple[int, dict[str, Any]]]:
    from lakeckpt_tables.audit import connect

    rows = connect(str(root)).sql(
        f"SELECT step, detail FROM events WHERE run_id = '{run}' AND event = '{name}' "
        "ORDER BY step").fetchall()
    return [(step, json.loads(detail)) for step, detail in rows]


@pytest.mark.timeout(60)
def test_the_ledger_records_the_weights_change_and_every_row_once(tables, tmp_path):
    from lakeckpt_tables.audit import verify

    manager = CheckpointManager(tmp_path, "r")
    loader = loader_for(two(tables, {"web": 0.7, "code": 0.3}), 0)
    trained: list[tuple[str, list[int]]] = []
    for step, batch in enumerate(loader, 1):
        trained.append((batch["source"], batch["id"].tolist()))
        if step % 4 == 0:
            manager.save(step, dataloader=loader)
        if step == 10:
            break  # steps 9 and 10 are lost with the "crash"
    resumed = loader_for(two(tables, ANNEAL), 0)
    again = CheckpointManager(tmp_path, "r")
    restored = again.restore(dataloader=resumed)
    assert restored == 8
    del trained[restored:]
    for step, batch in enumerate(resumed, restored + 1):
        trained.append((batch["source"], batch["id"].tolist()))
        if step % 4 == 0:
            again.save(step, dataloader=resumed)
    again.save(step + 1, dataloader=resumed)
    ((first, start),) = events(tmp_path, "r", "mixture")  # the recipe the run started with
    assert first == 4 and start == {"seed": 2, "on_exhausted": "stop", "sources": ["code", "web"],
                                     "weights": {"code": 0.3, "web": 0.7}}
    ((at, change),) = events(tmp_path, "r", "mixture_weights")
    assert at == 12  # committed with the first checkpoint trained under the new weights
    assert change["draw"] == 8 and change["step"] == 8
    assert change["old"] == {"code": 0.3, "web": 0.7}
    assert change["new"] == ANNEAL.to_json()
    assert change["in_force_before"] == {"code": 0.3, "web": 0.7}
    assert change["in_force_after"] == {"code": 0.3, "web": 0.7}  # the anneal starts at 12
    rows = {n: [i for s, ids in trained if s == n for i in ids] for n in ("web", "code")}
    assert sorted(rows["code"]) == ids_of("code")  # code ran out: every row once
    assert len(rows["web"]) == len(set(rows["web"]))
    assert consumed(tmp_path, "r") == {n: len(ids) for n, ids in rows.items()}
    (verdict,) = verify(str(tmp_path))
    assert verdict.violations == []


# ------------------------------------------------------------------ sources added and retired


@pytest.mark.timeout(60)
def test_a_source_added_and_one_retired_at_a_resume_are_recorded_each_row_once(tables, tmp_path):
    from lakeckpt_tables.audit import connect, verify

    manager = CheckpointManager(tmp_path, "s")
    loader = loader_for(two(tables, {"web": 0.7, "code": 0.3}), 0)
    trained: list[tuple[str, list[int]]] = []
    for step, batch in enumerate(loader, 1):
        trained.append((batch["source"], batch["id"].tolist()))
        if step % 4 == 0:
            manager.save(step, dataloader=loader)
        if step == 10:
            break
    mix = Mixture({"web": source(tables, "web"), "code": source(tables, "code"),
                   "books": source(tables, "books")},
                  weights={"web": 0.5, "books": 0.5}, seed=2, retire=["code"])
    resumed = loader_for(mix, 0)
    again = CheckpointManager(tmp_path, "s")
    restored = again.restore(dataloader=resumed)
    assert restored == 8 and mix.added == ["books"]
    # a skip before the first save: the changes are still the next checkpoint's to record
    assert again.skip(resumed, batches=2, reason="spike") == 2
    del trained[restored:]
    for step, batch in enumerate(resumed, restored + 1):
        trained.append((batch["source"], batch["id"].tolist()))
        if step % 4 == 0:
            again.save(step, dataloader=resumed)
    again.save(step + 1, dataloader=resumed)
    assert {s for s, _ in trained[8:]} == {"web", "books"}  # code is drawn no more
    rows = {n: [i for s, ids in trained if s == n for i in ids] for n in TABLES}
    assert all(len(ids) == len(set(ids)) for ids in rows.values())
    ((_, added),) = events(tmp_path, "s", "source_added")
    assert (added["source_key"], added["draw"]) == ("books", 8)
    ((at, retired),) = events(tmp_path, "s", "source_retired")
    assert at == 12 and (retired["source_key"], retired["draw"]) == ("code", 8)
    assert retired["rows"] == len(ids_of("code")) - len(rows["code"])  # never delivered
    tails = [d for _, d in events(tmp_path, "s", "undelivered") if d["source_key"] == "code"]
    assert [d["reason"] for d in tails] == ["source retired"]
    ((_, skip),) = events(tmp_path, "s", "skipped")
    assert skip["batches"] == 2 and skip["after_step"] == 8
    (verdict,) = verify(str(tmp_path))
    assert verdict.violations == [] and verdict.retired == ["code"]
    assert verdict.skipped == skip["rows"] > 0
    assert verdict.rows + verdict.skipped == sum(len(ids) for ids in rows.values()) + skip["rows"]
    states = dict(connect(str(tmp_path)).sql(
        "SELECT source_key, state FROM progress WHERE run_id = 's'").fetchall())
    assert states["code"] == "retired"


def test_a_state_source_neither_in_the_mixture_nor_retired_is_refused_by_name(tables):
    from lakeckpt_tables.errors import MixtureStateError

    first = two(tables, {"web": 0.7, "code": 0.3})
    next(iter(first))
    only_web = Mixture({"web": source(tables, "web")}, weights={"web": 1}, seed=2)
    with pytest.raises(MixtureStateError, match=r"retire=\['code'\]"):
        only_web.load_state_dict(first.state_dict())
    with pytest.raises(MixtureError, match=r"retire=\['books'\] names no source"):
        Mixture({"web": source(tables, "web")}, weights={"web": 1}, retire=["books"])
