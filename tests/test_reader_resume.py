"""Resume is exact (Guarantees 1 and 2): one harness, both table formats.

For every reader configuration (seed, batch size, simulated world size, DataLoader workers,
shuffle window, shuffle on/off, epochs) and every interrupt point (0 and past the end
included), the batches a rank yields after resuming continue the uninterrupted sequence row for
row, and the ranks together deliver every row exactly once per epoch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import (
    Table,
    canonical_unit_ids,
    flat,
    loader_for,
    plan_for,
    raised_in_workers,
    tail_ids,
    take,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from lakeckpt_tables.errors import ResumePathError
from lakeckpt_tables.plan import EpochPlan
from lakeckpt_tables.reader import decode_state, encode_state, merge_states, states_from_loader


@dataclass(frozen=True)
class ReadConfig:
    seed: int
    batch_size: int
    world_size: int
    workers: int
    shuffle_window: int
    shuffle: bool
    epochs: int

    def reader_args(self, rank: int) -> dict[str, Any]:
        return {"seed": self.seed, "batch_size": self.batch_size, "shuffle": self.shuffle,
                "shuffle_window": self.shuffle_window, "epochs": self.epochs,
                "rank": rank, "world_size": self.world_size}


def read_configs(workers: st.SearchStrategy[int], world_sizes: st.SearchStrategy[int]
                 ) -> st.SearchStrategy[ReadConfig]:
    return st.builds(
        ReadConfig,
        seed=st.integers(0, 3),
        batch_size=st.integers(1, 48),
        world_size=world_sizes,
        workers=workers,
        shuffle_window=st.integers(1, 4),
        shuffle=st.booleans(),
        epochs=st.integers(1, 2),
    )


# Where to interrupt, as a fraction of the rank's batches: 0, the exact end, past the end
# (the loader saw the end of the pass), or anywhere in between.
interrupts = st.one_of(st.sampled_from([0.0, 1.0, 1.5]), st.floats(0.0, 1.0))


def interrupt_step(fraction: float, batches: int) -> int:
    return int(fraction * batches) + (3 if fraction > 1 else 0)


def uninterrupted(table: Table, cfg: ReadConfig) -> list[list[list[int]]]:
    """Every rank's batches (ids) of one uninterrupted pass."""
    return [take(loader_for(table.dataset(**cfg.reader_args(r)), cfg.workers))
            for r in range(cfg.world_size)]


def epoch_labels(plans: list[EpochPlan], rank: int, workers: int) -> list[int]:
    """The epoch of each batch a rank yields: its workers stream their epochs one after the
    other, and the loader takes their batches round-robin, skipping workers that are done."""
    k = max(workers, 1)
    streams = [[p.epoch for p in plans for _ in range(p.batch_count(rank * k + w))]
               for w in range(k)]
    labels: list[int] = []
    while any(streams):
        for stream in streams:
            if stream:
                labels.append(stream.pop(0))
    return labels


def assert_exactly_once(table: Table, cfg: ReadConfig, runs: list[list[list[int]]]) -> None:
    """Over all ranks, every row is delivered once in every epoch, except the plan's tail."""
    unit_ids = canonical_unit_ids(table)
    plans = [plan_for(table, batch_size=cfg.batch_size, world_size=cfg.world_size,
                      workers=max(cfg.workers, 1), shuffle=cfg.shuffle, seed=cfg.seed,
                      shuffle_window=cfg.shuffle_window, epoch=epoch)
             for epoch in range(cfg.epochs)]
    per_epoch: list[list[int]] = [[] for _ in plans]
    for rank, run in enumerate(runs):
        labels = epoch_labels(plans, rank, cfg.workers)
        assert len(labels) == len(run)
        for epoch, batch in zip(labels, run, strict=True):
            per_epoch[epoch].extend(batch)
    for plan, delivered in zip(plans, per_epoch, strict=True):
        tail = tail_ids(plan, unit_ids)
        if cfg.batch_size >= 2 and table.rows >= plan.policy.slices:
            assert tail == [], "the tail must be empty when every slice can take a row"
        assert sorted(delivered + tail) == table.ids.tolist(), f"epoch {plan.epoch}"


