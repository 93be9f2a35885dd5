"""``LakeDataset(..., pack_tokens=, seq_len=, eos_id=)`` (issue 21 item 1): fixed-length
sequences in lockstep, every token once across resumes at any point: dataset and loader paths,
0 and 2 workers, 1 and 3 ranks, elastic 3 -> 2 ranks."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
import torch

from lakeckpt_tables import LakeDataset
from lakeckpt_tables.errors import PackingError, UnknownColumnError
from lakeckpt_tables.reader.state import merge_states
from tests.conftest import Table, loader_for

EOS = -1
L = 8
B = 3


def packed(table: Table, **kwargs: Any) -> LakeDataset:
    kwargs.setdefault("batch_size", B)
    kwargs.setdefault("seed", 11)
    return LakeDataset(table.make_source(), pack_tokens="tokens", seq_len=L, eos_id=EOS,
                       **kwargs)


def stream(table: Table, ds: LakeDataset, epoch: int = 0) -> list[int]:
    """The oracle: documents of the row groups in the plan's order, eos after each."""
    plan = ds.planner.token_plan((1, 1, B), epoch, None)
    reader = ds.snapshot.row_reader()
    out: list[int] = []
    for u in plan.order:
        for doc in reader.read(ds.snapshot.units[u], ["tokens"]).column("tokens").to_pylist():
            out += [*doc, EOS]
    return out


def tokens(batches: list[dict[str, Any]]) -> list[int]:
    return [t for b in batches for t in b["input_ids"].ravel().tolist()]


def rows(batches: Any) -> list[list[list[int]]]:
    return [b["input_ids"].tolist() for b in batches]


def test_batches_are_long_tensors_of_whole_sequences_with_per_document_positions(source):
    ds = packed(source)
    batches = list(ds)
    for b in batches:
        assert set(b) == {"input_ids", "position_ids"}
        assert b["input_ids"].dtype == b["position_ids"].dtype == torch.int64
        assert b["input_ids"].shape[1] == L and b["input_ids"].shape == b["position_ids"].shape
    assert all(len(b["input_ids"]) == B for b in batches[:-1])
    whole = stream(source, ds)
    delivered = tokens(batches)
    assert delivered == whole[:len(delivered)]
    assert len(whole) - len(delivered) < L  # the tail: reported, fewer than a sequence
    positions = [p for b in batches for p in b["position_ids"].ravel().tolist()]
    expected: list[int] = []
    for i in range(len(delivered)):
        expected.append(0 if i == 0 or whole[i - 1] == EOS else expected[-1] + 1)
    assert positions == expected


@pytest.mark.parametrize("world", [1, 3])
def test_ranks_get_equal_sequences_which_together_are_the_stream(source, world):
    runs = [list(packed(source, rank=r, world_size=world)) for r in range(world)]
    assert len({tuple(len(b["input_ids"]) for b in run) for run in runs}) == 1  # lockstep
    delivered = [t for run in runs for t in tokens(run)]
    whole = stream(source, packed(source))
    assert delivered == whole[:len(delivered)] and len(whole) - len(delivered) < world * L


@pytest.mark.parametrize("world", [1, 3])
def test_resuming_through_the_dataset_at_every_batch_delivers_the_uninterrupted_run(
        delta_table, world):
    for rank in range(world):
        whole = rows(packed(delta_table, rank=rank, world_size=world))
        for stop in range(0, len(whole) + 1, 3):
            ds = packed(delta_table, rank=rank, world_size=world)
            head = rows(itertools.islice(ds, stop))
            saved = json.loads(json.dumps(ds.state_dict()))
            again = packed(delta_table, rank=rank, world_size=world)
            again.load_state_dict(saved)
            assert head + rows(again) == whole, (rank, stop)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", ["loader", "dataset"])
def test_two_workers_resume_exactly_through_either_path(delta_table, path):
    whole = rows(loader_for(packed(delta_table), 2))
    # the loader polls worker 0, 1, 0, 1...: each worker's slice, then the two end to end
    delivered = [t for b in whole[0::2] + whole[1::2] for s in b for t in s]
    stream_ = stream(delta_table, packed(delta_table))
    assert delivered == stream_[:len(delivered)] and len(stream_) - len(delivered) < 2 * L
    for stop in (1, 8):
        loader = loader_for(packed(delta_table), 2)
        head = rows(itertools.islice(loader, stop))
        saved = loader.state_dict()
        del loader
        ds = packed(delta_table)
        again = loader_for(ds, 2)
        if path == "loader":
            again.load_state_dict(saved)
        else:
            ds.load_state_dict(saved)
        assert head + rows(again) == whole, stop


