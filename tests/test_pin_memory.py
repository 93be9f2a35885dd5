"""Every batch type survives ``pin_memory=True`` and moves to a device without blocking:
tensors, 2-D list tensors, ``Ragged``, strings and Arrow batches (issue 12 item 6).

This machine has no accelerator: torch then turns ``pin_memory=True`` off with a warning, so
the loader tests prove that the option is accepted and changes no batch, and ``to_device`` is
proved on the CPU device. The pinned round trip runs where an accelerator exists."""

from __future__ import annotations

import warnings
from typing import Any

import pyarrow as pa
import pytest
import torch
from conftest import Table, same_batch
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import Ragged
from lakeckpt_tables.reader.convert import to_device

ALL = ["id", "x", "vec", "tokens", "name"]


def _loaded(table: Table, workers: int, pin: bool, **kwargs: Any) -> list[Any]:
    dataset = table.dataset(columns=ALL, batch_size=24, seed=3, **kwargs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*pin_memory.*")
        return list(StatefulDataLoader(dataset, batch_size=None, num_workers=workers,
                                       pin_memory=pin))


@pytest.mark.parametrize("workers", [0, 2])
def test_pin_memory_changes_no_batch_of_any_column_type(delta_table: Table, workers: int) -> None:
    plain = _loaded(delta_table, workers, pin=False)
    pinned = _loaded(delta_table, workers, pin=True)
    assert len(pinned) == len(plain)
    assert all(same_batch(a, b) for a, b in zip(plain, pinned, strict=True))
    kinds = {type(b["tokens"]) for b in pinned}
    assert Ragged in kinds  # the ragged path was exercised, and stayed Ragged
    assert sorted(i for b in pinned for i in b["id"].tolist()) == delta_table.ids.tolist()


def test_pin_memory_takes_arrow_output_as_it_is(delta_table: Table) -> None:
    plain = _loaded(delta_table, 0, pin=False, output="arrow")
    pinned = _loaded(delta_table, 0, pin=True, output="arrow")
    assert all(isinstance(b, pa.RecordBatch) for b in pinned)
    assert all(same_batch(a, b) for a, b in zip(plain, pinned, strict=True))


def test_to_device_moves_every_batch_type_and_keeps_its_shape(delta_table: Table) -> None:
    for batch in _loaded(delta_table, 0, pin=False):
        moved = to_device(batch, "cpu", non_blocking=True)
        assert same_batch(moved, batch)
        assert isinstance(moved["tokens"], (Ragged, torch.Tensor))
    nested = {"pair": (torch.ones(2), Ragged(torch.arange(3), torch.tensor([0, 1, 3]))),
              "names": ["a", "b"], "n": 2}
    moved = to_device(nested, torch.device("cpu"))
    assert same_batch(moved, nested) and isinstance(moved["pair"][1], Ragged)


def test_a_ragged_moves_both_its_tensors() -> None:
    ragged = Ragged(torch.arange(5, dtype=torch.int32), torch.tensor([0, 2, 5]))
    moved = ragged.to(torch.float64)
    assert isinstance(moved, Ragged)
    assert moved.values.dtype == moved.offsets.dtype == torch.float64
    assert moved.values.tolist() == [0, 1, 2, 3, 4] and moved.offsets.tolist() == [0, 2, 5]


@pytest.mark.skipif(not torch.accelerator.is_available(), reason="needs an accelerator")
def test_a_pinned_ragged_stays_ragged_with_both_tensors_pinned() -> None:
    from torch.utils.data._utils.pin_memory import pin_memory

    batch = {"t": Ragged(torch.arange(5), torch.tensor([0, 2, 5])), "s": ["x"]}
    pinned = pin_memory(batch)
    assert isinstance(pinned["t"], Ragged) and pinned["s"] == ["x"]
    assert pinned["t"].values.is_pinned() and pinned["t"].offsets.is_pinned()
    device = torch.accelerator.current_accelerator()
    assert same_batch(to_device(pinned, "cpu"), batch) and device is not None
