"""Packing (NOTE [ packing ] in lakeckpt_tables/reader/packing/stream.py): the delivered tokens
are the documents + eos stream, cut anywhere and resumed from any carry, with per-document
positions."""

from __future__ import annotations

import itertools
import json
import warnings

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lakeckpt_tables.errors import EosInDocumentWarning, PackingError
from lakeckpt_tables.reader.packing import stream
from lakeckpt_tables.reader.packing.stream import (
    PackCarry,
    StreamWriter,
    check_packing,
    check_token_column,
    finish,
    pack,
    pack_array,
)

EOS = -1  # token ids drawn are >= 0: the eos never occurs inside a document here

documents = st.lists(st.lists(st.integers(0, 1000), max_size=12), max_size=25)


def stream_of(docs: list[list[int]]) -> tuple[list[int], list[int]]:
    """The oracle, one document at a time: tokens + eos, positions from 0 per document."""
    tokens: list[int] = []
    positions: list[int] = []
    for doc in docs:
        tokens += [*doc, EOS]
        positions += list(range(len(doc) + 1))
    return tokens, positions


def as_arrays(docs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(d) for d in docs])
    values = np.array([t for d in docs for t in d], dtype=np.int64)
    return offsets, values


def pack_in_calls(docs: list[list[int]], seq_len: int, cuts: list[int], limits: list[int | None],
                  carry: PackCarry | None = None) -> tuple[list[int], list[int], PackCarry]:
    """Hand the rows in, in chunks at ``cuts``, each call limited as ``limits`` says; rows a
    limited call did not consume are handed in again (as a reader does after a batch)."""
    carry = carry or PackCarry()
    out_tokens: list[int] = []
    out_positions: list[int] = []
    row = 0
    bounds = sorted({c for c in cuts if 0 < c < len(docs)} | {len(docs)})
    call = 0
    for end in bounds:
        while row < end:
            offsets, values = as_arrays(docs[row:end])
            limit = limits[call % len(limits)] if limits else None
            call += 1
            out = pack(carry, offsets, values, seq_len=seq_len, eos_id=EOS, limit=limit)
            assert out.input_ids.shape == out.position_ids.shape == (len(out.input_ids), seq_len)
            out_tokens += out.input_ids.ravel().tolist()
            out_positions += out.position_ids.ravel().tolist()
            row += out.rows
            carry = out.carry
            assert out.rows or len(out.input_ids), "a call with rows left made no progress"
    return out_tokens, out_positions, carry


@settings(max_examples=200, deadline=None)
@given(docs=documents, seq_len=st.integers(2, 9),
       cuts=st.lists(st.integers(0, 25), max_size=6),
       limits=st.lists(st.one_of(st.none(), st.integers(1, 3)), max_size=4))
def test_delivered_tokens_are_the_documents_and_eos_stream_however_rows_are_cut(
        docs, seq_len, cuts, limits):
    tokens, positions, carry = pack_in_calls(docs, seq_len, cuts, limits)
    expected_tokens, expected_positions = stream_of(docs)
    full = len(expected_tokens) // seq_len * seq_len
    assert tokens == expected_tokens[:full]
    assert positions == expected_positions[:full]
    assert list(carry.tokens) == expected_tokens[full:]
    assert list(carry.positions) == expected_positions[full:]
    assert carry.doc_offset == 0


@settings(max_examples=200, deadline=None)
@given(docs=documents, seq_len=st.integers(2, 9), limit=st.integers(1, 3),
       stop=st.integers(0, 40))
def test_resuming_from_any_carry_gives_the_same_output(docs, seq_len, limit, stop):
    """Run limited calls, stop after ``stop`` of them, put the carry through JSON and go on
    from the row it names: the output is that of the uninterrupted run."""
    whole_tokens, whole_positions, _ = pack_in_calls(docs, seq_len, [], [limit])
    carry, row, tokens, positions = PackCarry(), 0, [], []
    for _ in range(stop):
        offsets, values = as_arrays(docs[row:])
        out = pack(carry, offsets, values, seq_len=seq_len, eos_id=EOS, limit=limit)
        tokens += out.input_ids.ravel().tolist()
        positions += out.position_ids.ravel().tolist()
        row, carry = row + out.rows, out.carry
    saved = json.loads(json.dumps(carry.to_json()))
    carry = PackCarry.from_json(saved, seq_len)
    rest_tokens, rest_positions, _ = pack_in_calls(docs[row:], seq_len, [], [limit], carry)
    assert tokens + rest_tokens == whole_tokens
    assert positions + rest_positions == whole_positions


@settings(max_examples=200, deadline=None)
@given(docs=st.lists(st.lists(st.integers(0, 3), max_size=30), max_size=25),
       cuts=st.lists(st.integers(0, 800), max_size=8), eos=st.sampled_from([0, 9, -1]),
       kind=st.sampled_from([np.int32, np.uint8]))
def test_writes_of_any_ranges_are_the_stream_and_count_the_eos_inside_documents(docs, cuts, eos,
                                                                                  kind):
    """The reader's kernel against the one-document-at-a-time oracle: empty documents,
    documents longer than a write, writes of 1 element, eos ids inside documents (0) or not,
    in the scratch memory of a previous writer; tokens of another type than the ids."""
    offsets, values = as_arrays(docs)
    tokens, positions = stream_of(docs)
    tokens = [eos if t == EOS else t for t in tokens]
    inside = [int(t == eos) for d in docs for t in [*d, None]]  # None: the eos slot
    bounds = sorted({min(c, len(tokens)) for c in cuts} | {0, len(tokens)})
    ids = np.full(len(tokens), -7, dtype=np.int64)
    pos = np.full(len(tokens), -7, dtype=np.int64)
    previous = StreamWriter(np.array([0, 900]), np.zeros(900, np.int64), eos_id=0)  # stale
    writer = StreamWriter(offsets, values.astype(kind), eos_id=eos, reuse=previous)
    assert writer.total == len(tokens) and writer.clean == (sum(inside) == 0)
    for a, b in itertools.pairwise(bounds):
        assert writer.write(a, b, ids[a:b], pos[a:b]) == sum(inside[a:b])
    assert ids.tolist() == tokens
    assert pos.tolist() == positions


