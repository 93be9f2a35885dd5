"""A restore that raises has committed nothing, whatever failed (issue 32, item 1).

One small run of a LakeDataset (model, optimizer, scheduler, extra) and one of a Mixture are
trained once for the module; each cause then restores into them in this process, and the
ledger's rows and the run's owner must be the same after the failed restore as before. A
restore that succeeds is the control: it adds its ``restore`` event and takes the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from deltalake import WriterProperties, write_deltalake
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset, Mixture
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.errors import (
    CheckpointRestoreError,
    LakeckptError,
    MixtureStateError,
    StateMismatchError,
)
from lakeckpt_tables.ledger import DeltaLedger


@pytest.fixture(autouse=True)
def _no_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKECKPT_REGISTRY", "off")


class Warmup(torch.optim.lr_scheduler.LambdaLR):
    """A user's scheduler that refuses a state saved for another warmup (as many do)."""

    def __init__(self, optimizer: torch.optim.Optimizer, warmup: int) -> None:
        self.warmup = warmup
        super().__init__(optimizer, lambda step: min(1.0, (step + 1) / warmup))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict["warmup"] != self.warmup:
            raise ValueError(f"saved for {state_dict['warmup']} warmup steps, not "
                             f"{self.warmup}")
        super().load_state_dict(state_dict)


@dataclass
class Runs:
    root: Path
    a: str
    b: str


def _table(path: Path, first: int) -> str:
    write_deltalake(str(path), pa.table({"id": np.arange(first, first + 24, dtype=np.int64)}),
                    writer_properties=WriterProperties(max_row_group_size=8))
    return str(path)


def _reader(table: str, **kwargs: Any) -> LakeDataset:
    return LakeDataset(DeltaSource(table), **{"batch_size": 4, "seed": 7, **kwargs})


def _mixture(runs: Runs, seed: int = 1, **weights: float) -> StatefulDataLoader:
    weights = weights or {"a": 0.5, "b": 0.5}
    tables = {"a": runs.a, "b": runs.b, "c": runs.a}
    return StatefulDataLoader(Mixture({k: _reader(tables[k]) for k in weights},
                                      weights=weights, seed=seed), batch_size=None)


def _parts(warmup: int = 5) -> dict[str, Any]:
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return {"model": model, "optimizer": optimizer, "lr_scheduler": Warmup(optimizer, warmup),
            "extra": {"epoch": 0}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Run "plain" (a LakeDataset, every part) and run "mix" (a Mixture), one save each."""
    base = tmp_path_factory.mktemp("refusals")
    runs = Runs(base / "ckpt", _table(base / "a", 0), _table(base / "b", 100))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LAKECKPT_REGISTRY", "off")
        parts = _parts()
        loader = StatefulDataLoader(_reader(runs.a), batch_size=None)
        batches = iter(loader)
        for _ in range(2):
            loss = parts["model"](next(batches)["id"].float()[:, None]).sum()
            loss.backward()
            parts["optimizer"].step()
            parts["lr_scheduler"].step()
        CheckpointManager(runs.root, "plain").save(2, dataloader=loader, **parts)
        mixed = _mixture(runs)
        batches = iter(mixed)
        next(batches), next(batches)
        CheckpointManager(runs.root, "mix").save(2, dataloader=mixed)
    return runs


def _ledger(runs: Runs, run_id: str) -> tuple[int, str | None]:
    """The ledger's rows and the run's owner."""
    ledger = DeltaLedger(str(runs.root / "_ledger"))
    return ledger.to_arrow().num_rows, ledger.owner(run_id)


def _refused(runs: Runs, run_id: str, error: type[LakeckptError], match: str,
             **given: Any) -> None:
    before = _ledger(runs, run_id)
    with pytest.raises(error, match=match):
        CheckpointManager(runs.root, run_id).restore(**given)
    assert _ledger(runs, run_id) == before


CAUSES: dict[str, tuple[str, type[LakeckptError], str, Callable[[Runs], dict[str, Any]]]] = {
    "model of another shape": (
        "plain", CheckpointRestoreError, r"model\.weight: checkpoint \(1, 1\), here \(1, 2\)",
        lambda r: {**_parts(), "model": torch.nn.Linear(2, 1), "optimizer": None,
                   "lr_scheduler": None}),
    "optimizer of another kind": (
        "plain", CheckpointRestoreError, r"missing from the checkpoint: optimizer\.",
        lambda r: {**(p := _parts()), "lr_scheduler": None,
                   "optimizer": torch.optim.Adam(p["model"].parameters())}),
    "scheduler refusing the state": (
        "plain", CheckpointRestoreError,
        r"step 2 .*failed on rank 0 while handing the loaded state.*ValueError: saved for 5 "
        r"warmup steps, not 9.*Nothing was committed", lambda r: _parts(warmup=9)),
    "extra with a key never saved": (
        "plain", CheckpointRestoreError, r"missing from the checkpoint: extra\.lr",
        lambda r: {**_parts(), "extra": {"epoch": 0, "lr": 1.0}}),
    "reader of another seed": (
        "plain", StateMismatchError, r"run plain: checkpoint step 2 cannot be loaded into this "
        r"dataloader: reader state does not match this LakeDataset: seed: state has 7, this "
        r"reader 8\. Nothing was committed",
        lambda r: {**_parts(), "dataloader": StatefulDataLoader(_reader(r.a, seed=8),
                                                                batch_size=None)}),
    "reader of another table": (
        "plain", StateMismatchError, r"run plain: .*table: state is of delta table .*/a \(id",
        lambda r: {**_parts(), "dataloader": StatefulDataLoader(_reader(r.b),
                                                                batch_size=None)}),
    "a Mixture into a lone reader": (
        "mix", StateMismatchError, r"run mix: .*format is 'lakeckpt.mixture/1'",
        lambda r: {"dataloader": StatefulDataLoader(_reader(r.a), batch_size=None)}),
    # (other weights are a recipe change a resume may make: tests/test_mixture_recipe.py)
    "Mixture of another seed": (
        "mix", StateMismatchError, r"run mix: .*mixture state has seed=1, this Mixture seed=2",
        lambda r: {"dataloader": _mixture(r, seed=2)}),
    "Mixture of other sources": (
        "mix", MixtureStateError, r"run mix: .*names source\(s\) \['b'\] that this Mixture lacks",
        lambda r: {"dataloader": _mixture(r, a=0.5, c=0.5)}),
}


@pytest.mark.parametrize("cause", list(CAUSES))
def test_a_restore_that_raises_commits_no_event_and_takes_no_ownership(
        runs: Runs, cause: str) -> None:
    run_id, error, match, given = CAUSES[cause]
    _refused(runs, run_id, error, match, **given(runs))


def test_a_restore_that_fits_commits_its_event_and_takes_the_run(runs: Runs) -> None:
    """The control: the same counting sees a restore that lands."""
    for run_id, given in (("plain", {**_parts(), "dataloader": StatefulDataLoader(
            _reader(runs.a), batch_size=None)}), ("mix", {"dataloader": _mixture(runs)})):
        rows, _ = _ledger(runs, run_id)
        manager = CheckpointManager(runs.root, run_id)
        assert manager.restore(**given) == 2
        assert _ledger(runs, run_id) == (rows + 1, manager.owner)
