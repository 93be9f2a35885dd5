"""The window permutation and the reading loop's hot path (NOTE [ keyed permutation ]).

The ``feistel`` shuffler maps a position to a row directly: a piece computes only its own
positions and gets exactly the whole permutation's; its output looks random (no order kept,
neighbouring rows spread, every position equally likely). A reader state records the shuffler
its rows were ordered with: a state that names none (written before shufflers had names)
resumes to the legacy ``PCG64`` order, row for row. Unshuffled batches inside a row group are
zero-copy slices of it.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from conftest import write_one_row_group
from deltalake import WriterProperties, write_deltalake

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.errors import StateMismatchError
from lakeckpt_tables.plan import EpochPlan, Piece, PlanPolicy
from lakeckpt_tables.plan.rounds import RoundUnits
from lakeckpt_tables.plan.shuffle import (
    BALANCED,
    FEISTEL,
    LEGACY,
    SMALL_WINDOW,
    WindowOrder,
    permutation,
    window_order,
)
from lakeckpt_tables.reader.convert import CutConverter
from lakeckpt_tables.reader.loop import batches
from lakeckpt_tables.types import Unit

ROWS = 6000  # one window of one row group, above SMALL_WINDOW: the feistel shuffler applies


@pytest.mark.parametrize("n", [SMALL_WINDOW + 1, 70_001, 262_144])
def test_a_piece_computes_exactly_its_positions_of_the_whole_permutation(n: int) -> None:
    whole = window_order(FEISTEL, n, 11, 0, n)
    assert np.array_equal(np.sort(whole), np.arange(n))  # a permutation of range(n)
    order = WindowOrder(FEISTEL, n, 11)
    for lo, hi in [(0, 1), (5, 4001), (n // 3, min(n // 3 + 8192, n)), (n - 7, n), (n, n)]:
        assert np.array_equal(order(lo, hi), whole[lo:hi])
    assert not np.array_equal(whole, window_order(FEISTEL, n, 12, 0, n))  # the seed matters
    with pytest.raises(ValueError, match="not inside a window"):
        order(0, n + 1)


def test_the_feistel_order_looks_random() -> None:
    n = 200_003
    rows = window_order(FEISTEL, n, 5, 0, n)
    position = np.arange(n)
    assert abs(np.corrcoef(rows, position)[0, 1]) < 0.01  # no order kept
    # neighbouring positions land anywhere: mean distance of a random pair is n / 3
    assert abs(np.abs(np.diff(rows)).mean() / n - 1 / 3) < 0.005
    # rows of each sixteenth of the window spread evenly over sixteenths of the positions
    cells = np.zeros((16, 16))
    np.add.at(cells, (rows * 16 // n, position * 16 // n), 1)
    expected = n / 256
    assert np.abs(cells - expected).max() < 6 * np.sqrt(expected)
    # over seeds, the first row out is any row with equal chance
    firsts = np.array([WindowOrder(FEISTEL, 5000, seed)(0, 1)[0] for seed in range(2000)])
    counts = np.bincount(firsts * 10 // 5000, minlength=10)
    assert np.abs(counts - 200).max() < 6 * np.sqrt(200)


def test_small_windows_and_the_legacy_shuffler_use_the_exact_permutation() -> None:
    assert np.array_equal(window_order(FEISTEL, SMALL_WINDOW, 3, 0, SMALL_WINDOW),
                          permutation(SMALL_WINDOW, 3))
    assert np.array_equal(window_order(LEGACY, 9000, 3, 10, 20), permutation(9000, 3)[10:20])
    with pytest.raises(ValueError, match="unknown shuffler"):
        window_order("zigzag", 10, 3, 0, 10)


def test_a_piece_names_its_shuffler_in_json_and_legacy_pieces_keep_the_old_form() -> None:
    new = Piece(((0, 9000),), 7, 100, 5000, FEISTEL)
    old = Piece(((0, 9000),), 7, 100, 5000)
    assert old.to_json() == [[[0, 9000]], 7, 100, 5000]
    assert Piece.from_json(old.to_json()) == old and old.shuffler == LEGACY
    assert Piece.from_json(new.to_json()) == new and new.to_json()[-1] == FEISTEL
    assert np.array_equal(new.rows(), window_order(FEISTEL, 9000, 7, 100, 5000))
    assert np.array_equal(old.rows(), permutation(9000, 7)[100:5000])
    assert new.cut(10, 20).shuffler == FEISTEL
    with pytest.raises(ValueError, match="malformed piece"):
        Piece.from_json([[[0, 9000]], 7, 100, 5000, "zigzag"])


@pytest.fixture(scope="module")
def one_group(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = str(tmp_path_factory.mktemp("shuffle") / "rows")
    return write_one_row_group(uri, ROWS)


def reader(uri: str, **kwargs: Any) -> LakeDataset:
    return LakeDataset(DeltaSource(uri), columns=["id"], batch_size=500, seed=4,
                       unit_rows=1000, read_ahead=0, **kwargs)


def ids(dataset: LakeDataset, limit: int | None = None) -> list[int]:
    """The ids of the next ``limit`` batches (all when None), without reading one more."""
    return [i for batch in itertools.islice(dataset, limit) for i in batch["id"].tolist()]


def test_a_state_that_names_no_shuffler_resumes_to_the_legacy_order(one_group: str) -> None:
    legacy = reader(one_group)
    legacy.shuffler = LEGACY  # what a reader did before shufflers had names
    old_order = ids(legacy)
    new_order = ids(reader(one_group))
    assert sorted(old_order) == sorted(new_order) == list(range(ROWS))
    assert old_order != new_order  # the window is shuffled another way now

    first = reader(one_group)
    first.shuffler = LEGACY
    assert ids(first, limit=3) == old_order[:1500]
    state = first.state_dict()
    assert "shuffler" not in state["config"]  # the form of a state written before
    resumed = reader(one_group)
    resumed.load_state_dict(state)
    assert ids(resumed) == old_order[1500:]
    assert "shuffler" not in resumed.state_dict()["config"]

    fresh = reader(one_group)
    assert ids(fresh, limit=3) == new_order[:1500]
    state = fresh.state_dict()
    assert state["config"]["shuffler"] == BALANCED
    again = reader(one_group)
    again.load_state_dict(state)
    assert ids(again) == new_order[1500:]


def test_a_state_naming_an_unknown_shuffler_is_refused_by_name(one_group: str) -> None:
    dataset = reader(one_group)
    ids(dataset, limit=1)
    state = dataset.state_dict()
    state["config"]["shuffler"] = "zigzag"
    other = reader(one_group)
    with pytest.raises(StateMismatchError, match="shuffler: state has 'zigzag'"):
        other.load_state_dict(state)
    assert other.shuffler == BALANCED


def test_a_state_written_with_the_feistel_shuffler_resumes_to_its_unit_order(
        one_group: str) -> None:
    # feistel states order units at random; balanced ones by slot (NOTE [ balanced unit
    # order ]): with 2 ranks the two orders differ, and a feistel state keeps its own
    def rank0(shuffler: str | None = None, state: Any = None, limit: int | None = None
              ) -> tuple[list[int], Any]:
        dataset = reader(one_group, rank=0, world_size=2, epochs=2)
        if shuffler is not None:
            dataset.shuffler = shuffler
        if state is not None:
            dataset.load_state_dict(state)
        return ids(dataset, limit), dataset.state_dict()

    old_order, _ = rank0(FEISTEL)
    new_order, _ = rank0()
    assert len(old_order) == len(new_order) == ROWS and old_order != new_order
    first, state = rank0(FEISTEL, limit=4)
    assert first == old_order[:2000] and state["config"]["shuffler"] == FEISTEL
    rest, state = rank0(state=state)
    assert first + rest == old_order and state["config"]["shuffler"] == FEISTEL


def _unit(path: str, group: int, rows: int) -> Unit:
    return Unit(path=path, row_group=group, rows=rows)


def test_an_unshuffled_batch_inside_a_row_group_is_a_zero_copy_cut_of_it() -> None:
    groups = {("a", 0): pa.table({"id": np.arange(0, 3000, dtype=np.int64)}),
              ("a", 1): pa.table({"id": np.arange(3000, 5000, dtype=np.int64)})}
    units = RoundUnits.of([_unit("a", 0, 3000), _unit("a", 1, 2000)], unit_rows=250)
    plan = EpochPlan(units.rows, PlanPolicy(batch_size=1000, shuffle=False),
                     groups=units.source)
    out = list(batches(plan, units, 0, 0, row_group=lambda u: groups[(u.path, u.row_group)],
                       row_ranges=lambda u, a, b: [(u, a, b)],  # units are row groups
                       expect=lambda _: None, read_ahead=0, unit_rows=250))
    assert [end for _, end in out] == [1000, 2000, 3000, 4000, 5000]
    assert np.array_equal(np.concatenate([t.slice(a, n).column("id").to_numpy()
                                          for (t, a, n), _ in out]), np.arange(5000))
    convert = CutConverter("torch", "refuse")
    for j, ((table, first, rows), _) in enumerate(out):
        group = groups[("a", 0 if j < 3 else 1)]
        # the batch is rows of the row group's own table, converted from its own buffer
        assert table is group and rows == 1000
        assert first == j * 1000 - (0 if j < 3 else 3000)
        ids = convert(table, first, rows)["id"]
        assert ids.data_ptr() == group.column("id").chunk(0).buffers()[1].address + 8 * first
        # ... holding exactly its rows: pickled to another process it carries no more
        assert ids.untyped_storage().nbytes() == 8 * rows
        assert ids.tolist() == list(range(j * 1000, (j + 1) * 1000))


def test_a_shuffled_read_delivers_its_plan_rows_in_every_column(tmp_path: Path) -> None:
    uri = str(tmp_path / "kinds")
    ids_ = np.arange(ROWS, dtype=np.int64)
    props = WriterProperties(max_row_group_size=ROWS, write_batch_size=ROWS)
    write_deltalake(uri, pa.table({
        "id": ids_, "x": (ids_ * 0.5).astype(np.float32),
        "name": pa.array([f"r{i}" for i in ids_]),
        "tokens": pa.array([list(range(int(i) % 3)) for i in ids_], pa.list_(pa.int64())),
    }), writer_properties=props)
    dataset = LakeDataset(DeltaSource(uri), columns=["id", "x", "name", "tokens"],
                          batch_size=500, seed=9, unit_rows=1000)
    got = list(dataset)
    plan, units = dataset.round_plan(0, (1, 1, 500), {}, {})
    base = np.concatenate([np.arange(units.first[u], units.first[u] + units.rows[u])
                           for u in plan.order])
    windows = plan.windows(0)
    assert [w.shuffler for w in windows] == [BALANCED] and windows[0].size > SMALL_WINDOW
    expected = np.concatenate([base[w.rows()] for w in windows])
    delivered = np.concatenate([b["id"].numpy() for b in got])
    assert np.array_equal(delivered, expected)
    for batch in got:
        rows = batch["id"].numpy()
        assert np.array_equal(batch["x"].numpy(), (rows * 0.5).astype(np.float32))
        assert batch["name"] == [f"r{i}" for i in rows]
        lengths = np.diff(batch["tokens"].offsets.numpy())
        assert np.array_equal(lengths, rows % 3)


def test_live_rows_are_selected_alike_in_every_column_kind() -> None:
    from lakeckpt_tables.sources._deletes import select_live

    n = 10_000
    keep = np.random.default_rng(3).random(n) > 0.01
    table = pa.table({
        "id": np.arange(n, dtype=np.int64), "x": np.arange(n, dtype=np.float32),
        "nullable": pa.array([None if i % 7 == 0 else i for i in range(n)], pa.int32()),
        "name": pa.array([f"r{i}" for i in range(n)]),
        "flag": pa.array(np.arange(n) % 2 == 0),
    })
    got = select_live(table, keep)
    assert got.schema == table.schema
    assert got.equals(table.filter(pa.array(keep)))


def test_cuts_of_one_window_under_two_shufflers_are_refused_as_rows_named_twice() -> None:
    from lakeckpt_tables.plan.validate import layout_problem

    spans = ((0, 9000),)
    same = [Piece(spans, 7, 0, 4000, FEISTEL), Piece(spans, 7, 4000, 9000, FEISTEL)]
    assert layout_problem(same, 9000) is None
    mixed = [Piece(spans, 7, 0, 4000, LEGACY), Piece(spans, 7, 4000, 9000, FEISTEL)]
    # the two permutations differ: the cuts can name one row twice
    assert len(set(mixed[0].rows().tolist()) & set(mixed[1].rows().tolist())) > 0
    assert layout_problem(mixed, 9000) == "a layout names the same rows twice"


@pytest.mark.parametrize(("n", "seed", "digest"), [
    (4097, 1, "4e73f5cc1767ef45"), (70_001, 7, "5eec1f6726ac1534"),
    (524_288, 123456789, "0c67a560e9f1c053"), (1_000_003, 2**63 - 5, "a6185b0bd266eef8")])
def test_the_window_order_a_reader_computes_never_changes(n: int, seed: int, digest: str) -> None:
    # sample order is part of resume: a run resumed by a newer version continues the same
    # order, so the rows of a window from its 3rd position on are pinned here, byte for byte
    import hashlib

    from lakeckpt_tables.reader.loop import _window_order

    rows = _window_order(WindowOrder(FEISTEL, n, seed), 3, n)
    assert hashlib.sha256(rows.astype("<i8").tobytes()).hexdigest()[:16] == digest
