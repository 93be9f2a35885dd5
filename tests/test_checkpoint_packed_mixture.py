"""CheckpointManager over a packed LakeDataset and over a Mixture (issue 21): a resume after
any checkpoint delivers the uninterrupted run's tokens, and the ledger's consumption records
count every row once (a packed row by its eos; a Mixture's rows named by source key)."""

from __future__ import annotations

import itertools
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


@pytest.mark.timeout(120)
def test_a_mixture_saved_by_two_workers_resumes_on_none_with_each_token_once(
        delta_table: Table, iceberg_table: Table, tmp_path: Path) -> None:
    """Another DataLoader worker count: the schedule goes on from the first draw no worker
    delivered, each source re-plans its rows, and verify proves every source exactly once."""
    from lakeckpt_tables.audit import verify

    manager = CheckpointManager(tmp_path, "w")
    loader = loader_for(mixture(delta_table, iceberg_table), 2)
    trained: list[tuple[str, list[int]]] = []
    for step, batch in enumerate(loader, 1):
        trained.append((batch["source"], batch["input_ids"].ravel().tolist()))
        if step == 6:
            manager.save(step, dataloader=loader)
            break
    resumed = mixture(delta_table, iceberg_table)
    again = CheckpointManager(tmp_path, "w")
    loader = loader_for(resumed, 0)
    assert again.restore(dataloader=loader) == 6
    for batch in loader:
        trained.append((batch["source"], batch["input_ids"].ravel().tolist()))
    last = again.save(len(trained) + 1, dataloader=loader)
    # the record names each source's table and version (issue 32, item 7), also as read back
    for record in (last, again.checkpoints()[-1]):
        assert record.source is None and set(record.sources) == {"web", "code"}
        for key, at in record.sources.items():
            snapshot = resumed.sources[key].snapshot
            assert (at.table, at.version) == (snapshot.identity, snapshot.version)
    assert {at.table.format for at in last.sources.values()} == {"delta", "iceberg"}
    names = [s for s, _ in trained]
    assert names[6:16] == resumed.source_of(torch.arange(6, 16).numpy())  # the schedule goes on
    seen = consumed_rows(DeltaLedger(str(tmp_path / "_ledger")), "w")
    assert max(seen.values()) == 1
    for name in ("web", "code"):
        eos = sum(ids.count(EOS) for s, ids in trained if s == name)
        assert sum(n for k, n in seen.items() if k[0] == name) == eos
    (verdict,) = verify(str(tmp_path), source_catalog=iceberg_table.extra["catalog"])
    assert verdict.violations == []


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
    assert verdict.source_passes == {"code": [(0, 0)], "web": [(0, 0)]}  # named by source
    last = DeltaLedger(str(tmp_path / "_ledger")).checkpoints("v")[-1]
    replayed = audit_rows(str(tmp_path), checkpoint=last.checkpoint_id, cumulative=True,
                          source_catalog=iceberg_table.extra["catalog"])
    assert Counter(replayed["source_key"].to_pylist()) == rows  # each source's rows, by key
    copy = consumption.filter(pc.field("source_key") == "code").slice(0, 1)
    write_deltalake(uri, copy, mode="append")
    (verdict,) = verify(str(tmp_path), source_catalog=iceberg_table.extra["catalog"])
    assert verdict.violations and verdict.violations[0].startswith("overlap: run v source 'code'")


