"""Where ranks come from: torch.distributed or explicit arguments, never a guess (issue 8 #5)."""

from __future__ import annotations

import pytest
from conftest import Table, flat, loader_for, take

from lakeckpt_tables.errors import ProcessGroupError


def test_torchrun_environment_without_a_process_group_is_a_named_error(
        delta_table: Table, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ProcessGroupError,
                       match=r"WORLD_SIZE=3 \(RANK=1\).*init_process_group\(\)"):
        delta_table.dataset(batch_size=8)


def test_explicit_rank_and_world_size_need_no_process_group(
        delta_table: Table, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    rows = [flat(take(loader_for(delta_table.dataset(batch_size=16, rank=r, world_size=2), 0)))
            for r in range(2)]
    assert sorted(rows[0] + rows[1]) == delta_table.ids.tolist()
    half = delta_table.rows // 2
    assert sorted(map(len, rows)) == [half, delta_table.rows - half]


@pytest.mark.parametrize("value", ["1", "", "0"])
def test_a_world_of_one_in_the_environment_reads_everything(
        delta_table: Table, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("WORLD_SIZE", value)
    dataset = delta_table.dataset(batch_size=64)
    assert (dataset.rank, dataset.world_size) == (0, 1)
    assert sorted(flat(take(loader_for(dataset, 0)))) == delta_table.ids.tolist()
