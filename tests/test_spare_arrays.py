"""Window-sized scratch arrays reused between shuffled windows (NOTE [ spare window arrays ] in
``reader/spare.py``): an array given back is handed out again for a request of at least half its
size, at most ``KEPT`` arrays and ``KEPT_BYTES`` bytes are kept, a forked process keeps none of
its parent's, and a window's batches stay exactly its rows after the window is dropped and its
arrays reused by the next."""

from __future__ import annotations

import gc

import numpy as np
import pyarrow as pa
import pytest
import torch

from lakeckpt_tables.reader import spare
from lakeckpt_tables.reader.convert import CutConverter
from lakeckpt_tables.reader.gather import Gathered


@pytest.fixture(autouse=True)
def _no_spares() -> None:
    spare._SPARE.clear()


def test_an_array_given_back_is_reused_for_a_request_it_fits() -> None:
    first = spare.take(1000)
    assert first.nbytes >= 1000 and first.dtype == np.uint8
    spare.give_back(first)
    assert spare.take(400) is not first  # less than half of it: a new one
    assert spare.take(900) is first  # the spare one, taken out of the pool
    assert spare.take(900) is not first


def test_at_most_kept_arrays_and_bytes_are_kept_the_oldest_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    arrays = [spare.take(100 * (k + 1)) for k in range(spare.KEPT + 1)]
    for array in arrays:
        spare.give_back(array)
    assert [id(a) for a in spare._SPARE] == [id(a) for a in arrays[1:]]
    monkeypatch.setattr(spare, "KEPT_BYTES", 2000)
    big = spare.take(1500)
    spare.give_back(big)  # the older ones make room, up to the bytes kept
    assert spare._SPARE[-1] is big and sum(a.nbytes for a in spare._SPARE) <= 2000
    spare.give_back(spare.take(2001))  # larger than all the bytes kept: not kept
    assert not spare._SPARE


def test_a_forked_process_keeps_none_of_its_parents() -> None:
    kept = spare.take(1000)
    spare.give_back(kept)
    spare._PID[0] = -1  # as if the arrays were kept by the parent before a fork
    assert spare.take(1000) is not kept and not spare._SPARE  # and this process is noted
    spare.give_back(kept)
    assert spare.take(1000) is kept


def _window(seed: int) -> tuple[list[tuple[pa.Table, int, int]], np.ndarray, pa.Table]:
    rng = np.random.default_rng(seed)
    groups = [pa.table({"id": pa.array(rng.integers(0, 10**9, 300)),
                        "x": pa.array(rng.random(300).astype(np.float32))}) for _ in range(3)]
    runs = [(groups[0], 10, 300), (groups[1], 0, 300), (groups[2], 5, 200)]
    whole = pa.concat_tables([t.slice(a, b - a) for t, a, b in runs])
    return runs, rng.permutation(whole.num_rows), whole


def test_batches_stay_their_rows_when_the_next_window_reuses_the_arrays() -> None:
    runs, order, whole = _window(1)
    window, converted = Gathered(runs, order), CutConverter("torch", "refuse")
    batches = [converted(window, first, 64) for first in range(0, 640, 64)]
    del window, converted  # the converter holds the last window it cut
    gc.collect()
    assert len(spare._SPARE) == 2  # its plain columns laid end to end, given back
    runs2, order2, whole2 = _window(2)
    window2 = Gathered(runs2, order2)
    assert not spare._SPARE  # reused by the next window
    want = whole.take(order[:640])
    got = {name: torch.cat([b[name] for b in batches]).numpy() for name in ("id", "x")}
    assert np.array_equal(got["id"], want.column("id").to_numpy())
    assert np.array_equal(got["x"], want.column("x").to_numpy())
    assert window2.slice(0, whole2.num_rows).equals(whole2.take(order2))
