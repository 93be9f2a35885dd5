"""The token plan (NOTE [ token plan ] in lakeckpt_tables/reader/packing/token_plan.py): every
slice gets the same number of sequences, the sequences of all slices are the stream of the
permuted row groups (its tail reported), and a slice resumes from any position, also after an
elastic re-plan, with no token lost or repeated."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pyarrow as pa
import pytest

from lakeckpt_tables.errors import EosInDocumentWarning
from lakeckpt_tables.reader.packing.token_plan import (
    TokenPlan,
    _footer_stats,
    packed_batches,
    stream_sizes,
)
from tests.conftest import Table

EOS = -1
L = 7


def stream(table: Table, plan: TokenPlan) -> list[int]:
    """The oracle: documents of the row groups in stream order, one at a time, eos after each."""
    snap = table.make_source().snapshot()
    reader = snap.row_reader()
    out: list[int] = []
    for u in plan.order:
        for doc in reader.read(snap.units[u], ["tokens"]).column("tokens").to_pylist():
            out += [*doc, EOS]
    return out


def plan_of(table: Table, slices: int, **kwargs) -> tuple[TokenPlan, list, object]:
    snap = table.make_source().snapshot()
    reader = snap.row_reader()
    footers = stream_sizes(reader, snap.units, "tokens", EOS)
    plan = TokenPlan.of(footers.sizes, slices=slices, seq_len=L, seed=5, epoch=0, shuffle=True,
                        **kwargs)
    return plan, snap.units, reader


def run(plan: TokenPlan, units, reader, q: int, start: int = 0, batch_size: int = 4):
    free = stream_sizes(reader, units, "tokens", EOS).eos_free
    return list(packed_batches(plan, units, q, start, read=lambda u: reader.read(u, ["tokens"]),
                               column="tokens", seq_len=L, eos_id=EOS, batch_size=batch_size,
                               eos_free=free))


def tokens_of(batches) -> list[int]:
    return [t for ids, _, _, _ in batches for t in ids.ravel().tolist()]


def test_footer_counts_are_the_tokens_the_rows_hold(source):
    snap = source.make_source().snapshot()
    reader = snap.row_reader()
    footers = stream_sizes(reader, snap.units, "tokens", EOS)
    for unit, size, free in zip(snap.units, footers.sizes, footers.eos_free, strict=True):
        docs = reader.read(unit, ["tokens"]).column("tokens").to_pylist()
        assert size == sum(len(d) + 1 for d in docs)
        assert _footer_stats(reader, unit, "tokens")[0] is not None  # no read needed
        assert free  # token ids drawn are >= 0, EOS is -1: the footer's min says so
    tokens = [t for u in snap.units for d in reader.read(u, ["tokens"]).column("tokens")
              .to_pylist() for t in d]
    inside = stream_sizes(reader, snap.units, "tokens", tokens[len(tokens) // 2]).eos_free
    assert not all(inside)  # a token id that occurs: some footer cannot rule it out


@pytest.mark.parametrize("slices", [1, 3, 6])
def test_every_slice_gets_equal_sequences_which_together_are_the_stream(source, slices):
    plan, units, reader = plan_of(source, slices)
    whole = stream(source, plan)
    runs = [run(plan, units, reader, q) for q in range(slices)]
    assert len({len(r) for r in runs}) == 1  # lockstep: equal batches...
    assert len({tuple(len(ids) for ids, _, _, _ in r) for r in runs}) == 1  # ...of equal sizes
    delivered = [t for r in runs for t in tokens_of(r)]
    assert delivered == whole[:len(delivered)]
    assert len(whole) - len(delivered) == plan.tail < slices * L
    positions = [p for r in runs for ids, pos, _, _ in r for p in pos.ravel().tolist()]
    expected: list[int] = []
    for i in range(len(delivered)):
        expected.append(0 if i == 0 or whole[i - 1] == EOS else expected[-1] + 1)
    assert positions == expected


def test_a_slice_resumes_from_any_position(source):
    plan, units, reader = plan_of(source, 3)
    for q in range(3):
        whole = run(plan, units, reader, q)
        for _, _, position, _ in whole:
            rest = run(plan, units, reader, q, start=position)
            head = tokens_of([b for b in whole if b[2] <= position])
            assert head + tokens_of(rest) == tokens_of(whole)
        # a position inside a batch (another batch size before the resume)
        rest = run(plan, units, reader, q, start=3)
        assert tokens_of(whole)[3 * L:] == tokens_of(rest)


def test_elastic_three_to_two_slices_delivers_the_rest_once(source):
    plan, units, reader = plan_of(source, 3)
    positions = [2, 5, 0]
    heads = [tokens_of(run(plan, units, reader, q))[:n * L] for q, n in enumerate(positions)]
    left = plan.remaining(positions)
    again = TokenPlan.of(plan.sizes, slices=2, seq_len=L, seed=5, epoch=0, shuffle=True,
                         layout=left)
    rests = [tokens_of(run(again, units, reader, q)) for q in range(2)]
    whole = stream(source, plan)
    delivered_intervals = [(q * plan.per_slice * L, q * plan.per_slice * L + n * L)
                           for q, n in enumerate(positions)]
    delivered_intervals += [iv for q in range(2) for iv in again.intervals(q)]
    covered = sorted(iv for iv in delivered_intervals if iv[0] < iv[1])
    for (_, a1), (b0, _) in itertools.pairwise(covered):
        assert a1 <= b0  # no stream element twice
    assert sum(b - a for a, b in covered) + again.tail + plan.tail == len(whole)
    got = [t for h in heads for t in h] + [t for r in rests for t in r]
    want = [t for a, b in delivered_intervals for t in whole[a:b]]
    assert got == want


def test_a_packed_batch_splits_a_document_with_its_positions(tmp_path):
    from deltalake import write_deltalake

    from lakeckpt_tables import DeltaSource

    write_deltalake(str(tmp_path), pa.table({"tokens": pa.array(
        [list(range(10)), [100, 101]], pa.list_(pa.int32()))}))
    snap = DeltaSource(str(tmp_path)).snapshot()
    reader = snap.row_reader()
    plan = TokenPlan.of(stream_sizes(reader, snap.units, "tokens").sizes, slices=1, seq_len=4,
                        seed=0, epoch=0, shuffle=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EosInDocumentWarning)
        (ids, pos, position, inside), = packed_batches(
            plan, snap.units, 0, 0, read=lambda u: reader.read(u, ["tokens"]),
            column="tokens", seq_len=4, eos_id=0, batch_size=8)
    assert ids.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 100]]
    assert pos.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 0]]
    assert position == 3 and plan.tail == 2 and inside == 1  # token 0 is also the eos
    assert np.asarray(ids).dtype == np.int64


def test_eos_ids_inside_documents_are_counted_in_the_batch_that_holds_them(tmp_path):
    from deltalake import write_deltalake

    from lakeckpt_tables import DeltaSource

    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 4, rng.integers(0, 12)).tolist() for _ in range(60)]
    docs[10:20] = [[d + 1 for d in doc] for doc in docs[10:20]]  # a stretch without eos
    write_deltalake(str(tmp_path), pa.table({"tokens": pa.array(docs, pa.list_(pa.int64()))}))
    snap = DeltaSource(str(tmp_path)).snapshot()
    reader = snap.row_reader()
    footers = stream_sizes(reader, snap.units, "tokens", 0)
    assert not any(footers.eos_free)  # 0 is among the token ids
    plan = TokenPlan.of(footers.sizes, slices=1, seq_len=3, seed=0, epoch=0, shuffle=False)
    inside = [int(t == 0) for d in docs for t in [*d, None]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EosInDocumentWarning)
        batches = list(packed_batches(
            plan, snap.units, 0, 0, read=lambda u: reader.read(u, ["tokens"]),
            column="tokens", seq_len=3, eos_id=0, batch_size=2))
    a = 0
    for ids, _, _, count in batches:
        assert count == sum(inside[a:a + ids.size])
        a += ids.size
    assert a == plan.per_slice * 3 and sum(b[3] for b in batches) > 0


@pytest.mark.parametrize("batch_size", [1, 3, 1000])
def test_the_batch_size_cuts_the_same_stream_into_full_batches(source, batch_size):
    plan, units, reader = plan_of(source, 2)
    for q in range(2):
        whole = run(plan, units, reader, q, batch_size=4)
        again = run(plan, units, reader, q, batch_size=batch_size)
        assert tokens_of(again) == tokens_of(whole)
        assert [p for b in again for p in b[1].ravel().tolist()] == [
            p for b in whole for p in b[1].ravel().tolist()]
        assert all(len(b[0]) == batch_size for b in again[:-1])
        assert again[-1][2] == whole[-1][2] == plan.per_slice
