"""The packed accounting (NOTE [ packed accounting ] in ``checkpoint/consumption.py``) across
an elastic re-plan, 3 ranks then 2: rows are counted once each by their eos, the rows the
lockstep tails hold are ``undelivered`` events, and the records' tokens are those delivered."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

from lakeckpt_tables import LakeDataset
from lakeckpt_tables.checkpoint.consumption import consumed_between, segment_events
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
