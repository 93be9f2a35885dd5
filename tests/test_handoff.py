"""Workers that hand batches over in chunks (issue 12 item 4, NOTE [ chunked hand-off ] in
``reader/handoff.py``): the same batches in the same order as a ``StatefulDataLoader`` with as
many workers, and a position that counts rows delivered to the loop, not rows handed over:
exact under abandoned iterators, both resume paths, ``CheckpointManager`` and a real SIGKILL."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch
from conftest import Table, same_batch
from torchdata.stateful_dataloader import StatefulDataLoader

import lakeckpt_tables
from lakeckpt_tables import ChunkedLoader, Ragged
from lakeckpt_tables.checkpoint import CheckpointManager

ARGS: dict[str, Any] = {"batch_size": 7, "seed": 11, "epochs": 2, "shuffle_window": 2}


def _ids(batches: Any) -> list[list[int]]:
    return [b["id"].tolist() for b in batches]


def _reference(table: Table, workers: int = 2, **kwargs: Any) -> list[list[int]]:
    loader = StatefulDataLoader(table.dataset(**{**ARGS, **kwargs}), batch_size=None,
                                num_workers=workers)
    return _ids(loader)


@pytest.fixture(scope="module")
def reference(delta_table: Table) -> list[list[int]]:
    """Batch ids of a StatefulDataLoader with 2 workers: the order to match."""
    return _reference(delta_table)


def _chunked(table: Table, chunk_rows: int = 30, **kwargs: Any) -> ChunkedLoader:
    return ChunkedLoader(table.dataset(**{**ARGS, **kwargs}), num_workers=2,
                         chunk_rows=chunk_rows)


@pytest.mark.parametrize("rank", [0, 1])
def test_chunks_give_the_batches_and_order_of_a_stateful_dataloader(
    delta_table: Table, rank: int,
) -> None:
    ranks = {"rank": rank, "world_size": 2}
    assert _ids(_chunked(delta_table, **ranks)) == _reference(delta_table, **ranks)


@pytest.mark.parametrize("chunk_rows", [1, 50])
def test_workers_that_run_dry_at_different_times_keep_the_loader_order(
    delta_table: Table, chunk_rows: int,
) -> None:
    # 387 rows over 4 slices (96, 97, 97, 97) in batches of 32, no lockstep: worker 0 has 3
    # batches an epoch, the others 4, so it runs dry first; chunks of 1 or 2 batches
    args = {"batch_size": 32, "seed": 2, "shuffle_window": 3, "epochs": 2}
    loader = StatefulDataLoader(delta_table.dataset(**args), batch_size=None, num_workers=4)
    expected = _ids(loader)
    assert len(expected) == 2 * (3 + 4 + 4 + 4)  # worker 0 has one batch less, each epoch
    chunked = ChunkedLoader(delta_table.dataset(**args), num_workers=4, chunk_rows=chunk_rows)
    it = iter(chunked)
    head = [next(it)["id"].tolist() for _ in range(17)]
    state = chunked.state_dict()
    assert head + _ids(it) == expected
    resumed = ChunkedLoader(delta_table.dataset(**args), num_workers=4, chunk_rows=chunk_rows)
    resumed.load_state_dict(state)
    assert head + _ids(resumed) == expected


def test_the_position_counts_rows_delivered_not_rows_handed_over(delta_table: Table) -> None:
    loader = _chunked(delta_table, chunk_rows=10_000, epochs=1)  # a whole slice per chunk
    it = iter(loader)
    delivered = [next(it)["id"].tolist() for _ in range(5)]  # 3 from worker 0, 2 from 1
    state = loader.state_dict()["dataset_state"]
    assert state["slices"] == [[0, 21], [0, 14]]
    assert sum(len(b) for b in delivered) == 35


@pytest.mark.parametrize("stop", [1, 55, 112])
def test_an_abandoned_iterator_resumes_exactly_where_the_loop_stood(
    delta_table: Table, stop: int, reference: list[list[int]],
) -> None:
    assert len(reference) == 112
    loader = _chunked(delta_table)
    it = iter(loader)
    head = [next(it)["id"].tolist() for _ in range(stop)]
    state = loader.state_dict()
    del it
    resumed = _chunked(delta_table)
    resumed.load_state_dict(state)
    assert head + _ids(resumed) == reference  # every row once, in the uninterrupted order


def test_its_state_resumes_a_stateful_dataloader_and_another_worker_count(
    delta_table: Table, reference: list[list[int]],
) -> None:
    loader = _chunked(delta_table)
    it = iter(loader)
    head = [next(it)["id"].tolist() for _ in range(40)]
    state = loader.state_dict()
    del it
    for workers in (2, 0):
        dataset = delta_table.dataset(**ARGS)
        dataset.load_state_dict(state)
        rest = _ids(StatefulDataLoader(dataset, batch_size=None, num_workers=workers))
        if workers == 2:
            assert head + rest == reference
        got = sorted(i for b in head + rest for i in b)
        assert got == sorted(delta_table.ids.tolist() * 2)  # two epochs, each row once in each


def test_checkpoint_manager_saves_and_restores_a_chunked_loader(
    delta_table: Table, tmp_path: Path, reference: list[list[int]],
) -> None:
    loader = _chunked(delta_table)
    it = iter(loader)
    head = [next(it)["id"].tolist() for _ in range(33)]
    CheckpointManager(tmp_path, "chunks").save(33, dataloader=loader)
    del it
    resumed = _chunked(delta_table)
    assert CheckpointManager(tmp_path, "chunks").restore(dataloader=resumed) == 33
    assert head + _ids(resumed) == reference


_KILLED_JOB = textwrap.dedent("""
    import json, os, sys, time
    from lakeckpt_tables import DeltaSource, LakeDataset
    from lakeckpt_tables.reader.handoff import ChunkedLoader
    uri, out, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    loader = ChunkedLoader(LakeDataset(DeltaSource(uri), columns=["id", "tokens"], **args),
                           num_workers=2, chunk_rows=30)
    with open(out + "/ids.jsonl", "a") as log:
        for n, batch in enumerate(loader, 1):
            log.write(json.dumps(batch["id"].tolist()) + "\\n")
            log.flush()
            if n % 5 == 0:  # a checkpoint: the batches logged so far are trained for good
                with open(out + "/state.tmp", "w") as f:
                    json.dump({"state": loader.state_dict(), "logged": n}, f)
                os.replace(out + "/state.tmp", out + "/state.json")
            time.sleep(0.02)  # a training step: the kill lands mid-pass
