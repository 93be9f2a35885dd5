"""CheckpointManager over a packed LakeDataset and over a Mixture (issue 21): a resume after
any checkpoint delivers the uninterrupted run's tokens, and the ledger's consumption records
count every row once (a packed row by its eos; a Mixture's rows named by source key)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from lakeckpt_tables import LakeDataset, Mixture
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.ledger import DeltaLedger
from tests.conftest import Table, loader_for

EOS = -1
L = 8
B = 2


def packed(table: Table, **kwargs: Any) -> LakeDataset:
    return LakeDataset(table.make_source(), pack_tokens="tokens", seq_len=L, eos_id=EOS,
                       batch_size=B, seed=5, **kwargs)


def consumed_rows(ledger: DeltaLedger, run: str) -> Counter[tuple[Any, ...]]:
    """How often each (source key, epoch, file, row group, row) is consumed in the ledger."""
    seen: Counter[tuple[Any, ...]] = Counter()
    for rec in ledger.consumption(run_id=run).to_pylist():
        assert rec["rows"] == rec["row_end"] - rec["row_start"]
        for row in range(rec["row_start"], rec["row_end"]):
            seen[(rec.get("source_key"), rec["epoch"], rec["file"], rec["row_group"], row)] += 1
    return seen


@pytest.mark.parametrize("workers", [0, 2])
def test_a_packed_run_resumed_from_its_checkpoint_delivers_the_uninterrupted_tokens(
        delta_table: Table, tmp_path: Path, workers: int) -> None:
    whole = [b["input_ids"] for b in loader_for(packed(delta_table, epochs=2), workers)]
    manager = CheckpointManager(tmp_path, "p")
    loader = loader_for(packed(delta_table, epochs=2), workers)
    got: list[torch.Tensor] = []
    for step, batch in enumerate(loader, 1):
        got.append(batch["input_ids"])
        if step % 5 == 0:
            manager.save(step, dataloader=loader)
        if step == 17:
            break  # steps 16 and 17 are lost with the "crash"
    resumed = loader_for(packed(delta_table, epochs=2), workers)
    again = CheckpointManager(tmp_path, "p")
    step = again.restore(dataloader=resumed)
    assert step == 15
    got = got[:step]
    for batch in resumed:
        got.append(batch["input_ids"])
        step += 1
        if step % 5 == 0:
            again.save(step, dataloader=resumed)
    again.save(step + 1, dataloader=resumed)
    assert torch.equal(torch.cat(got), torch.cat(whole))
    seen = consumed_rows(DeltaLedger(str(tmp_path / "_ledger")), "p")
    assert max(seen.values()) == 1
    # every delivered eos is one row consumed: rows of the epochs' tails are not
    assert sum(seen.values()) == int((torch.cat(whole) == EOS).sum())


def mixture(delta: Table, iceberg: Table) -> Mixture:
    return Mixture({"web": packed(delta), "code": packed(iceberg)},
                   weights={"web": 0.7, "code": 0.3}, seed=1)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mixture_resumed_from_its_checkpoint_delivers_the_uninterrupted_schedule(
        delta_table: Table, iceberg_table: Table, tmp_path: Path, workers: int) -> None:
    def key(batch: dict[str, Any]) -> tuple[str, tuple[int, ...]]:
        return batch["source"], tuple(batch["input_ids"].ravel().tolist())

    whole = [key(b) for b in loader_for(mixture(delta_table, iceberg_table), workers)]
    manager = CheckpointManager(tmp_path, "m")
    loader = loader_for(mixture(delta_table, iceberg_table), workers)
    got = []
    for step, batch in enumerate(loader, 1):
        got.append(key(batch))
        if step % 4 == 0:
            manager.save(step, dataloader=loader)
        if step == 10:
            break
    resumed = loader_for(mixture(delta_table, iceberg_table), workers)
    again = CheckpointManager(tmp_path, "m")
    step = again.restore(dataloader=resumed)
    assert step == 8
    got = got[:step]
    for batch in resumed:
        got.append(key(batch))
        step += 1
        if step % 4 == 0:
            again.save(step, dataloader=resumed)
    again.save(step + 1, dataloader=resumed)
    assert got == whole
    assert {s for s, _ in whole} == {"web", "code"}
    seen = consumed_rows(DeltaLedger(str(tmp_path / "_ledger")), "m")
    assert max(seen.values()) == 1
    for name in ("web", "code"):
        eos = sum(ids.count(EOS) for s, ids in whole if s == name)
        assert sum(n for k, n in seen.items() if k[0] == name) == eos


def _mixture_run(delta: Table, iceberg: Table, root: Path) -> Counter[str]:
    """An unpacked mixture read to its end (the first source to run out), checkpointed."""
    sources = {"web": delta.dataset(batch_size=23, seed=2),
               "code": iceberg.dataset(batch_size=23, seed=2)}
    loader = loader_for(Mixture(sources, weights={"web": 0.5, "code": 0.5}, seed=3), 0)
    manager = CheckpointManager(root, "v")
    rows: Counter[str] = Counter()
    step = 0
    for step, batch in enumerate(loader, 1):
        rows[batch["source"]] += len(batch["id"])
        if step % 3 == 0:
            manager.save(step, dataloader=loader)
    manager.save(step + 1, dataloader=loader)
    return rows


def test_verify_and_progress_check_every_source_of_a_mixture_by_its_key(
        delta_table: Table, iceberg_table: Table, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow.compute as pc
    from deltalake import DeltaTable, write_deltalake

    from lakeckpt_tables.audit import connect, verify
    from lakeckpt_tables.audit import rows as audit_rows
    from lakeckpt_tables.cli import main

    rows = _mixture_run(delta_table, iceberg_table, tmp_path)
    (verdict,) = verify(str(tmp_path), source_catalog=iceberg_table.extra["catalog"])
    assert verdict.violations == []
    assert verdict.rows == sum(rows.values())
    assert verdict.finished_passes == [(0, 0)]  # the source that ran out
    uri = str(tmp_path / "_ledger")
    consumption = DeltaTable(uri).to_pyarrow_dataset().to_table().filter(
        pc.field("record") == "consumption")
    assert set(consumption["source_key"].to_pylist()) == {"web", "code"}
    for key in ("web", "code"):
        assert sum(r["rows"] for r in consumption.to_pylist() if r["source_key"] == key) \
            == rows[key]
    con = connect(str(tmp_path), source_catalog=iceberg_table.extra["catalog"])
    progress = con.sql("SELECT source_key, epoch, rows_consumed, rows_in_pass FROM progress "
                       "ORDER BY source_key").fetchall()
    assert [(k, e, n) for k, e, n, _ in progress] == [("code", 0, rows["code"]),
                                                      ("web", 0, rows["web"])]
    # the source that ran out is done: its rows_in_pass is from its own round event
    assert any(n == total for _, _, n, total in progress)
    assert main(["progress", str(tmp_path)]) == 0  # the command line shows both sources
    shown = capsys.readouterr().out
    assert "source_key" in shown and "web" in shown and "code" in shown
    last = DeltaLedger(str(tmp_path / "_ledger")).checkpoints("v")[-1]
    replayed = audit_rows(str(tmp_path), checkpoint=last.checkpoint_id, cumulative=True,
                          source_catalog=iceberg_table.extra["catalog"])
    assert Counter(replayed["source_key"].to_pylist()) == rows  # each source's rows, by key
    copy = consumption.filter(pc.field("source_key") == "code").slice(0, 1)
    write_deltalake(uri, copy, mode="append")
    (verdict,) = verify(str(tmp_path), source_catalog=iceberg_table.extra["catalog"])
    assert verdict.violations and verdict.violations[0].startswith("overlap: run v source 'code'")


def test_a_loader_over_another_dataset_is_refused_naming_what_it_reads(tmp_path: Path) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lakeckpt_tables.errors import CheckpointError

    loader = StatefulDataLoader(list(range(4)), batch_size=None)
    with pytest.raises(CheckpointError, match=r"nothing was committed: .*LakeDataset or a "
                       r"Mixture, got a StatefulDataLoader over a list: build it as "):
        CheckpointManager(tmp_path, "x").save(1, dataloader=loader)


def test_a_cycling_mixture_is_refused_by_name_and_nothing_is_committed(
        delta_table: Table, iceberg_table: Table, tmp_path: Path) -> None:
    from lakeckpt_tables.errors import CheckpointError

    sources = {"web": delta_table.dataset(batch_size=50), "code": iceberg_table.dataset()}
    loader = loader_for(Mixture(sources, weights={"web": 1, "code": 1}, on_exhausted="cycle"),
                        0)
    next(iter(loader))
    manager = CheckpointManager(tmp_path, "c")
    with pytest.raises(CheckpointError, match=r"on_exhausted='cycle' .* epochs=N"):
        manager.save(1, dataloader=loader)
    assert manager.checkpoints() == []
