"""An ``eos_id`` inside documents (issue 21 item 4): warned once, and counted exactly in the
reader state and in the ledger (``eos_in_documents`` events, per source and checkpoint) across
resumes, workers and elastic re-plans (NOTE [ eos counted in the ledger ])."""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

from lakeckpt_tables import LakeDataset, Mixture
from lakeckpt_tables.audit import connect
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.errors import EosInDocumentWarning
from lakeckpt_tables.reader.packing import stream
from lakeckpt_tables.reader.state import ReaderState, merge_states
from lakeckpt_tables.sources import DeltaSource
from tests.conftest import loader_for

EOS = 7
L = 8
B = 2


def documents(rows: int, seed: int) -> list[list[int]]:
    """Documents of tokens 10..59, a quarter with the eos id planted once or twice; the stream
    (tokens + one eos each) a multiple of 6 x L, so 1, 2, 3 and 6 slices leave no tail."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(10, 60, size=int(rng.integers(0, 11))).tolist() for _ in range(rows)]
    for doc in docs:
        if doc and rng.random() < 0.25:
            for at in rng.integers(0, len(doc), size=int(rng.integers(1, 3))):
                doc[int(at)] = EOS
    while (sum(map(len, docs)) + rows) % (6 * L):
        docs[-1].append(11)
    return docs


def write(uri: Path, docs: list[list[int]]) -> str:
    from deltalake import WriterProperties, write_deltalake

    props = WriterProperties(max_row_group_size=17, write_batch_size=17)
    half = len(docs) // 2
    for lo, hi in ((0, half), (half, len(docs))):
        write_deltalake(str(uri), pa.table({
            "id": pa.array(range(lo, hi), pa.int64()),
            "tokens": pa.array(docs[lo:hi], pa.list_(pa.int64()))}),
            mode="append", writer_properties=props)
    return str(uri)


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("eos")
    return {"web": write(root / "web", documents(150, 1)),
            "code": write(root / "code", documents(90, 2))}


def true_count(uri: str) -> int:
    """The oracle: the eos ids among the documents' tokens, by pyarrow from the table."""
    from deltalake import DeltaTable

    tokens = DeltaTable(uri).to_pyarrow_table(columns=["tokens"]).column("tokens")
    return int(pc.sum(pc.equal(pc.list_flatten(tokens), EOS)).as_py())


def packed(uri: str, **kwargs: Any) -> LakeDataset:
    kwargs.setdefault("batch_size", B)
    return LakeDataset(DeltaSource(uri), pack_tokens="tokens", seq_len=L, eos_id=EOS, seed=3,
                       **kwargs)


def inside(batches: list[dict[str, Any]]) -> list[int]:
    """Per batch, the eos ids inside documents, told from the batches alone (one slice's
    contiguous stream): an eos is a document's end when the next position is 0 or it ends
    the stream, and inside one otherwise."""
    ids = torch.cat([b["input_ids"].ravel() for b in batches])
    pos = torch.cat([b["position_ids"].ravel() for b in batches])
    marks = (ids == EOS) & torch.cat([pos[1:] != 0, torch.tensor([False])])
    bounds = np.cumsum([0] + [b["input_ids"].numel() for b in batches])
    return [int(marks[a:b].sum()) for a, b in itertools.pairwise(bounds)]


def total(states: list[dict[str, Any]]) -> int:
    return merge_states(states).eos_total


def test_the_count_moves_with_each_batch_and_the_warning_fires_once(tables, monkeypatch):
    monkeypatch.setattr(stream, "_warned_eos", False)
    ds = packed(tables["web"])
    counts, batches = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in ds:
            batches.append(batch)
            counts.append(ReaderState.from_dict(ds.state_dict()).eos_total)
    assert [w.category for w in caught] == [EosInDocumentWarning]
    assert counts == np.cumsum(inside(batches)).tolist()  # each token counted when delivered
    assert counts[-1] == true_count(tables["web"]) > 10