""")


@pytest.mark.timeout(60)
def test_a_sigkilled_job_resumes_from_its_last_state_exactly_once(
    delta_table: Table, tmp_path: Path, reference: list[list[int]],
) -> None:
    script = tmp_path / "job.py"
    script.write_text(_KILLED_JOB)
    cmd = [sys.executable, str(script), delta_table.location, str(tmp_path), json.dumps(ARGS)]
    job = subprocess.Popen(cmd)
    saved = tmp_path / "state.json"
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and job.poll() is None:
        if saved.exists() and json.loads(saved.read_text())["logged"] >= 10:
            break
        time.sleep(0.01)
    job.send_signal(signal.SIGKILL)
    job.wait()
    checkpoint = json.loads(saved.read_text())
    logged = (tmp_path / "ids.jsonl").read_text().splitlines()
    assert 10 <= checkpoint["logged"] < 112 and len(logged) >= checkpoint["logged"]
    # training after the last state is lost with the crash: keep the checkpointed batches
    head = [json.loads(line) for line in logged[:checkpoint["logged"]]]
    resumed = _chunked(delta_table, columns=["id", "tokens"])  # the killed job's columns
    resumed.load_state_dict(checkpoint["state"])
    assert head + _ids(resumed) == reference


def test_it_refuses_negative_workers_and_follow_mode_with_workers(delta_table: Table) -> None:
    with pytest.raises(ValueError, match="num_workers must be an int >= 0, got -1"):
        ChunkedLoader(delta_table.dataset(**ARGS), num_workers=-1)
    follower = delta_table.dataset(batch_size=7, follow=True, until_version=0)
    with pytest.raises(ValueError, match="follow=True: a chunk would wait"):
        ChunkedLoader(follower, num_workers=2)
    ChunkedLoader(follower, num_workers=0)  # in-process: nothing waits for a chunk


def test_no_workers_reads_in_process_and_resumes_exactly(delta_table: Table) -> None:
    expected = _ids(StatefulDataLoader(delta_table.dataset(**ARGS), batch_size=None))
    loader = ChunkedLoader(delta_table.dataset(**ARGS), num_workers=0)
    it = iter(loader)
    head = [next(it)["id"].tolist() for _ in range(30)]
    state = loader.state_dict()
    assert state["dataset_state"]["slices"] == [[0, 30 * 7]]  # the rows delivered, no more
    resumed = ChunkedLoader(delta_table.dataset(**ARGS), num_workers=0)
    resumed.load_state_dict(state)
    assert head + _ids(resumed) == expected
    assert sorted(i for b in expected for i in b) == sorted(delta_table.ids.tolist() * 2)


def test_a_transform_runs_in_the_main_process(
    delta_table: Table, reference: list[list[int]],
) -> None:
    pids = set()

    def transform(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        pids.add(os.getpid())
        return batch

    got = _ids(_chunked(delta_table, transform=transform))
    assert got == reference and pids == {os.getpid()}


def test_a_worker_reads_on_its_own_thread_without_read_ahead_threads(
    delta_table: Table, tmp_path: Path, reference: list[list[int]],
) -> None:
    # NOTE [ no threads in a worker ]: the forked workers inherit this wrapped read, which
    # logs the thread each row group is decoded on
    log = tmp_path / "threads.txt"
    loader = _chunked(delta_table)
    dataset = loader.dataset
    read = dataset._reader._read_unit

    def logged(unit: Any) -> pa.Table:
        import threading

        with open(log, "a") as f:
            f.write(f"{os.getpid()} {threading.current_thread().name}\n")
        return read(unit)

    dataset._reader.prefetch._read = logged  # the cache's reads go through it
    assert _ids(loader) == reference
    lines = log.read_text().split()
    assert lines and set(lines[1::2]) == {"MainThread"}  # the worker's own thread
    assert os.getpid() not in {int(p) for p in lines[0::2]} and len(set(lines[0::2])) == 2
    assert dataset.read_ahead == 2  # the dataset in this process keeps its setting


def test_a_chunk_carries_its_rows_only_not_the_window_it_was_cut_from() -> None:
    import pickle

    import numpy as np
    import pyarrow as pa

    from lakeckpt_tables.reader.handoff import _concat

    window = pa.table({"id": np.arange(200_000), "t": pa.array([[1, 2]] * 200_000)})
    for parts in ([window.slice(10, 1000)], [window.slice(10, 500), window.slice(900, 500)]):
        chunk = _concat(parts)
        assert chunk.column("id").to_pylist() == [i for p in parts for i in p["id"].to_pylist()]
        assert len(pickle.dumps(chunk, protocol=5)) < 2 * 1000 * (8 + 2 * 8 + 4)


# ------------------------------------------------------------ tensors handed over, batches cut

ALL = ["id", "x", "vec", "tokens", "name"]


@pytest.mark.parametrize(("batch_size", "output"), [(1, "torch"), (2, "torch"), (7, "arrow")])
def test_every_column_type_comes_out_as_the_datasets_batches_type_for_type(
    delta_table: Table, batch_size: int, output: str,
) -> None:
    # batch 1: every tokens batch is 2-D, of widths 0-3 (a list column of 2-D batches that
    # differ); batch 2: tokens Ragged or 2-D; vec always 2-D; name a list of str
    args = {**ARGS, "columns": ALL, "batch_size": batch_size, "output": output, "epochs": 1}
    expected = list(StatefulDataLoader(delta_table.dataset(**args), batch_size=None,
                                       num_workers=2))
    got = list(ChunkedLoader(delta_table.dataset(**args), num_workers=2, chunk_rows=40))
    assert len(got) == len(expected)
    assert all(same_batch(a, b) for a, b in zip(got, expected, strict=True))
    if output == "torch":
        kinds = {(type(b["tokens"]), b["tokens"].dim() if isinstance(b["tokens"], torch.Tensor)
                  else 1) for b in got}
        assert kinds == ({(torch.Tensor, 2)} if batch_size == 1
                         else {(Ragged, 1), (torch.Tensor, 2)})
        assert {tuple(b["tokens"].shape[1:]) for b in got
                if isinstance(b["tokens"], torch.Tensor)} >= ({(0,), (3,)} if batch_size == 1
                                                               else set())


def test_a_worker_hands_over_shared_memory_tensors_and_batches_are_views_of_them(
    delta_table: Table,
) -> None:
    loader = ChunkedLoader(delta_table.dataset(**{**ARGS, "columns": ["id", "vec", "tokens"]}),
                           num_workers=2, chunk_rows=10_000)
    batches = list(itertools.islice(loader, 14))  # workers alternate: even ones from worker 0
    for b in batches:
        tokens = b["tokens"]
        tensors = [b["id"], b["vec"]] + (list(tokens) if isinstance(tokens, Ragged)
                                         else [tokens])
        assert all(t.is_shared() for t in tensors)  # converted in the worker, not pickled
    # worker 0's chunks hold 1, 2, then 4 batches: batches 6, 8, 10 and 12 are its third.
    # One chunk converted once, in one storage: every batch of every column is a view of it
    third = batches[6::2]
    tensors = [t for b in third for t in (b["id"], b["vec"], *(
        b["tokens"] if isinstance(b["tokens"], Ragged) else (b["tokens"],)))]
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
    other = batches[4]["id"].untyped_storage().data_ptr()  # worker 0's second chunk
    assert other != tensors[0].untyped_storage().data_ptr()
    for name, width in (("id", 1), ("vec", 3)):
        step = third[1][name].storage_offset() - third[0][name].storage_offset()
        assert step == 7 * width  # the next batch starts where this one ends
    ragged = [b["tokens"] for b in batches if isinstance(b["tokens"], Ragged)]
    assert ragged and all(int(r.offsets[0]) == 0 and int(r.offsets[-1]) == len(r.values)
                          for r in ragged)


def test_packed_list_batches_cut_back_to_themselves() -> None:
    from lakeckpt_tables.reader.arena import pack

    parts = [
        {"t": Ragged(torch.tensor([5, 6, 7], dtype=torch.int32), torch.tensor([0, 0, 1, 3])),
         "s": ["a", "b", "c"], "v": torch.ones(3, 2)},
        {"t": torch.tensor([[8, 9], [10, 11]], dtype=torch.int32), "s": ["d", "e"],
         "v": torch.zeros(2, 2)},
        {"t": torch.zeros(2, 0, dtype=torch.int32), "s": ["f", "g"], "v": torch.ones(2, 2)},
        {"t": Ragged(torch.tensor([12], dtype=torch.int32), torch.tensor([0, 1, 1])),
         "s": ["h", "i"], "v": torch.full((2, 2), 3.0)},
    ]
    packed = pack(parts)
    lo = 0
    for j, part in enumerate(parts):
        hi = lo + len(part["s"])
        cut = {name: column.cut(j, lo, hi) for name, column in packed.items()}
        assert same_batch(cut, part)
        lo = hi
    assert packed["t"].values.tolist() == [5, 6, 7, 8, 9, 10, 11, 12]  # type: ignore[union-attr]


def _nulls_table(tmp_path: Path) -> str:
    import decimal

    from deltalake import write_deltalake

    ids = list(range(40))
    table = pa.table({
        "id": pa.array(ids, pa.int64()),
        "label": pa.array([None if i % 3 == 0 else i for i in ids], pa.int32()),
        "flag": pa.array([None if i % 5 == 0 else bool(i % 2) for i in ids], pa.bool_()),
        "dec": pa.array([decimal.Decimal(f"{i}.5") if i % 4 else None for i in ids],
                        pa.decimal128(8, 1)),
        "raw": pa.array([bytes([i]) for i in ids], pa.binary()),
    })
    uri = str(tmp_path / "nulls")
    write_deltalake(uri, table.slice(0, 23))
    write_deltalake(uri, table.slice(23), mode="append")
    return uri


@pytest.mark.parametrize("nulls", ["fill", "mask"])
def test_null_policies_decimals_and_bytes_match_the_dataset(tmp_path: Path, nulls: str) -> None:
    from lakeckpt_tables import DeltaSource, LakeDataset

    uri = _nulls_table(tmp_path)

    def dataset() -> LakeDataset:
        return LakeDataset(DeltaSource(uri), columns=["id", "label", "flag", "dec", "raw"],
                           nulls=nulls, decimals="float64", batch_size=3, seed=5)  # type: ignore[arg-type]

    expected = list(StatefulDataLoader(dataset(), batch_size=None, num_workers=2))
    got = list(ChunkedLoader(dataset(), num_workers=2, chunk_rows=8))
    assert all(same_batch(a, b) for a, b in zip(got, expected, strict=True))
    assert len(got) == len(expected) == 14  # 20 and 20 rows over 2 workers: 7 batches each
    assert ("label__is_null" in got[0]) == (nulls == "mask")
    assert sorted(i for b in got for i in b["id"].tolist()) == list(range(40))


def test_pin_memory_is_accepted_and_changes_no_batch(delta_table: Table) -> None:
    import warnings

    args = {**ARGS, "columns": ALL}
    plain = list(ChunkedLoader(delta_table.dataset(**args), num_workers=2, chunk_rows=40))
    with warnings.catch_warnings():  # no accelerator here: torch turns pinning off, warning
        warnings.filterwarnings("ignore", message=".*pin_memory.*")
        pinned = list(ChunkedLoader(delta_table.dataset(**args), num_workers=2, chunk_rows=40,
                                    pin_memory=True))
    assert len(pinned) == len(plain) == 112
    assert all(same_batch(a, b) for a, b in zip(pinned, plain, strict=True))
    if torch.accelerator.is_available():  # the chunk is pinned once; batches are its views
        assert all(b["id"].is_pinned() for b in pinned)
        assert all(b["tokens"].values.is_pinned() for b in pinned
                   if isinstance(b["tokens"], Ragged))


def test_chunked_loader_is_a_public_name() -> None:
    from lakeckpt_tables.reader import handoff

    assert "ChunkedLoader" in lakeckpt_tables.__all__ and "ChunkedLoader" in dir(lakeckpt_tables)
    assert lakeckpt_tables.ChunkedLoader is handoff.ChunkedLoader


def test_a_workers_first_chunks_grow_from_one_batch_to_chunk_rows(delta_table: Table) -> None:
    from torch.utils.data import DataLoader

    from lakeckpt_tables.reader.handoff import _as_is, _Chunks

    dataset = delta_table.dataset(batch_size=5, shuffle=False)  # 387 rows: 77 batches and 1
    loader = DataLoader(_Chunks(dataset, chunk_rows=40), batch_size=None, num_workers=1,
                        collate_fn=_as_is, multiprocessing_context="fork")
    sizes = [chunk.rows for chunk in loader]
    assert sizes[0] == []  # the start state, before any batch
    assert [sum(r) for r in sizes[1:5]] == [5, 10, 20, 40]  # the first batch waits for one
    assert all(sum(r) == 40 for r in sizes[4:-1]) and sum(map(sum, sizes)) == 387


def test_populating_a_fresh_chunk_storage_keeps_it_zero_and_a_refused_call_is_harmless() -> None:
    from lakeckpt_tables.reader.arena import populate

    storage = torch.UntypedStorage._new_shared(1 << 20)  # type: ignore[no-untyped-call]
    populate(storage.data_ptr(), 1 << 20)
    data = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (1 << 20,), (1,))
    assert not data.any()
    data[-1] = 7  # still writable, and the write lands
    assert int(data.sum()) == 7
    populate(storage.data_ptr() + 1, 100)  # not page-aligned: the kernel refuses, no error


def test_a_worker_error_stops_every_worker_before_it_reaches_the_loop(tmp_path: Path) -> None:
    """A data file gone after the snapshot was pinned: the worker's named error reaches the loop
    and the workers are already stopped (torch's re-raise holds the DataLoader's iterator in a
    reference cycle; left to the garbage collector, its shutdown waits 5 s per worker)."""
    import multiprocessing

    from conftest import file_ranges, write_delta

    from lakeckpt_tables import DeltaSource, LakeDataset
    from lakeckpt_tables.errors import PinnedFileMissingError

    uri = tmp_path / "rows"
    write_delta(uri, file_ranges())
    dataset = LakeDataset(DeltaSource(str(uri)), columns=["id"], batch_size=7)
    for data in uri.glob("*.parquet"):
        data.unlink()
    before = set(multiprocessing.active_children())
    with pytest.raises(PinnedFileMissingError, match=r"\.parquet of the pinned version is gone"):
        list(ChunkedLoader(dataset, num_workers=2))
    assert set(multiprocessing.active_children()) <= before