def test_runs_progress_and_verify_tell_one_story_of_a_mixture_that_stopped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 32 item 5: on_exhausted='stop' ended the mixture when 'a' ran out: the run is
    finished, 'a' done, 'b' stopped (not running with an ETA, nor stale later), and verify
    names each source's passes."""
    import numpy as np
    import pyarrow as pa
    from deltalake import WriterProperties, write_deltalake

    from lakeckpt_tables import DeltaSource
    from lakeckpt_tables.audit import connect
    from lakeckpt_tables.cli import main

    for name, first, rows in (("a", 0, 16), ("b", 100, 100)):
        write_deltalake(str(tmp_path / name), pa.table({"id": np.arange(first, first + rows)}),
                        writer_properties=WriterProperties(max_row_group_size=8))
    mixture = Mixture({k: LakeDataset(DeltaSource(str(tmp_path / k)), batch_size=4, seed=1)
                       for k in ("a", "b")}, weights={"a": 0.5, "b": 0.5}, seed=1)
    loader = loader_for(mixture, 0)
    manager = CheckpointManager(tmp_path / "ckpt", "m")
    step = 0
    for step, _ in enumerate(loader, 1):
        if step % 3 == 0:
            manager.save(step, dataloader=loader)
    manager.save(step + 1, dataloader=loader)
    ended = [e for e in DeltaLedger(str(tmp_path / "ckpt" / "_ledger")).events("m",
                                                                                "mixture_ended")]
    assert [e.detail for e in ended] == [{"on_exhausted": "stop"}]
    # however long ago its last commit, the run is finished, not stale
    con = connect(str(tmp_path / "ckpt"))
    con.sql("SET VARIABLE lakeckpt_stale_factor = 0")
    con.sql("SET VARIABLE lakeckpt_stale_min_s = 0")
    assert con.sql("SELECT state, passes, passes_done FROM runs").fetchall() == [
        ("finished", 2, 1)]
    assert con.sql("SELECT source_key, state, percent, eta_s FROM progress ORDER BY "
                   "source_key").fetchall() == [("a", "done", 100.0, 0.0),
                                               ("b", "stopped", 16.0, None)]
    assert main(["verify", str(tmp_path / "ckpt"), "--output", "csv"]) == 0
    assert "a: segment 0 epoch 0; b: none" in capsys.readouterr().out


def test_a_loader_over_another_dataset_is_refused_naming_what_it_reads(tmp_path: Path) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lakeckpt_tables.errors import CheckpointError

    loader = StatefulDataLoader(list(range(4)), batch_size=None)
    with pytest.raises(CheckpointError, match=r"nothing was committed: .*LakeDataset or a "
                       r"Mixture, got a StatefulDataLoader over a list: build it as "):
        CheckpointManager(tmp_path, "x").save(1, dataloader=loader)


# ------------------------------------------------------------ jobs in real processes
#
# A job's ranks are real processes forked from a server that imported torch, deltalake and
# the library once (as the chaos campaign does): each a process of its own, with a real gloo
# process group and a real SIGKILL, for a second or two each instead of a fresh torchrun.

def _sources(spec: dict[str, Any], **kwargs: Any) -> tuple[Any, Any]:
    from lakeckpt_tables import DeltaSource, IcebergSource
    from tests.conftest import ICEBERG_IDENTIFIER, sql_catalog

    web = LakeDataset(DeltaSource(spec["delta"]), **kwargs)
    code = LakeDataset(IcebergSource(ICEBERG_IDENTIFIER,
                                     catalog=sql_catalog(Path(spec["iceberg"]))), **kwargs)
    return web, code


def _dataset(spec: dict[str, Any]) -> Any:
    """What job ``spec["kind"]`` reads (the same in the job and in its reference run)."""
    kind = spec["kind"]
    rank = {"rank": spec["rank"], "world_size": spec["world"]}
    if kind == "packed":
        web, _ = _sources(spec, pack_tokens="tokens", seq_len=L, eos_id=EOS, batch_size=B,
                          seed=5, **rank)
        return web
    web, code = _sources(spec, columns=["id"], batch_size=32, seed=3, **rank)
    return Mixture({"web": web, "code": code}, weights={"web": 0.7, "code": 0.3}, seed=0,
                   on_exhausted="cycle" if kind == "cycle" else "stop")


def _payload(batch: dict[str, Any]) -> Any:
    if "input_ids" in batch:
        return batch["input_ids"].tolist()
    return [batch["source"], batch["id"].tolist()]