def test_elastic_three_to_two_ranks_delivers_each_token_once(delta_table):
    old = [packed(delta_table, rank=r, world_size=3) for r in range(3)]
    heads = [tokens(list(itertools.islice(ds, n))) for ds, n in zip(old, (2, 5, 1), strict=True)]
    merged = merge_states([ds.state_dict() for ds in old]).to_dict()
    rest = []
    for r in range(2):
        ds = packed(delta_table, rank=r, world_size=2)
        ds.load_state_dict(merged)
        rest.append(list(ds))
    assert len({tuple(len(b["input_ids"]) for b in run) for run in rest}) == 1  # lockstep
    whole = stream(delta_table, packed(delta_table))
    # every delivered sequence is one of the stream's sequences, none twice
    at: dict[tuple[int, ...], list[int]] = {}
    for k in range(len(whole) // L):
        at.setdefault(tuple(whole[k * L:(k + 1) * L]), []).append(k)
    delivered = [tuple(h[i:i + L]) for h in heads for i in range(0, len(h), L)]
    delivered += [tuple(s) for run in rest for b in run for s in b["input_ids"].tolist()]
    for sequence in delivered:
        assert at.get(sequence), "a sequence not in the stream, or delivered twice"
        at[sequence].pop()
    assert len(delivered) >= len(whole) // L - 5  # at most the two tails (< 3L + 2L) left


def test_packing_options_are_refused_by_name(delta_table):
    with pytest.raises(PackingError, match="seq_len=1"):
        LakeDataset(delta_table.make_source(), pack_tokens="tokens", seq_len=1, eos_id=0)
    with pytest.raises(PackingError, match="'vec' has type list<"):
        LakeDataset(delta_table.make_source(), pack_tokens="vec", seq_len=4, eos_id=0)
    with pytest.raises(PackingError, match="'name' has type string"):
        LakeDataset(delta_table.make_source(), pack_tokens="name", seq_len=4, eos_id=0)
    with pytest.raises(UnknownColumnError):
        LakeDataset(delta_table.make_source(), pack_tokens="nope", seq_len=4, eos_id=0)
    with pytest.raises(PackingError, match=r"drop \['follow'\]"):
        LakeDataset(delta_table.make_source(), pack_tokens="tokens", seq_len=4, eos_id=0,
                    follow=True)


def test_a_state_of_another_packing_is_refused(delta_table):
    from lakeckpt_tables.errors import StateMismatchError

    ds = packed(delta_table)
    next(iter(ds))
    other = LakeDataset(delta_table.make_source(), pack_tokens="tokens", seq_len=L + 1,
                        eos_id=EOS, batch_size=B, seed=11)
    with pytest.raises(StateMismatchError, match="pack"):
        other.load_state_dict(ds.state_dict())
    state = ds.state_dict()
    state["slices"] = [[0, 10_000]]
    with pytest.raises(StateMismatchError, match="past the"):
        packed(delta_table).load_state_dict(state)


def test_two_epochs_resume_across_the_epoch_boundary(delta_table):
    whole = rows(packed(delta_table, epochs=2))
    per_epoch = len(rows(packed(delta_table)))
    assert len(whole) == 2 * per_epoch and whole[:per_epoch] != whole[per_epoch:]  # reshuffled
    for stop in (per_epoch - 1, per_epoch, per_epoch + 1):
        ds = packed(delta_table, epochs=2)
        head = rows(itertools.islice(ds, stop))
        again = packed(delta_table, epochs=2)
        again.load_state_dict(ds.state_dict())
        assert head + rows(again) == whole, stop


def test_rows_a_filter_leaves_out_are_not_packed(delta_table):
    import pyarrow.compute as pc

    kept = packed(delta_table, filter=pc.field("id") < 150, shuffle=False)
    reader = kept.snapshot.row_reader()
    tables = [reader.read(u, ["id", "tokens"]) for u in kept.snapshot.units]
    assert sorted(i for t in tables for i in t.column("id").to_pylist()) == list(range(150))
    stream_ = [x for t in tables for d in t.column("tokens").to_pylist() for x in [*d, EOS]]
    delivered = tokens(list(kept))
    assert delivered == stream_[:len(delivered)] and len(stream_) - len(delivered) < L


def test_packing_options_without_pack_tokens_or_with_half_of_them_are_refused(delta_table):
    with pytest.raises(PackingError, match="pass pack_tokens=COLUMN"):
        LakeDataset(delta_table.make_source(), seq_len=8)
    with pytest.raises(PackingError, match=r"needs seq_len= .* and eos_id="):
        LakeDataset(delta_table.make_source(), pack_tokens="tokens", seq_len=8)
    with pytest.raises(PackingError, match="not Arrow tables"):
        packed(delta_table)._tables()


def test_reading_ahead_packs_the_same_batches_while_threads_read(delta_table):
    import threading

    alone = rows(packed(delta_table, read_ahead=0))
    ds = packed(delta_table, read_ahead=2)
    read, names = ds._reader.cache.get, set()

    def recorded(unit: Any) -> Any:
        names.add(threading.current_thread().name)
        return read(unit)

    ds._reader.cache.get = recorded
    assert rows(ds) == alone
    assert names and all(n.startswith("lakeckpt-readahead") for n in names)


def test_a_pass_tail_is_said_once_per_pass_in_words_true_of_its_slices(delta_table, caplog):
    """Not again at each resume inside the pass; one slice's tail is a partial sequence, not a
    lockstep remainder (issue 32, item 7)."""
    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]

    with caplog.at_level("WARNING", logger="lakeckpt_tables"):
        ds = packed(delta_table, epochs=2)
        plan = ds.planner.token_plan((1, 1, B), 0, None)
        assert 0 < plan.tail < L  # the test table leaves a partial sequence
        it = iter(ds)
        next(it), next(it)
        state = ds.state_dict()  # the "crash" inside epoch 0
        assert len(said()) == 1 and "epoch 0: its last" in said()[0]
        assert f"do not fill a sequence of {L}" in said()[0] and "lockstep" not in said()[0]
        resumed = packed(delta_table, epochs=2)
        resumed.load_state_dict(state)
        list(resumed)  # the rest of epoch 0, then epoch 1
        assert len(said()) == 2 and "epoch 1: its last" in said()[1]
        caplog.clear()
        list(packed(delta_table, rank=0, world_size=3))
        (lockstep,) = said()
        assert f"cannot be split in lockstep into sequences of {L} over 3 slices" in lockstep
