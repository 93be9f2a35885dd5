"""Text tokenized as it is read (NOTE [ text tokenized on the fly ] in
lakeckpt_tables/reader/packing/tokenize.py): packing a string column with a tokenizer gives, batch
for batch, what packing the same documents pre-tokenized gives, at any resume and with DataLoader
workers; the token counts a plan needs are computed once per snapshot and tokenizer and kept; a
resume with another tokenizer is refused by name. A tiny BPE tokenizer is trained here."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import tokenizers  # the dev extra's (and the text extra's)
import torch
from deltalake import WriterProperties, write_deltalake

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.errors import PackingError, StateMismatchError
from tests.conftest import loader_for

EOS, L, B = 1, 16, 3


def bpe(docs: list[str], vocab: int) -> Any:
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.train_from_iterator(docs, tokenizers.trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["[UNK]", "[EOS]"], show_progress=False))
    return tok


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A Delta table of documents (``text``) and the same documents pre-tokenized
    (``tokens``), in row groups of 40 rows; the tokenizer; another one."""
    rng = np.random.default_rng(7)
    words = ["".join(rng.choice(list("abcdefgh"), rng.integers(2, 6))) for _ in range(120)]
    docs = [" ".join(rng.choice(words, rng.integers(1, 25))) for _ in range(400)]
    tok = bpe(docs[:200], 200)
    ids = [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
    uri = tmp_path_factory.mktemp("text") / "docs"
    write_deltalake(str(uri), pa.table({"id": np.arange(len(docs)), "text": docs,
                                        "tokens": pa.array(ids, pa.list_(pa.int64()))}),
                    writer_properties=WriterProperties(max_row_group_size=40))
    return {"uri": str(uri), "tokenizer": tok, "other": bpe(docs[200:], 150), "rows": len(docs)}


def text_reader(corpus: dict[str, Any], cache: Path, **kwargs: Any) -> LakeDataset:
    kwargs.setdefault("tokenizer", corpus["tokenizer"])
    kwargs.setdefault("pack_tokens", "text")
    return LakeDataset(DeltaSource(corpus["uri"]), token_cache=str(cache),
                       seq_len=L, eos_id=EOS, batch_size=B, seed=3, **kwargs)


def token_reader(corpus: dict[str, Any], **kwargs: Any) -> LakeDataset:
    return LakeDataset(DeltaSource(corpus["uri"]), pack_tokens="tokens", seq_len=L,
                       eos_id=EOS, batch_size=B, seed=3, **kwargs)


def ids(batches: Any) -> list[list[list[int]]]:
    return [b["input_ids"].tolist() for b in batches]


@pytest.mark.timeout(60)
def test_text_packs_as_its_tokens_do_resumed_and_with_workers(corpus, tmp_path):
    whole = ids(token_reader(corpus))
    assert ids(text_reader(corpus, tmp_path)) == whole
    positions = [b["position_ids"].tolist() for b in text_reader(corpus, tmp_path)]
    assert positions == [b["position_ids"].tolist() for b in token_reader(corpus)]
    first = text_reader(corpus, tmp_path)
    it = iter(first)
    head = ids(itertools.islice(it, 11))
    again = text_reader(corpus, tmp_path)
    again.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert head + ids(again) == whole  # a resume inside a document goes on token for token
    for rank in range(2):  # 2 ranks x 2 DataLoader workers: the token column's sequences
        want = ids(loader_for(token_reader(corpus, rank=rank, world_size=2), 2))
        got = ids(loader_for(text_reader(corpus, tmp_path, rank=rank, world_size=2), 2))
        assert got == want and len(got) > 4


def test_token_counts_are_computed_once_per_snapshot_and_tokenizer_and_kept(corpus, tmp_path):
    cache = tmp_path / "counts"
    first = text_reader(corpus, cache)
    sizes = first.planner.stream_sizes()
    assert first.planner.packing.text.encoded_rows == corpus["rows"]  # tokenized once to plan
    (kept,) = cache.iterdir()
    assert sum(json.loads(kept.read_text())["tokens"]) + corpus["rows"] == sum(sizes)
    second = text_reader(corpus, cache)  # a resume, another rank, a second run
    assert second.planner.stream_sizes() == sizes
    assert second.planner.packing.text.encoded_rows == 0  # planned from the kept counts
    other = text_reader(corpus, cache, tokenizer=corpus["other"])
    other.planner.stream_sizes()
    assert other.planner.packing.text.encoded_rows == corpus["rows"]  # its own counts
    assert len(list(cache.iterdir())) == 2


def test_a_resume_with_another_tokenizer_is_refused_by_name(corpus, tmp_path):
    first = text_reader(corpus, tmp_path)
    next(iter(first))
    state = first.state_dict()
    other = text_reader(corpus, tmp_path, tokenizer=corpus["other"])
    with pytest.raises(StateMismatchError, match=r"tokenizer: the state's documents were "
                                                 "tokenized by tokenizer [0-9a-f]+, this"):
        other.load_state_dict(state)
    with pytest.raises(StateMismatchError, match="tokenizer"):
        token_reader(corpus).load_state_dict(state)


def test_text_without_a_tokenizer_and_bad_tokenizers_are_refused_by_name(corpus, tmp_path):
    with pytest.raises(PackingError, match=r"type string, a text column: pass tokenizer="):
        LakeDataset(DeltaSource(corpus["uri"]), pack_tokens="text", seq_len=L, eos_id=EOS)
    with pytest.raises(PackingError, match="a tokenizer tokenizes a string column"):
        text_reader(corpus, tmp_path, pack_tokens="tokens")
    with pytest.raises(PackingError, match=r"pass a tokenizers\.Tokenizer"):
        text_reader(corpus, tmp_path, tokenizer="gpt2")
    with pytest.raises(PackingError, match="tokenizer and token_cache are packing options"):
        LakeDataset(DeltaSource(corpus["uri"]), tokenizer=corpus["tokenizer"])
    assert torch.equal(next(iter(text_reader(corpus, tmp_path)))["input_ids"],
                       next(iter(token_reader(corpus)))["input_ids"])


@pytest.mark.timeout(60)
def test_the_tokenize_bench_reports_the_reader_beside_encode_batch_and_planning_apart(tmp_path):
    from lakeckpt_tables.tools.bench.tokenize import format_report, run_tokenize_bench

    report = run_tokenize_bench(docs=300, root=tmp_path, rounds=1)
    (first, second) = report.figures
    assert first.name == "tokenizing reader / encode_batch" and first.value > 0
    assert second.passed is None  # encode_batch_fast: shown, no target
    assert report.tokens > 0 and report.planning_cached_s < report.planning_s
    assert "planning pass" in format_report(report)


@pytest.mark.timeout(60)
def test_the_ledger_counts_a_text_run_as_the_same_run_over_its_tokens(corpus, tmp_path,
                                                                     monkeypatch):
    """Under CheckpointManager, a text-packing run's consumption records (rows by eos, tokens
    delivered) are those of the same run over the pre-tokenized column: not characters."""
    from lakeckpt_tables.checkpoint import CheckpointManager
    from lakeckpt_tables.ledger import DeltaLedger

    def run(name: str, make: Any) -> list[tuple[Any, ...]]:
        manager = CheckpointManager(tmp_path / "ckpt", name)
        loader = loader_for(make(), 0)
        for step, _ in enumerate(loader, 1):
            if step % 7 == 0:
                manager.save(step, dataloader=loader)
        manager.save(step + 1, dataloader=loader)
        records = DeltaLedger(str(tmp_path / "ckpt" / "_ledger")).consumption(run_id=name)
        return sorted((r["step"], r["file"], r["row_group"], r["row_start"], r["row_end"],
                       r["rows"], r["tokens"]) for r in records.to_pylist())

    text = run("text", lambda: text_reader(corpus, tmp_path / "counts"))
    tokens = run("tokens", lambda: token_reader(corpus))
    assert text == tokens and sum(r[-1] for r in text) > 0
    from lakeckpt_tables.audit import verify

    (verdict,) = verify(str(tmp_path / "ckpt"), run="tokens")
    assert verdict.ok
    with pytest.raises(PackingError, match="pass tokenizer="):  # without it: said by name
        verify(str(tmp_path / "ckpt"), run="text")
    monkeypatch.setenv("LAKECKPT_HOME", str(tmp_path / "home"))  # verify's token counts
    (verdict,) = verify(str(tmp_path / "ckpt"), run="text", tokenizer=corpus["tokenizer"])
    assert verdict.ok and verdict.finished_passes == [(0, 0)]  # every row group's tokens once
    corpus["tokenizer"].save(str(tmp_path / "tokenizer.json"))
    from lakeckpt_tables.cli import main

    assert main(["verify", str(tmp_path / "ckpt"), "--run", "text", "--tokenizer",
                 str(tmp_path / "tokenizer.json")]) == 0
    assert len(list((tmp_path / "home" / "token-counts").iterdir())) == 1  # counted once
    from lakeckpt_tables.audit import rows

    def audited(run: str, **kwargs: Any) -> list[tuple[Any, ...]]:
        ids = [r.checkpoint_id for r in DeltaLedger(str(tmp_path / "ckpt" / "_ledger"))
               .checkpoints(run)]
        table = rows(str(tmp_path / "ckpt"), checkpoint=ids[1], **kwargs)
        return sorted(zip(*(table[c].to_pylist() for c in ("file", "row_group", "row",
                                                            "tokens")), strict=True))

    # which documents (and how many of their tokens) a checkpoint trained on: as the token run
    assert audited("text", tokenizer=corpus["tokenizer"]) == audited("tokens")
    assert main(["audit", str(tmp_path / "ckpt"), "--checkpoint", DeltaLedger(str(
        tmp_path / "ckpt" / "_ledger")).checkpoints("text")[1].checkpoint_id, "--tokenizer",
        str(tmp_path / "tokenizer.json")]) == 0