def _job(spec: dict[str, Any]) -> None:
    """One rank of a job: restore, train (log every batch), save every ``every`` steps;
    SIGKILL itself at step ``kill`` (before its save), or end at the end of the data (or at
    step ``until``: a cycling mixture never ends)."""
    import json
    import multiprocessing
    import os
    import signal
    from datetime import timedelta

    import torch.distributed as dist

    multiprocessing.set_start_method("fork", force=True)  # DataLoader workers, as in a job
    rank, world = spec["rank"], spec["world"]
    if world > 1:
        dist.init_process_group("gloo", init_method=spec["store"], rank=rank, world_size=world,
                                timeout=timedelta(seconds=60))
    loader = loader_for(_dataset(spec), spec["workers"])
    manager = CheckpointManager(spec["root"], spec["kind"])
    step = manager.restore(dataloader=loader) or 0
    with open(Path(spec["out"]) / f"rank{rank}.jsonl", "w") as log:
        log.write(json.dumps({"restored": step}) + "\n")
        for batch in loader:
            step += 1
            log.write(json.dumps({"step": step, "batch": _payload(batch)}) + "\n")
            log.flush()
            if step == spec.get("kill"):
                os.kill(os.getpid(), signal.SIGKILL)
            if step % spec["every"] == 0:
                manager.save(step, dataloader=loader)
            if step == spec.get("until"):
                break
        manager.save(step + 1, dataloader=loader)
    if world > 1:
        dist.destroy_process_group()


_PRELOAD = ["torch", "torch.distributed", "torch.distributed.checkpoint",
            "torchdata.stateful_dataloader", "pyarrow.parquet", "deltalake",
            "pyiceberg.catalog.sql", "lakeckpt_tables.checkpoint", "lakeckpt_tables.reader",
            "lakeckpt_tables.mixture", __name__]


def _launch(spec: dict[str, Any], world: int, out: Path) -> list[int | None]:
    """Run ``spec``'s job on ``world`` ranks; their exit codes (-9: SIGKILLed)."""
    import multiprocessing
    import os

    server = multiprocessing.get_context("forkserver")
    server.set_forkserver_preload(_PRELOAD)
    out.mkdir(parents=True, exist_ok=True)
    store = f"file://{out}/store"
    ranks = [server.Process(target=_job, args=({**spec, "rank": r, "world": world,
                                                  "store": store, "out": str(out)},))
             for r in range(world)]
    threads = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the server when it starts
    try:
        for p in ranks:
            p.start()
    finally:
        if threads is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = threads
    for p in ranks:
        p.join(90)
        if p.exitcode is None:
            p.kill()
    return [p.exitcode for p in ranks]


