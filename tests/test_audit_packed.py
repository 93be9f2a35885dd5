"""Audit, verify and tokens per source of a Mixture of packed datasets under CheckpointManager
(issue 21.3): the ledger's tokens sum to the tokens delivered, ``audit --where`` names exactly
the checkpoints that delivered any token of a row, and ``verify`` proves each source exactly
once (and fails on a duplicated record)."""

from __future__ import annotations

import json
import shutil
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable, WriterProperties, write_deltalake

from lakeckpt_tables import DeltaSource, IcebergSource, LakeDataset, Mixture
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.cli import main
from lakeckpt_tables.ledger import DeltaLedger
from tests.conftest import loader_for, sql_catalog

EOS = -1
SPREAD = 1000  # token t belongs to row t // SPREAD: the delivered ids name their rows


def documents(first: int, rows: int, step: int) -> pa.Table:
    ids = np.arange(first, first + rows, dtype=np.int64)
    # 1 to 21 tokens: documents shorter and longer than a sequence (seq_len 8)
    tokens = [[int(i) * SPREAD + k for k in range((int(i) * step) % 21 + 1)] for i in ids]
    return pa.table({"id": ids, "tokens": pa.array(tokens, pa.list_(pa.int64()))})


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("docs")
    web = str(root / "web")
    props = WriterProperties(max_row_group_size=16, write_batch_size=16)
    for part in range(2):  # streams of 1055 and 606 tokens: tails of 7 and 6 (seq_len 8)
        write_deltalake(web, documents(part * 59, 59, 7), mode="append", writer_properties=props)
    catalog = sql_catalog(root / "ice")
    catalog.create_namespace("docs")
    code = catalog.create_table("docs.code", schema=documents(0, 1, 5).schema,
                                properties={"write.parquet.row-group-limit": "16"})
    code.append(documents(500, 51, 5))
    return {"web": lambda: DeltaSource(web), "code": lambda: IcebergSource("docs.code",
                                                                             catalog=catalog),
            "catalog": catalog}


def mixture(tables: dict[str, Any]) -> Mixture:
    def packed(key: str) -> LakeDataset:
        return LakeDataset(tables[key](), pack_tokens="tokens", seq_len=8, eos_id=EOS,
                           batch_size=2, seed=3)

    return Mixture({"web": packed("web"), "code": packed("code")},
                   weights={"web": 0.6, "code": 0.4}, seed=1)


def trained(tables: dict[str, Any], root: Path) -> dict[str, list[dict[str, Any]]]:
    """A run saved every 3 steps, killed after step 10 (lost), resumed from step 9 and run to
    its end: per committed checkpoint of the lineage, the batches it trained on."""
    since: list[dict[str, Any]] = []
    by_checkpoint: dict[int, list[dict[str, Any]]] = {}
    manager = CheckpointManager(root, "m")
    loader = loader_for(mixture(tables), 0)
    for step, batch in enumerate(loader, 1):
        since.append(batch)
        if step % 3 == 0:
            manager.save(step, dataloader=loader)
            by_checkpoint[step], since = since, []
        if step == 10:
            break
    again = CheckpointManager(root, "m")
    resumed = loader_for(mixture(tables), 0)
    step = again.restore(dataloader=resumed)
    assert step == 9
    since = []
    for batch in resumed:
        since.append(batch)
        step += 1
        if step % 3 == 0:
            again.save(step, dataloader=resumed)
            by_checkpoint[step], since = since, []
    again.save(step + 1, dataloader=resumed)
    by_checkpoint[step + 1] = since
    ids = {c.step: c.checkpoint_id for c in again.checkpoints()}
    return {ids[s]: batches for s, batches in by_checkpoint.items()}


@pytest.fixture(scope="module")
def run(tables: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = tmp_path_factory.mktemp("ck")
    return root, trained(tables, root)


def seen(by_checkpoint: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Counter[int]]]:
    """Per checkpoint and source, the tokens of each row (by id) delivered, eos included: a
    source's stream is its batches in order (one slice), an eos is the row before it."""
    out: dict[str, dict[str, Counter[int]]] = {}
    last: dict[str, int] = {}
    for checkpoint, batches in by_checkpoint.items():
        mine: dict[str, Counter[int]] = defaultdict(Counter)
        for b in batches:
            for t in b["input_ids"].numpy().ravel().tolist():
                row = last[b["source"]] if t == EOS else t // SPREAD
                mine[b["source"]][row] += 1
                last[b["source"]] = row
        out[checkpoint] = mine
    return out