def test_a_document_longer_than_a_sequence_goes_on_in_the_next_with_its_positions():
    offsets, values = as_arrays([[1, 2, 3, 4, 5], [6]])
    out = pack(PackCarry(), offsets, values, seq_len=4, eos_id=0)
    assert out.input_ids.tolist() == [[1, 2, 3, 4], [5, 0, 6, 0]]
    assert out.position_ids.tolist() == [[0, 1, 2, 3], [4, 5, 0, 1]]
    assert out.rows == 2 and out.carry == PackCarry()


def test_a_limited_call_stops_inside_a_row_and_the_carry_names_the_offset():
    offsets, values = as_arrays([[1, 2, 3, 4, 5], [6]])
    out = pack(PackCarry(), offsets, values, seq_len=3, eos_id=0, limit=1)
    assert out.input_ids.tolist() == [[1, 2, 3]]
    assert out.rows == 0 and out.carry == PackCarry(doc_offset=3)
    again = pack(out.carry, offsets, values, seq_len=3, eos_id=0, limit=1)
    assert again.input_ids.tolist() == [[4, 5, 0]] and again.position_ids.tolist() == [[3, 4, 5]]
    assert again.rows == 1 and again.carry == PackCarry()


def test_pack_array_reads_sliced_list_arrays_of_any_integer_type():
    docs = [[1, 2], [3], [], [4, 5, 6]]
    for kind in (pa.list_(pa.int32()), pa.large_list(pa.int16()), pa.list_(pa.uint64())):
        array = pa.array([[9, 9, 9], *docs], type=kind).slice(1)
        out = pack_array(PackCarry(), array, seq_len=3, eos_id=0)
        assert out.input_ids.ravel().tolist() == [1, 2, 0, 3, 0, 0, 4, 5, 6]
        assert out.carry.tokens == (0,) and out.carry.positions == (3,)
    fixed = pa.array([[1, 2], [3, 4]], type=pa.list_(pa.int64(), 2))
    assert pack_array(PackCarry(), fixed, seq_len=3, eos_id=0).input_ids.tolist() == [
        [1, 2, 0], [3, 4, 0]]


def test_the_last_partial_sequence_is_dropped_and_counted_or_padded_as_its_own_document():
    carry = PackCarry(0, (7, 8), (3, 4))
    ids, pos, undelivered = finish(carry, seq_len=5, last="drop", pad_id=0)
    assert ids.shape == (0, 5) and undelivered == 2
    ids, pos, padding = finish(carry, seq_len=5, last="pad", pad_id=99)
    assert ids.tolist() == [[7, 8, 99, 99, 99]] and pos.tolist() == [[3, 4, 0, 1, 2]]
    assert padding == 3
    assert finish(PackCarry(), seq_len=5, last="pad", pad_id=0)[2] == 0


def test_an_eos_inside_documents_is_counted_exactly_and_warned_once(monkeypatch):
    monkeypatch.setattr(stream, "_warned_eos", False)
    offsets, values = as_arrays([[1, 0, 2], [0, 0]])
    with pytest.warns(EosInDocumentWarning, match="eos_id=0 occurs 1 time"):
        first = pack(PackCarry(), offsets, values, seq_len=2, eos_id=0, limit=1)
    assert first.eos_in_documents == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would raise
        rest = pack(first.carry, offsets, values, seq_len=2, eos_id=0)
    assert rest.eos_in_documents == 2


@pytest.mark.parametrize("kwargs, match", [
    ({"seq_len": 1, "eos_id": 0}, "seq_len=1"),
    ({"seq_len": 8, "eos_id": None}, "eos_id=None"),
    ({"seq_len": 8, "eos_id": 0, "last": "keep"}, "last='keep'"),
    ({"seq_len": 8, "eos_id": 0, "pad_id": 1.5}, "pad_id=1.5"),
])
def test_bad_packing_options_are_refused_by_name(kwargs, match):
    with pytest.raises(PackingError, match=match):
        check_packing(**kwargs)


def test_a_packing_column_that_is_not_a_list_of_integers_is_refused_by_name():
    schema = pa.schema([("tokens", pa.list_(pa.float32())), ("text", pa.string()),
                        ("ok", pa.list_(pa.int32()))])
    check_token_column("t", schema, "ok")
    with pytest.raises(PackingError, match="'tokens' has type list<item: float>"):
        check_token_column("t", schema, "tokens")
    with pytest.raises(PackingError, match="'text' has type string"):
        check_token_column("t", schema, "text")
    with pytest.raises(PackingError, match="'nope' is not a column"):
        check_token_column("t", schema, "nope")
    with pytest.raises(PackingError, match="null list"):
        pack_array(PackCarry(), pa.array([[1], None]), seq_len=2, eos_id=0)


@pytest.mark.parametrize("value", [
    {"doc_offset": 0, "tokens": [1, 2, 3], "positions": [0, 1, 2]},  # a full sequence
    {"doc_offset": 1, "tokens": [1], "positions": [0]},
    {"doc_offset": 0, "tokens": [1], "positions": []},
    {"doc_offset": True, "tokens": [], "positions": []},
    {"doc_offset": 0, "tokens": []},
])
def test_a_damaged_carry_is_refused(value):
    with pytest.raises(ValueError):
        PackCarry.from_json(value, 3)