def _trained(out: Path) -> tuple[dict[int, list[Any]], dict[int, int]]:
    """Per rank of a job: the batches it logged, and the step it restored."""
    import json

    batches, restored = {}, {}
    for path in sorted(out.glob("rank*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        rank = int(path.stem[4:])
        restored[rank] = lines[0]["restored"]
        batches[rank] = [line["batch"] for line in lines[1:]]
    return batches, restored


def _spec(kind: str, delta: Table, iceberg: Table, root: Path, **kwargs: Any) -> dict[str, Any]:
    return {"kind": kind, "delta": delta.location, "iceberg": iceberg.location,
            "root": str(root), "workers": 0, "every": 5, **kwargs}


def _resumed_run(kind: str, delta: Table, iceberg: Table, root: Path, *, worlds: tuple[int, int],
                 kill: int, **kwargs: Any) -> tuple[dict[int, list[Any]], int]:
    """A job SIGKILLed after step ``kill`` on ``worlds[0]`` ranks, then restored on
    ``worlds[1]``: per rank of the second, what trained the final model in order (the first
    job's batches up to the restored step, then the second's), and the restored step."""
    spec = _spec(kind, delta, iceberg, root, **kwargs)
    assert _launch({**spec, "kill": kill}, worlds[0], root / "job1") == [-9] * worlds[0]
    assert _launch(spec, worlds[1], root / "job2") == [0] * worlds[1]
    first, _ = _trained(root / "job1")
    second, restored = _trained(root / "job2")
    (step,) = set(restored.values())
    return {r: [*first.get(r, [])[:step], *second[r]] for r in second} | {
        r: first[r][:step] for r in first if r not in second}, step


@pytest.mark.timeout(120)
def test_a_cycling_mixture_sigkilled_in_a_sources_second_pass_resumes_row_for_row(
        delta_table: Table, iceberg_table: Table, tmp_path: Path) -> None:
    from lakeckpt_tables.audit import verify

    spec = _spec("cycle", delta_table, iceberg_table, tmp_path, rank=0, world=1, workers=2)
    whole = [_payload(b) for b in itertools.islice(loader_for(_dataset(spec), 2), 40)]
    # web (70% of the draws) runs out first: each of its 2 workers has 7 batches a pass, so
    # its second pass (epoch 1) starts at its 15th batch, near draw 20
    second_pass = [i for i, (name, _) in enumerate(whole) if name == "web"][14]
    kill = second_pass + 7  # step second_pass + 1 is the second pass's first batch
    until = kill + 3
    whole = whole[:until]
    runs, step = _resumed_run("cycle", delta_table, iceberg_table, tmp_path, worlds=(1, 1),
                              kill=kill, workers=2, until=until)
    assert second_pass < step < kill  # restored from a checkpoint inside the second pass
    assert runs[0] == whole  # row for row, source for source
    # the ledger: web's rows under the epoch that read them, its first pass whole
    records = DeltaLedger(str(tmp_path / "_ledger")).consumption(run_id="cycle").to_pylist()
    rows: Counter[tuple[str, int]] = Counter()
    for rec in records:
        rows[(rec["source_key"], rec["epoch"])] += rec["rows"]
    delivered = Counter(name for name, ids in whole for _ in ids)
    assert rows[("web", 0)] == delta_table.rows
    assert rows[("web", 0)] + rows[("web", 1)] == delivered["web"]
    assert rows[("code", 0)] == delivered["code"] and len(rows) == 3
    # and verify finds each row group of web's finished epoch 0 given once, no overlap
    (verdict,) = verify(str(tmp_path), source_catalog=iceberg_table.extra["catalog"])
    assert verdict.violations == [] and verdict.finished_passes == [(0, 0)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["packed", "mixture"])
def test_an_elastic_three_to_two_rank_resume_delivers_each_token_once(
        delta_table: Table, iceberg_table: Table, tmp_path: Path, kind: str) -> None:
    """3 ranks SIGKILLed at step 4 (checkpoint at 3), restored on 2 ranks: what the run
    trained, per source, is the uninterrupted 3-rank run's, each token once. The order after
    the re-plan differs (the rest is split again among 2 ranks); a packed reader leaves out at
    most the re-plan's own lockstep tail (fewer than 2 x seq_len tokens, whole sequences),
    which the uninterrupted run delivered."""
    spec = _spec(kind, delta_table, iceberg_table, tmp_path, every=3)
    whole = [[_payload(b) for b in _dataset({**spec, "rank": r, "world": 3})]
             for r in range(3)]
    runs, step = _resumed_run(kind, delta_table, iceberg_table, tmp_path, worlds=(3, 2),
                              kill=4, every=3)
    assert step == 3
    assert len({len(runs[r]) - step for r in (0, 1)}) == 1  # the 2 ranks in lockstep
    if kind == "packed":
        def sequences(batches: list[Any]) -> Counter[tuple[int, ...]]:
            return Counter(tuple(seq) for batch in batches for seq in batch)

        got = sum((sequences(b) for b in runs.values()), Counter())
        want = sum((sequences(b) for b in whole), Counter())
        assert not got - want  # each sequence one of the uninterrupted run's, none twice
        assert sum((want - got).values()) <= 1  # the 2-rank tail: < 2 x seq_len tokens
        seen = consumed_rows(DeltaLedger(str(tmp_path / "_ledger")), kind)
        assert max(seen.values()) == 1
        assert sum(seen.values()) == sum(seq.count(EOS) for seq in got.elements())
        return
    def rows(runs: Any) -> dict[str, Counter[int]]:
        out: dict[str, Counter[int]] = {"web": Counter(), "code": Counter()}
        for batches in runs:
            for name, ids in batches:
                out[name].update(ids)
        return out

    got, want = rows(runs.values()), rows(whole)
    assert max(got["web"].values()) == max(got["code"].values()) == 1
    # web ran out in both runs: every row of it once (no lockstep remainder at 3 or 2 ranks)
    assert got["web"] == want["web"] == Counter(delta_table.ids.tolist())
    # code did not run out: it gave more batches in the 2-rank run (the mixture ended at a
    # later draw), each row once, and the ledger names exactly the rows delivered
    records = DeltaLedger(str(tmp_path / "_ledger")).consumption(run_id=kind).to_pylist()
    for name in ("web", "code"):
        assert sum(r["rows"] for r in records if r["source_key"] == name) == sum(
            got[name].values())
