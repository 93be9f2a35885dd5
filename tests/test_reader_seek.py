"""Resume is a seek, not a replay: a resumed reader opens only the row groups still needed.

Proved on the real read path: a LakeDataset subclass records every unit its row reader decodes,
and data files fully consumed before the resume point are deleted before resuming.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from conftest import Table, file_ranges, flat, loader_for, plan_for, take, write_delta
from hypothesis import given, settings
from hypothesis import strategies as st

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.reader import merge_states, states_from_loader
from lakeckpt_tables.types import Unit


class CountingDataset(LakeDataset):
    """Records the canonical index of every unit (row group) it decodes."""

    reads: list[int]

    def _use(self, config: Any, rounds: Any = None) -> None:
        reader = getattr(self, "_reader", None)
        super()._use(config, rounds)
        self.__dict__.setdefault("reads", [])
        if self._reader is not reader:  # a new snapshot's reader: count its decodes
            row_reader = self._reader.row_reader
            read = row_reader.read

            def counted(unit: Unit, columns: Any) -> pa.Table:
                self.reads.append(self.snapshot.units.index(unit))
                return read(unit, columns)

            row_reader.read = counted  # type: ignore[method-assign]


def counting(table: Table, **kwargs: Any) -> CountingDataset:
    return CountingDataset(table.make_source(), columns=["id"], **kwargs)


def needed_units(table: Table, args: dict[str, Any], position: int) -> list[int]:
    """Units slice 0 still needs after ``position`` rows, in read order: a begun shuffled
    window needs all its units (to permute them), a begun unshuffled one only the units from
    the position on; then every later window."""
    plan = plan_for(table, batch_size=args["batch_size"], seed=args.get("seed", 0),
                    shuffle=args.get("shuffle", True),
                    shuffle_window=args.get("shuffle_window", 4))
    return [u for piece in plan.remaining(0, position) for u, _, _ in plan.locate(piece.spans)]


@settings(deadline=None, max_examples=15)
@given(batch_size=st.integers(1, 60), window=st.integers(1, 4), shuffle=st.booleans(),
       fraction=st.floats(0.0, 1.0))
def test_a_resumed_reader_reads_only_the_row_groups_still_needed(
    source: Table, batch_size: int, window: int, shuffle: bool, fraction: float
) -> None:
    args = {"batch_size": batch_size, "shuffle_window": window, "shuffle": shuffle, "seed": 2}
    full = counting(source, **args)
    everything = take(loader_for(full, 0))
    assert sorted(full.reads) == list(range(len(full.snapshot.units))), "each unit once"

    steps = int(fraction * len(everything))
    first = counting(source, **args)
    loader = loader_for(first, 0)
    head = take(loader, steps)
    resumed = counting(source, **args)
    resumed.load_state_dict(json.loads(json.dumps(loader.state_dict())))
    rest = take(loader_for(resumed, 0))
    assert head + rest == everything
    # which row groups, each as often as needed (read-ahead threads may read them out of order)
    assert sorted(resumed.reads) == sorted(needed_units(source, args, len(flat(head))))


def test_resuming_at_90_percent_reads_only_the_row_groups_of_the_last_tenth(
        source: Table) -> None:
    args = {"batch_size": 10, "shuffle_window": 1, "seed": 4}
    loader = loader_for(counting(source, **args), 0)
    batches = take(loader, int(0.9 * source.rows / 10))
    resumed = counting(source, **args)
    resumed.load_state_dict(loader.state_dict())
    rest = take(loader_for(resumed, 0))
    units = len(resumed.snapshot.units)
    assert len(flat(batches)) + len(flat(rest)) == source.rows
    assert sorted(resumed.reads) == sorted(needed_units(source, args, len(flat(batches))))
    # The last 47 of 387 rows and the begun row group: 5 of 25 row groups at most, even when
    # the five smallest come last (Iceberg's file names, and so the unit order, vary per table).
    assert len(resumed.reads) <= units // 5


@pytest.mark.parametrize(("workers", "steps"), [(0, 14), (2, 22)])
def test_a_resume_works_after_the_files_already_read_are_deleted(
    tmp_path: Path, workers: int, steps: int
) -> None:
    uri = str(tmp_path / "rows")
    write_delta(uri, file_ranges())
    args: dict[str, Any] = {"columns": ["id"], "batch_size": 16, "shuffle": False}
    everything = take(loader_for(LakeDataset(DeltaSource(uri), **args), workers))
    loader = loader_for(LakeDataset(DeltaSource(uri), **args), workers)
    head = take(loader, steps)
    state = merge_states(states_from_loader(loader.state_dict()))

    # Unshuffled, slice g delivered base rows [bounds[g], bounds[g] + position): a unit
    # inside those is consumed, and a file all of whose units are consumed is not needed.
    resumed = LakeDataset(DeltaSource(uri), **args)
    resumed.load_state_dict(state.to_dict())
    units = resumed.snapshot.units
    bounds = plan_for(Table("delta", lambda: DeltaSource(uri), np.arange(0)), batch_size=16,
                      shuffle=False, workers=max(workers, 1)).bounds
    done = [(bounds[g], bounds[g] + position) for g, (_, position) in
            enumerate(state.positions())]
    ends = np.cumsum([u.rows for u in units])
    needed = set()
    for unit, end in zip(units, ends, strict=True):
        start = end - unit.rows
        if not any(a <= start and end <= b for a, b in done):
            needed.add(unit.path)
    gone = {u.path for u in units} - needed
    assert len(gone) >= 1
    for path in gone:
        os.remove(path)
    assert head + take(loader_for(resumed, workers)) == everything
