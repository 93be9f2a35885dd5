"""Batches skipped after a restore (NOTE [ skipped batches ] in
lakeckpt_tables/checkpoint/skip.py): a run restored from an earlier checkpoint skips the next
batches; they are the uninterrupted run's next batches, never trained, recorded in the ledger
as skipped (which rows, why, by whom), shown apart by the audit and counted by ``verify`` as
skipped, not missing. Plain, packed and mixed readers, 0 and 2 DataLoader workers, 2 ranks."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from lakeckpt_tables import DeltaSource, LakeDataset, Mixture
from lakeckpt_tables.audit import rows as audit_rows
from lakeckpt_tables.audit import verify
from lakeckpt_tables.audit.replay import skipped_rows
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.errors import CheckpointError
from lakeckpt_tables.ledger import DeltaLedger
from tests.conftest import Table, file_ranges, loader_for, write_delta

EOS = -1


@pytest.fixture(scope="module")
def code_table(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = tmp_path_factory.mktemp("code") / "code"
    write_delta(uri, file_ranges((70, 51), 10_000))
    return str(uri)


def reader(kind: str, delta: str, code: str, rank: int = 0, world: int = 1) -> Any:
    at = {"rank": rank, "world_size": world}
    if kind == "packed":
        return LakeDataset(DeltaSource(delta), pack_tokens="tokens", seq_len=8, eos_id=EOS,
                           batch_size=2, seed=5, **at)
    web = LakeDataset(DeltaSource(delta), columns=["id"], batch_size=16, seed=3, **at)
    if kind == "plain":
        return web
    other = LakeDataset(DeltaSource(code), columns=["id"], batch_size=16, seed=3, **at)
    return Mixture({"web": web, "code": other}, weights={"web": 0.7, "code": 0.3}, seed=1)


def payload(batch: dict[str, Any]) -> Any:
    if "input_ids" in batch:
        return batch["input_ids"].tolist()
    return [batch.get("source", "web"), batch["id"].tolist()]


def rows_of(batches: list[Any], kind: str) -> int:
    """Rows the batches consumed (a packed reader's: documents, counted by their eos)."""
    if kind == "packed":
        return sum(seq.count(EOS) for b in batches for seq in b)
    return sum(len(ids) for _, ids in batches)


def skipped_run(kind: str, delta: str, code: str, root: Path, workers: int,
                ) -> tuple[list[Any], list[Any], int]:
    """Train to step 10 saving every 4, "crash", restore step 8, skip 3 batches, train to the
    end: (what trained the model, the skipped batches as the uninterrupted run has them,
    the first step saved after the skip)."""
    whole = [payload(b) for b in loader_for(reader(kind, delta, code), workers)]
    manager = CheckpointManager(root, kind)
    loader = loader_for(reader(kind, delta, code), workers)
    trained = []
    for step, batch in enumerate(loader, 1):
        trained.append(payload(batch))
        if step % 4 == 0:
            manager.save(step, dataloader=loader)
        if step == 10:
            break
    del loader
    resumed = loader_for(reader(kind, delta, code), workers)
    again = CheckpointManager(root, kind)
    restored = again.restore(dataloader=resumed)
    assert restored == 8
    assert again.skip(resumed, batches=3, reason="loss spike at step 10", by="ops") == 3
    del trained[restored:]
    step = restored
    for step, batch in enumerate(resumed, restored + 1):
        trained.append(payload(batch))
        if step % 4 == 0:
            again.save(step, dataloader=resumed)
    again.save(step + 1, dataloader=resumed)
    assert trained == whole[:8] + whole[11:]  # the skipped batches are the next three
    return trained, whole[8:11], 12


def skip_details(root: Path, run: str) -> list[tuple[int, dict[str, Any]]]:
    from lakeckpt_tables.audit import connect

    rows = connect(str(root)).sql(
        f"SELECT step, detail FROM events WHERE run_id = '{run}' AND event = 'skipped'"
    ).fetchall()
    return [(step, json.loads(detail)) for step, detail in rows]


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("kind", "workers"), [("plain", 0), ("packed", 2), ("mixture", 0),
                                               ("mixture", 2)])
