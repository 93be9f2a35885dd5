"""The packed accounting (NOTE [ packed accounting ] in ``checkpoint/consumption.py``) across
an elastic re-plan, 3 ranks then 2: rows are counted once each by their eos, the rows the
lockstep tails hold are ``undelivered`` events, and the records' tokens are those delivered;
and over any token plan and checkpoints, what each checkpoint saw (every row it delivered a
token of)."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lakeckpt_tables import LakeDataset
from lakeckpt_tables.checkpoint.consumption import (
    RowLengths,
    consumed_between,
    segment_events,
    slice_stream,
    touched_rows,
    unit_parts,
)
from lakeckpt_tables.reader.packing.token_plan import TokenPlan
from lakeckpt_tables.reader.state import merge_states
from tests.conftest import Table


def packed(table: Table, **kwargs: Any) -> LakeDataset:
    return LakeDataset(table.make_source(), pack_tokens="tokens", seq_len=8, eos_id=-1,
                       batch_size=3, seed=11, epochs=2, **kwargs)


def test_rows_by_eos_and_tokens_are_accounted_once_across_an_elastic_replan(
        delta_table: Table) -> None:
    old = [packed(delta_table, rank=r, world_size=3) for r in range(3)]
    delivered = [sum(b["input_ids"].numel() for ds, n in zip(old, (2, 5, 2), strict=True)
                     for b in itertools.islice(ds, n))]
    first = merge_states([ds.state_dict() for ds in old])
    new = [packed(delta_table, rank=r, world_size=2) for r in range(2)]
    for ds in new:
        ds.load_state_dict(first.to_dict())
    its = [iter(ds) for ds in new]
    delivered.append(sum(b["input_ids"].numel() for it in its for b in itertools.islice(it, 4)))
    second = merge_states([ds.state_dict() for ds in new])
    delivered.append(sum(b["input_ids"].numel() for it in its for b in it))
    last = merge_states([ds.state_dict() for ds in new])
    steps = [(old[0], None, first), (new[0], first, second), (new[0], second, last)]
    records = [consumed_between(ds, a, b) for ds, a, b in steps]
    assert [sum(r.tokens for r in rs) for rs in records] == delivered
    events = [e for ds, a, b in steps for e in segment_events(ds, a, b)]
    undelivered: Counter[tuple[Any, ...]] = Counter()
    for name, detail in events:
        if name == "undelivered":
            for path, group, r0, r1 in detail["ranges"]:
                undelivered.update((detail["epoch"], path, group, r) for r in range(r0, r1))
    # tails: epoch 0 planned for 3 ranks, then again for 2; epoch 1 for 2
    assert [(name, d["epoch"]) for name, d in events if name != "round"] == [
        ("undelivered", 0), ("undelivered", 0), ("undelivered", 1)]
    counted = Counter((r.epoch, r.file, r.row_group, row) for rs in records for r in rs
                      for row in range(r.row_start, r.row_end))
    assert max(counted.values()) == 1 and not set(counted) & set(undelivered)
    units = old[0].snapshot.units
    every = {(e, u.path, u.row_group, row) for e in (0, 1) for u in units for row in range(u.rows)}
    assert set(counted) | set(undelivered) == every


@settings(max_examples=60, deadline=None)
@given(doc_lengths=st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=8), min_size=1,
                            max_size=8),
       slices=st.integers(1, 3), cuts=st.lists(st.integers(0, 40), max_size=4),
       seed=st.integers(0, 3))
def test_any_checkpoints_count_each_row_by_its_eos_and_see_each_row_they_delivered_a_token_of(
        doc_lengths: list[list[int]], slices: int, cuts: list[int], seed: int) -> None:
    sizes = [sum(n + 1 for n in unit) for unit in doc_lengths]
    plan = TokenPlan.of(sizes, slices=slices, seq_len=3, seed=seed, epoch=0, shuffle=True)
    lengths = RowLengths([len(unit) for unit in doc_lengths],
                         lambda u: np.array(doc_lengths[u]))
    # the oracle: each stream element's (unit, row), in stream order
    owner = [(u, r) for u in plan.order for r, n in enumerate(doc_lengths[u])
             for _ in range(n + 1)]
    counted: list[tuple[int, int]] = []
    for q in range(slices):
        marks = sorted({0, plan.per_slice, *(min(c, plan.per_slice) for c in cuts)})
        for before, after in itertools.pairwise(marks):
            spans = slice_stream(plan, q, before, after)
            parts = [p for a, b in spans for p in unit_parts(plan, a, b)]
            assert sum(p.hi - p.lo for p in parts) == (after - before) * 3  # tokens delivered
            seen: Counter[tuple[int, int]] = Counter()
            for part in parts:
                first, end = lengths.eos_rows(part)
                counted += [(part.unit, r) for r in range(first, end)]
                rows, tokens = touched_rows(lengths, part)
                seen.update({(part.unit, int(r)): int(n) for r, n in zip(rows, tokens,
                                                                           strict=True)})
            assert seen == Counter(owner[i] for a, b in spans for i in range(a, b))
    assert len(counted) == len(set(counted))  # none twice
    delivered_end = slices * plan.per_slice * 3  # the tail is not delivered
    eos_at = [i for i in range(len(owner)) if i + 1 == len(owner) or owner[i + 1] != owner[i]]
    assert sorted(counted) == sorted(owner[i] for i in eos_at if i < delivered_end)


def test_only_the_units_a_span_cuts_are_read():
    doc_lengths = [[2, 2], [5, 5, 5], [1, 1]]  # stream sizes 6, 18, 4: 28 = 9 sequences of 3
    plan = TokenPlan.of([6, 18, 4], slices=1, seq_len=3, seed=0, epoch=0, shuffle=False)
    asked: list[int] = []

    def read(u: int) -> np.ndarray:
        asked.append(u)
        return np.array(doc_lengths[u])

    lengths = RowLengths([2, 3, 2], read)
    got = [lengths.eos_rows(p) for a, b in slice_stream(plan, 0, 0, plan.per_slice)
           for p in unit_parts(plan, a, b)]
    assert got == [(0, 2), (0, 3), (0, 1)] and asked == [2]  # 27 of 28 delivered


def test_a_packed_pass_delivers_its_rows_and_tokens_less_each_distinct_tail() -> None:
    import json

    import pyarrow as pa

    from lakeckpt_tables.audit.views import pass_sizes

    def event(name: str, **detail: Any) -> dict[str, Any]:
        return {"run_id": "r", "event": name, "step": 3,
                "detail": json.dumps({"segment": 0, "epoch": 0, "source_key": "web", **detail})}

    first_tail = event("undelivered", rows=2, tokens=8, ranges=[["f", 0, 5, 7]])
    events = [event("round", rows=100, delivered=98, tokens=1000, delivered_tokens=992,
                    version=4),
              first_tail, first_tail,  # recorded again by a run resumed before it: once
              event("undelivered", rows=1, tokens=5, ranges=[["f", 1, 0, 1]])]  # a re-plan's
    table = pa.Table.from_pylist(events)
    (size,) = pass_sizes(lambda where, columns: table, look_up_sources=False).to_pylist()
    assert (size["source_key"], size["rows"], size["delivered"], size["tokens"],
            size["to_version"]) == ("web", 100, 97, 987, 4)