def check_resume(table: Table, cfg: ReadConfig, fraction: float) -> None:
    """The one resume harness: interrupt every rank at the same step and resume it both ways."""
    runs = uninterrupted(table, cfg)
    assert_exactly_once(table, cfg, runs)
    for rank, full in enumerate(runs):
        step = interrupt_step(fraction, len(full))
        loader = loader_for(table.dataset(**cfg.reader_args(rank)), cfg.workers)
        head = take(loader, step)
        assert head == full[:step], "a fresh run must repeat the uninterrupted one"
        saved = json.loads(json.dumps(loader.state_dict()))  # JSON-clean, never pickled
        saved = decode_state(encode_state(saved))
        assert isinstance(saved, dict)

        # (b) the dataset resumes from the loader's state (what CheckpointManager does).
        dataset = table.dataset(**cfg.reader_args(rank))
        dataset.load_state_dict(saved)
        assert head + take(loader_for(dataset, cfg.workers)) == full

        # (a) the loader resumes itself. torchdata treats a state taken after the loader saw
        # the end of the pass as a finished epoch and starts a fresh one in new workers
        # (NOTE [ torchdata's end-of-pass trap ]): a worker restored at the end of its pass
        # refuses by name rather than let the pass be delivered twice.
        resumed = loader_for(table.dataset(**cfg.reader_args(rank)), cfg.workers)
        resumed.load_state_dict(saved)
        if cfg.workers and any_worker_done(table, cfg, rank, saved):
            with raised_in_workers(ResumePathError, r"dataset\.load_state_dict\(saved\)"):
                take(resumed)
        else:
            assert head + take(resumed) == full


def any_worker_done(table: Table, cfg: ReadConfig, rank: int, saved: dict[str, Any]) -> bool:
    """Whether some worker of ``rank`` has delivered its whole pass in the loader state."""
    last = plan_for(table, batch_size=cfg.batch_size, world_size=cfg.world_size,
                    workers=cfg.workers, shuffle=cfg.shuffle, seed=cfg.seed,
                    shuffle_window=cfg.shuffle_window, epoch=cfg.epochs - 1)
    state = merge_states(states_from_loader(saved))
    return any(state.slices[g] is not None and state.slices[g][0] == cfg.epochs - 1
               and state.slices[g][1] >= last.delivered_rows(g)
               for g in range(rank * cfg.workers, (rank + 1) * cfg.workers))


@settings(deadline=None, max_examples=25)
@given(cfg=read_configs(workers=st.just(0), world_sizes=st.integers(1, 3)), fraction=interrupts)
def test_resuming_in_the_main_process_continues_the_uninterrupted_sequence(
    source: Table, cfg: ReadConfig, fraction: float
) -> None:
    check_resume(source, cfg, fraction)


@settings(deadline=None, max_examples=5)
@given(cfg=read_configs(workers=st.integers(1, 2), world_sizes=st.integers(1, 2)),
       fraction=interrupts)
def test_resuming_with_dataloader_workers_continues_the_uninterrupted_sequence(
    source: Table, cfg: ReadConfig, fraction: float
) -> None:
    check_resume(source, cfg, fraction)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world_size", [1, 3])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("fraction", [0.0, 0.4, 1.0, 1.5])
def test_both_resume_paths_are_exact_or_refused_by_name_for_0_and_2_workers_1_and_3_ranks(
    delta_table: Table, workers: int, world_size: int, fraction: float
) -> None:
    """Issue 8 item 1: interrupted anywhere, the end of the pass included, each path either
    continues the uninterrupted sequence row for row or names the path that can."""
    cfg = ReadConfig(seed=2, batch_size=23, world_size=world_size, workers=workers,
                     shuffle_window=2, shuffle=True, epochs=2)
    check_resume(delta_table, cfg, fraction)


def test_the_loader_restoring_a_finished_pass_with_workers_refuses_instead_of_repeating_it(
    delta_table: Table,
) -> None:
    """The reported bug: 2 workers, one epoch, state after the last batch: torchdata's own
    resume delivered the whole pass a second time."""
    args = {"batch_size": 64, "seed": 1}
    loader = loader_for(delta_table.dataset(**args), 2)
    assert sorted(flat(take(loader))) == delta_table.ids.tolist()
    saved = loader.state_dict()
    assert saved["_iterator_finished"] is True
    again = loader_for(delta_table.dataset(**args), 2)
    again.load_state_dict(saved)
    with raised_in_workers(ResumePathError, r"worker \d of rank 0 was restored"):
        take(again)
    dataset = delta_table.dataset(**args)
    dataset.load_state_dict(saved)  # the path the error names
    assert take(loader_for(dataset, 2)) == []


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.parametrize(("workers", "batch_size", "steps"), [
    (2, 40, [1, 7, 9, 10]),     # 10 batches per epoch: resume mid-round, in the next epoch
    (2, 193, [1, 3, 4, 5]),     # slices of 193 and 194 rows: one worker runs out first
    (3, 43, [1, 2, 4, 8, 17]),  # three workers: every position in the round
])
def test_a_worker_resume_through_the_dataset_keeps_the_round_robin_batch_order(
    delta_table: Table, workers: int, batch_size: int, steps: list[int]
) -> None:
    """A fresh loader polls worker 0 first; the dataset hands it the slice that is next."""
    cfg = ReadConfig(seed=1, batch_size=batch_size, world_size=1, workers=workers,
                     shuffle_window=2, shuffle=True, epochs=2)
    full = uninterrupted(delta_table, cfg)[0]
    for step in steps:
        loader = loader_for(delta_table.dataset(**cfg.reader_args(0)), workers)
        head = take(loader, step)
        dataset = delta_table.dataset(**cfg.reader_args(0))
        dataset.load_state_dict(loader.state_dict())
        assert head + take(loader_for(dataset, workers)) == full