def test_skipped_batches_are_consumed_not_trained_and_recorded(
        delta_table: Table, code_table: str, tmp_path: Path, kind: str, workers: int) -> None:
    trained, skipped, first = skipped_run(kind, delta_table.location, code_table, tmp_path,
                                          workers)
    ((at, detail),) = skip_details(tmp_path, kind)
    assert at == first  # committed with the first checkpoint trained after the skip
    assert (detail["reason"], detail["by"], detail["batches"]) == ("loss spike at step 10",
                                                                   "ops", 3)
    assert detail["after_step"] == 8
    assert detail["rows"] == rows_of(skipped, kind)
    if kind == "packed":
        assert detail["tokens"] == sum(len(seq) for b in skipped for seq in b)
    ledger = DeltaLedger(str(tmp_path / "_ledger"))
    consumed = sum(r["rows"] for r in ledger.consumption(run_id=kind).to_pylist())
    assert consumed == rows_of(trained, kind)  # trained rows only
    (verdict,) = verify(str(tmp_path))
    assert verdict.violations == []
    assert (verdict.rows, verdict.skipped) == (rows_of(trained, kind), rows_of(skipped, kind))
    if kind == "plain":
        assert verdict.finished_passes == [(0, 0)]  # every row trained or skipped, once


def ids_of_rows(table: Any) -> list[int]:
    """The ``id`` of each audited (file, row group, row)."""
    cache: dict[tuple[str, int], list[int]] = {}
    out = []
    for file, group, row in zip(table["file"].to_pylist(), table["row_group"].to_pylist(),
                                table["row"].to_pylist(), strict=True):
        if (file, group) not in cache:
            cache[(file, group)] = pq.ParquetFile(file).read_row_group(group, ["id"])[
                "id"].to_pylist()
        out.append(cache[(file, group)][row])
    return out