def test_the_ledger_counts_each_checkpoints_tokens_per_source_as_delivered(
        run: tuple[Path, Any], capsys: pytest.CaptureFixture[str]) -> None:
    root, by_checkpoint = run
    consumption = DeltaLedger(str(root / "_ledger")).consumption(run_id="m").to_pylist()
    assert {r["source_key"] for r in consumption} == {"web", "code"}
    for checkpoint, batches in by_checkpoint.items():
        want: Counter[str] = Counter()
        for b in batches:
            want[b["source"]] += b["input_ids"].numel()
        got: Counter[str] = Counter()
        for r in consumption:
            if r["checkpoint_id"] == checkpoint:
                got[r["source_key"]] += r["tokens"]
        assert got == want, checkpoint
    file = consumption[0]["file"]
    assert main(["audit", str(root), "--file", file, "--output", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {r["source_key"] for r in shown} == {consumption[0]["source_key"]}
    assert sum(r["tokens"] for r in shown) == sum(r["tokens"] for r in consumption
                                                  if r["file"] == file)


def test_audit_where_names_every_checkpoint_that_delivered_a_token_of_the_row(
        tables: dict[str, Any], run: tuple[Path, Any],
        capsys: pytest.CaptureFixture[str]) -> None:
    from lakeckpt_tables.audit.where import trained_on

    root, by_checkpoint = run
    saw: dict[tuple[str, int], set[str]] = defaultdict(set)
    for checkpoint, sources in seen(by_checkpoint).items():
        for source, rows in sources.items():
            for row in rows:
                saw[(source, row)].add(checkpoint)
    split = sorted(k for k, v in saw.items() if len(v) > 1)
    assert {s for s, _ in split} == {"web", "code"}  # documents cut between checkpoints
    delivered: Counter[tuple[str, int]] = Counter()
    for sources in seen(by_checkpoint).values():
        for source, rows in sources.items():
            delivered.update({(source, row): n for row, n in rows.items()})
    # documents of which only the first tokens were trained on: cut by the finished pass's
    # tail, or where the other source stopped
    cut = [(s, r) for (s, r), n in delivered.items() if n < (r * {"web": 7, "code": 5}[s]) % 21 + 2]
    assert len(cut) == 2
    catalog = tables["catalog"]
    for source, row in [split[0], *cut]:
        got = trained_on(str(root), f"id = {row}", source_catalog=catalog)
        assert set(got["checkpoint_id"].to_pylist()) == saw[(source, row)]
    source, row = split[-1]  # the other source's
    assert main(["audit", str(root), "--where", f"id = {row}", "--output", "json",
                 "--source-catalog", catalog.properties["uri"]]) == 0
    (shown,) = json.loads(capsys.readouterr().out)
    assert set(shown["checkpoints"]) == saw[(source, row)]


def test_audit_rows_of_a_mixture_of_packed_sources_give_each_rows_tokens(
        tables: dict[str, Any], run: tuple[Path, Any]) -> None:
    from lakeckpt_tables.audit import rows

    root, by_checkpoint = run
    everything = seen(by_checkpoint)
    for checkpoint in list(by_checkpoint)[:4]:
        got = rows(str(root), checkpoint=checkpoint, source_catalog=tables["catalog"])
        for source in ("web", "code"):
            mine = [r for r in got.to_pylist() if r["source_key"] == source]
            assert len({(r["file"], r["row_group"], r["row"]) for r in mine}) == len(mine)
            # the same rows, each with the tokens the checkpoint delivered of it
            assert sorted(r["tokens"] for r in mine) == \
                sorted(everything[checkpoint][source].values())


def test_verify_proves_each_packed_source_exactly_once_and_finds_a_duplicate(
        tables: dict[str, Any], run: tuple[Path, Any], tmp_path: Path) -> None:
    import pyarrow.compute as pc

    from lakeckpt_tables.audit import verify

    root, by_checkpoint = run
    catalog = tables["catalog"]
    (verdict,) = verify(str(root), source_catalog=catalog)
    assert verdict.violations == []
    assert verdict.finished_passes == [(0, 0)]  # the source that ran out
    assert verdict.tokens == sum(b["input_ids"].numel() for bs in by_checkpoint.values()
                                 for b in bs)
    copy = tmp_path / "copy"  # the run's ledger stays clean for the other tests
    shutil.copytree(root, copy)
    uri = str(copy / "_ledger")
    ledger = DeltaTable(uri).to_pyarrow_dataset().to_table()
    consumption = ledger.filter((pc.field("record") == "consumption")
                                & (pc.field("source_key") == "code") & (pc.field("rows") > 0))
    write_deltalake(uri, consumption.slice(0, 1), mode="append")
    (verdict,) = verify(str(copy), source_catalog=catalog)
    assert verdict.violations and verdict.violations[0].startswith("overlap: run m source 'code'")


def test_progress_shows_each_sources_share_rows_and_tokens(
        tables: dict[str, Any], run: tuple[Path, Any],
        capsys: pytest.CaptureFixture[str]) -> None:
    from lakeckpt_tables.audit import connect

    root, by_checkpoint = run
    tokens: Counter[str] = Counter()
    for batches in by_checkpoint.values():
        for b in batches:
            tokens[b["source"]] += b["input_ids"].numel()
    con = connect(str(root), source_catalog=tables["catalog"])
    got = con.sql("SELECT source_key, tokens_consumed, tokens_in_pass, rows_consumed, "
                  "rows_in_pass, share, state FROM progress ORDER BY source_key").fetchall()
    assert [(k, n) for k, n, *_ in got] == sorted(tokens.items())
    total = sum(tokens.values())
    assert [share for *_, share, _ in got] == [round(100 * tokens[k] / total, 2)
                                               for k in sorted(tokens)]
    # the source that ran out delivered its pass: every token but its tail, every row but one
    (done,) = [r for r in got if r[-1] == "done"]
    assert done[1] == done[2] and done[3] == done[4]
    assert main(["progress", str(root), "--source-catalog",
                 tables["catalog"].properties["uri"]]) == 0
    shown = capsys.readouterr().out
    assert "tokens_consumed" in shown and "share" in shown
    assert str(tokens["web"]) in shown and str(tokens["code"]) in shown


def test_the_consumption_view_names_each_sources_key_table_and_version(
        tables: dict[str, Any], run: tuple[Path, Any]) -> None:
    from lakeckpt_tables.audit import connect

    root, _ = run
    con = connect(str(root), source_catalog=tables["catalog"])
    got = con.sql("SELECT DISTINCT source_key, source_location, source_table_id, source_version "
                  "FROM consumption ORDER BY source_key").fetchall()
    want = []
    for key in ("code", "web"):
        snapshot = tables[key]().snapshot(None)
        identity = snapshot.identity
        want.append((key, identity.location, identity.table_id, snapshot.version))
    assert got == want


@pytest.mark.timeout(120)
def test_audit_where_counts_a_document_two_slices_delivered_once_per_checkpoint(
        tables: dict[str, Any], tmp_path: Path) -> None:
    """Two DataLoader workers are two slices of the packed stream: the document cut at their
    boundary is delivered by both within one checkpoint, and is still one row trained on."""
    from lakeckpt_tables.audit.where import trained_on

    manager = CheckpointManager(tmp_path, "w")
    loader = loader_for(LakeDataset(tables["web"](), pack_tokens="tokens", seq_len=8,
                                    eos_id=EOS, batch_size=2, seed=3), 2)
    rows: list[set[int]] = [set(), set()]  # per worker: the rows it delivered a token of
    last = [-1, -1]
    step = 0
    for step, batch in enumerate(loader, 1):
        worker = (step - 1) % 2  # an IterableDataset's batches come from its workers in turn
        for t in batch["input_ids"].numpy().ravel().tolist():
            last[worker] = last[worker] if t == EOS else t // SPREAD
            rows[worker].add(last[worker])
    manager.save(step, dataloader=loader)
    assert rows[0] & rows[1]  # a document cut between the two slices
    got = trained_on(str(tmp_path), "id >= 0")
    assert got["rows"].to_pylist() == [len(rows[0] | rows[1])]