@pytest.mark.parametrize("world", [1, 3])
def test_a_resume_at_any_batch_counts_each_occurrence_once(tables, world):
    uri, want = tables["web"], true_count(tables["web"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EosInDocumentWarning)
        for stop in (1, 4, 9, 14):
            states = []
            for r in range(world):
                first = packed(uri, rank=r, world_size=world)
                list(itertools.islice(first, stop))
                again = packed(uri, rank=r, world_size=world)
                again.load_state_dict(first.state_dict())
                list(again)
                states.append(again.state_dict())
            assert total(states) == want, stop


@pytest.mark.timeout(60)
def test_two_workers_and_elastic_three_to_two_ranks_count_each_occurrence_once(tables):
    uri, want = tables["web"], true_count(tables["web"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EosInDocumentWarning)
        old = [loader_for(packed(uri, rank=r, world_size=3), 2) for r in range(3)]
        for loader, n in zip(old, (2, 6, 4), strict=True):  # even sequences: no tail at 2
            list(itertools.islice(loader, n))
        from lakeckpt_tables.reader.loaders import states_from_loader

        merged = merge_states([s for lo in old for s in states_from_loader(lo.state_dict())])
        assert 0 < merged.eos_total < want
        rest = []
        for r in range(2):
            ds = packed(uri, rank=r, world_size=2)
            ds.load_state_dict(merged.to_dict())
            list(ds)
            rest.append(ds.state_dict())
    assert total(rest) == want


def test_a_state_written_before_the_count_loads_and_counts_from_zero(tables):
    ds = packed(tables["web"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EosInDocumentWarning)
        head = list(itertools.islice(ds, 5))
    saved = ds.state_dict()
    saved.pop("eos_inside")
    again = packed(tables["web"])
    again.load_state_dict(saved)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EosInDocumentWarning)
        rest = list(again)
    assert ReaderState.from_dict(again.state_dict()).eos_total == sum(inside(head + rest)[5:])


def eos_per_step(root: Path, run: str) -> dict[tuple[int, str | None], int]:
    """The ledger's answer, in SQL: eos ids inside delivered documents per checkpoint and
    source."""
    rows = connect(str(root)).sql(
        "SELECT step, detail->>'source_key', CAST(detail->>'count' AS BIGINT) FROM events "
        f"WHERE run_id = '{run}' AND event = 'eos_in_documents'").fetchall()
    return {(step, key): n for step, key, n in rows}


def test_the_ledger_counts_per_checkpoint_across_a_crash_what_was_delivered(tables, tmp_path):
    uri = tables["web"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EosInDocumentWarning)
        whole = list(packed(uri))
        manager = CheckpointManager(tmp_path, "e")
        loader = loader_for(packed(uri), 0)
        for step, _ in enumerate(loader, 1):
            if step % 10 == 0:
                manager.save(step, dataloader=loader)
            if step == 27:
                break  # steps 21..27 are lost with the "crash"
        resumed = loader_for(packed(uri), 0)
        again = CheckpointManager(tmp_path, "e")
        assert again.restore(dataloader=resumed) == 20
        for step, _ in enumerate(resumed, 21):
            if step % 10 == 0:
                again.save(step, dataloader=resumed)
        again.save(step, dataloader=resumed)
    per_batch, n = inside(whole), len(whole)
    saved = sorted({*range(10, n + 1, 10), n})
    expected = {(e, None): sum(per_batch[p:e]) for p, e in itertools.pairwise([0, *saved])}
    assert eos_per_step(tmp_path, "e") == {k: n for k, n in expected.items() if n}
    assert sum(eos_per_step(tmp_path, "e").values()) == true_count(uri)


def test_a_mixture_counts_per_source(tables, tmp_path):
    def mixture() -> Mixture:
        return Mixture({"web": packed(tables["web"]), "code": packed(tables["code"])},
                       weights={"web": 0.6, "code": 0.4}, seed=2)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EosInDocumentWarning)
        manager = CheckpointManager(tmp_path, "m")
        loader = loader_for(mixture(), 0)
        got: dict[str, list[dict[str, Any]]] = {"web": [], "code": []}
        for step, batch in enumerate(loader, 1):
            got[batch["source"]].append(batch)
            if step == 12:
                manager.save(step, dataloader=loader)
        manager.save(step, dataloader=loader)
    ledger = eos_per_step(tmp_path, "m")
    for key in ("web", "code"):
        assert sum(n for (_, k), n in ledger.items() if k == key) == sum(inside(got[key])) > 0
    assert {s for s, _ in ledger} == {12, step}


@pytest.mark.timeout(60)
def test_two_workers_crashed_and_restored_count_per_checkpoint_as_the_uninterrupted_run(
        tables, tmp_path):
    uri = tables["web"]

    def run(name: str, crash: int | None) -> dict[tuple[int, str | None], int]:
        manager = CheckpointManager(tmp_path, name)
        loader = loader_for(packed(uri), 2)
        step = 0
        for step, _ in enumerate(loader, 1):
            if step % 8 == 0:
                manager.save(step, dataloader=loader)
            if step == crash:
                break
        if crash is not None:
            loader = loader_for(packed(uri), 2)
            manager = CheckpointManager(tmp_path, name)
            restored = manager.restore(dataloader=loader)
            assert restored == 16
            for step, _ in enumerate(loader, restored + 1):
                if step % 8 == 0:
                    manager.save(step, dataloader=loader)
        manager.save(step, dataloader=loader)
        return eos_per_step(tmp_path, name)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EosInDocumentWarning)
        whole, resumed = run("whole", None), run("crashed", 21)
    assert resumed == whole and len(whole) >= 4
    assert sum(whole.values()) == true_count(uri)