@pytest.mark.timeout(60)
def test_the_audit_shows_skipped_rows_apart_from_trained_ones(
        delta_table: Table, code_table: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from lakeckpt_tables.cli import main

    trained, skipped, _ = skipped_run("plain", delta_table.location, code_table, tmp_path, 0)
    (after_skip,) = [r for r in DeltaLedger(str(tmp_path / "_ledger")).checkpoints("plain")
                     if r.step == 12]
    ids = ids_of_rows(audit_rows(str(tmp_path), checkpoint=after_skip.checkpoint_id))
    assert sorted(ids) == sorted(i for _, b in trained[8:12] for i in b)  # steps 9..12
    gone = ids_of_rows(skipped_rows(str(tmp_path), checkpoint=after_skip.checkpoint_id))
    assert gone == [i for _, b in skipped for i in b]  # in the order they were read
    assert not set(gone) & {i for _, b in trained for i in b}
    assert main(["audit", str(tmp_path), "--checkpoint", after_skip.checkpoint_id]) == 0
    out = capsys.readouterr().out
    assert "NOT trained on" in out and "loss spike at step 10" in out and "ops" in out


def test_a_skip_without_a_count_or_reason_is_refused(delta_table: Table, tmp_path: Path
                                                     ) -> None:
    manager = CheckpointManager(tmp_path, "bad")
    loader = loader_for(reader("plain", delta_table.location, ""), 0)
    with pytest.raises(CheckpointError, match="batches=N or steps=N"):
        manager.skip(loader, reason="spike")
    with pytest.raises(CheckpointError, match="positive number of batches"):
        manager.skip(loader, batches=0, reason="spike")
    with pytest.raises(CheckpointError, match="say why"):
        manager.skip(loader, steps=2, batches_per_step=2, reason=" ")
    assert manager.skip(loader, steps=2, batches_per_step=2, reason="spike") == 4
    assert Counter(payload(b)[0] for b in loader)  # the loader goes on after the skip


# ------------------------------------------------------------------- two ranks in real processes


def _job(spec: dict[str, Any]) -> None:
    """One rank: restore, skip ``skip`` batches if asked, train (log every batch), save every 4
    steps; stop after step ``until`` without saving (the "crash"), else save at the end."""
    import multiprocessing
    from datetime import timedelta

    import torch.distributed as dist

    multiprocessing.set_start_method("fork", force=True)
    rank, world = spec["rank"], spec["world"]
    dist.init_process_group("gloo", init_method=spec["store"], rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    loader = loader_for(reader(spec["kind"], spec["delta"], spec["code"], rank, world),
                        spec["workers"])
    manager = CheckpointManager(spec["root"], "ranks")
    step = manager.restore(dataloader=loader) or 0
    if spec.get("skip"):
        manager.skip(loader, batches=spec["skip"], reason="loss spike", by=f"rank {rank}")
    with open(Path(spec["out"]) / f"rank{rank}.json", "w") as log:
        trained = []
        for batch in loader:
            step += 1
            trained.append(payload(batch))
            if step % 4 == 0:
                manager.save(step, dataloader=loader)
            if step == spec.get("until"):
                break
        else:
            manager.save(step + 1, dataloader=loader)
        json.dump(trained, log)
    dist.destroy_process_group()


def _launch(spec: dict[str, Any], out: Path) -> list[list[Any]]:
    """Run ``spec``'s job on 2 ranks (processes forked from a server that imported the
    library once); what each rank trained."""
    import multiprocessing

    server = multiprocessing.get_context("forkserver")
    server.set_forkserver_preload(["torch", "torch.distributed.checkpoint", "deltalake",
                                   "torchdata.stateful_dataloader", "lakeckpt_tables.checkpoint",
                                   "lakeckpt_tables.mixture", __name__])
    out.mkdir(parents=True)
    ranks = [server.Process(target=_job, args=({**spec, "rank": r, "world": 2, "out": str(out),
                                                  "store": f"file://{out}/store"},))
             for r in range(2)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(60)
        if p.exitcode is None:
            p.kill()
    assert [p.exitcode for p in ranks] == [0, 0]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.timeout(120)
def test_every_rank_skips_the_same_steps(delta_table: Table, code_table: str,
                                         tmp_path: Path) -> None:
    spec = {"kind": "mixture", "delta": delta_table.location, "code": code_table,
            "root": str(tmp_path), "workers": 0}
    whole = [[payload(b) for b in reader("mixture", delta_table.location, code_table, r, 2)]
             for r in range(2)]
    first = _launch({**spec, "until": 10}, tmp_path / "job1")
    second = _launch({**spec, "skip": 3}, tmp_path / "job2")  # restores step 8
    for r in range(2):
        assert first[r][:8] + second[r] == whole[r][:8] + whole[r][11:]
    skipped = [b for r in range(2) for b in whole[r][8:11]]
    assert [s for s, _ in whole[0][8:11]] == [s for s, _ in whole[1][8:11]]  # lockstep
    ((_, detail),) = skip_details(tmp_path, "ranks")
    assert detail["rows"] == rows_of(skipped, "mixture") and detail["by"] == "rank 0"
    (verdict,) = verify(str(tmp_path))
    assert verdict.violations == [] and verdict.skipped == rows_of(skipped, "mixture")
    trained = [b for r in range(2) for b in first[r][:8] + second[r]]
    assert verdict.rows == rows_of(trained, "mixture")


@pytest.mark.timeout(60)
def test_a_rewind_is_a_branch_that_skips_and_changes_its_weights_recorded(
        delta_table: Table, code_table: str, tmp_path: Path) -> None:
    """The loss-spike restart from an older checkpoint: a new run branched from it, with other
    weights, skipping 3 batches; both changes recorded against the parent's checkpoint."""
    def mix(weights: dict[str, float]) -> Any:
        web = LakeDataset(DeltaSource(delta_table.location), columns=["id"], batch_size=16,
                          seed=3)
        code = LakeDataset(DeltaSource(code_table), columns=["id"], batch_size=16, seed=3)
        return Mixture({"web": web, "code": code}, weights=weights, seed=1)

    parent = CheckpointManager(tmp_path, "spiked")
    loader = loader_for(mix({"web": 0.7, "code": 0.3}), 0)
    trained = []
    for step, batch in enumerate(loader, 1):
        trained.append(payload(batch))
        if step % 4 == 0:
            parent.save(step, dataloader=loader)
        if step == 12:
            break
    branch = CheckpointManager(tmp_path, "rewound")
    resumed = loader_for(mix({"web": 0.5, "code": 0.5}), 0)
    assert branch.restore(dataloader=resumed, from_run="spiked", step=4) == 4
    assert branch.skip(resumed, batches=3, reason="loss spike at step 12") == 3
    del trained[4:]
    trained += [payload(batch) for batch in resumed]
    branch.save(4 + len(trained), dataloader=resumed)
    ((_, skip),) = skip_details(tmp_path, "rewound")
    assert (skip["after_step"], skip["batches"]) == (4, 3)
    from lakeckpt_tables.audit import connect

    ((detail,),) = connect(str(tmp_path)).sql(
        "SELECT detail FROM events WHERE run_id = 'rewound' AND event = 'mixture_weights'"
    ).fetchall()
    change = json.loads(detail)
    assert (change["step"], change["draw"]) == (4, 4)
    assert change["new"] == {"code": 0.5, "web": 0.5}
    (verdict,) = verify(str(tmp_path), run="rewound")
    assert verdict.violations == [] and verdict.skipped == skip["rows"] > 0
    assert verdict.rows == rows_of(trained, "mixture")  # the parent's 4 steps, the branch's