def test_resumes_chained_through_the_dataset_and_the_loader_in_turn_stay_exact(
    delta_table: Table,
) -> None:
    cfg = ReadConfig(seed=3, batch_size=30, world_size=2, workers=2, shuffle_window=2,
                     shuffle=True, epochs=2)
    full = uninterrupted(delta_table, cfg)[1]
    got: list[list[int]] = []
    state: dict[str, Any] | None = None
    for step, through_dataset in [(3, True), (1, False), (4, True), (3, True), (2, False)]:
        dataset = delta_table.dataset(**cfg.reader_args(1))
        if state is not None and through_dataset:
            dataset.load_state_dict(state)
        loader = loader_for(dataset, cfg.workers)
        if state is not None and not through_dataset:
            loader.load_state_dict(state)
        got.extend(take(loader, step))
        state = json.loads(json.dumps(loader.state_dict()))
    assert got == full[:len(got)]
    dataset = delta_table.dataset(**cfg.reader_args(1))
    dataset.load_state_dict(state)
    assert got + take(loader_for(dataset, cfg.workers)) == full


@pytest.mark.parametrize("workers", [0, 2])
def test_a_finished_pass_resumed_through_the_dataset_yields_nothing(
    source: Table, workers: int
) -> None:
    args = {"batch_size": 32, "seed": 5, "epochs": 2, "rank": 1, "world_size": 2}
    loader = loader_for(source.dataset(**args), workers)
    everything = take(loader)
    assert len(flat(everything)) == 2 * (source.rows - source.rows // 2)  # rank 1, 2 epochs
    saved = loader.state_dict()  # after the last batch: the loader saw the end of the pass
    for state in (saved, json.loads(json.dumps(saved)),
                  merge_states(states_from_loader(saved)).to_dict()):
        dataset = source.dataset(**args)
        dataset.load_state_dict(state)
        assert take(loader_for(dataset, workers)) == []


def test_the_state_after_the_last_batch_but_before_the_end_resumes_to_nothing_either_way(
    source: Table,
) -> None:
    args = {"batch_size": 50, "seed": 2, "rank": 0, "world_size": 1}
    full = take(loader_for(source.dataset(**args), 0))
    loader = loader_for(source.dataset(**args), 0)
    assert take(loader, len(full)) == full
    saved = loader.state_dict()
    again = loader_for(source.dataset(**args), 0)
    again.load_state_dict(saved)
    assert take(again) == []
    dataset = source.dataset(**args)
    dataset.load_state_dict(saved)
    assert take(loader_for(dataset, 0)) == []


def test_a_dataset_state_round_trips_through_json_and_the_encoded_form(source: Table) -> None:
    args = {"batch_size": 16, "seed": 9, "shuffle_window": 3, "epochs": 2}
    full = take(loader_for(source.dataset(**args), 0))
    dataset = source.dataset(**args)
    iterator = iter(dataset)
    head = [next(iterator)["id"].tolist() for _ in range(7)]
    state = dataset.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert decode_state(encode_state(state)) == state
    assert merge_states([state]).to_dict() == state
    resumed = source.dataset(**args)
    resumed.load_state_dict(decode_state(encode_state(state)))
    assert head + take(loader_for(resumed, 0)) == full


def test_a_second_iteration_of_the_same_dataset_starts_a_fresh_pass(source: Table) -> None:
    dataset = source.dataset(batch_size=40, seed=4)
    first = flat(b["id"].tolist() for b in dataset)
    second = flat(b["id"].tolist() for b in dataset)
    assert first == second
    assert sorted(first) == source.ids.tolist()


def test_repeated_crashes_at_every_few_steps_still_give_the_uninterrupted_sequence(
    source: Table,
) -> None:
    cfg = ReadConfig(seed=7, batch_size=13, world_size=2, workers=0, shuffle_window=3,
                     shuffle=True, epochs=2)
    runs = uninterrupted(source, cfg)
    for rank, full in enumerate(runs):
        got: list[list[int]] = []
        state: dict[str, Any] | None = None
        while True:
            dataset = source.dataset(**cfg.reader_args(rank))
            if state is not None:
                dataset.load_state_dict(state)
            loader = loader_for(dataset, 0)
            part = take(loader, 5)
            got.extend(part)
            state = json.loads(json.dumps(loader.state_dict()))
            if not part:
                break
        assert got == full
