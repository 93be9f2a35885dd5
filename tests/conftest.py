"""Shared fixtures and helpers of the reader tests: real Delta and Iceberg tables on local disk.

Every table has a unique int64 row id column ``id``; tests prove exactly-once and determinism
by comparing id sequences row for row. Tables are built once per module (module-scoped
fixtures); tests vary only reader parameters.

The helpers below are imported by the reader test modules (``from conftest import ...``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import settings

from lakeckpt_tables import DeltaSource, IcebergSource, LakeDataset
from lakeckpt_tables.plan import DEFAULT_SHUFFLE_WINDOW, EpochPlan, PlanPolicy

# CI runs the same examples every time (no flakes); HYPOTHESIS_PROFILE=explore draws new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ROW_GROUP_ROWS = 17
"""Rows per Parquet row group of the test tables: several row groups per file."""

FILE_ROWS = (90, 61, 113, 47, 76)
"""Rows of each data file (one append each): uneven, so row groups and files never align."""

ICEBERG_IDENTIFIER = "lakeckpt_test.rows"


def rows_table(lo: int, hi: int) -> pa.Table:
    """Rows with ids ``[lo, hi)``: numeric, fixed-length list, variable-length list, string."""
    ids = np.arange(lo, hi, dtype=np.int64)
    vec = [[float(i), float(i) + 0.25, float(i) + 0.5] for i in ids]
    tokens = [list(range(int(i), int(i) + int(i) % 4)) for i in ids]
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "x": pa.array(ids * 0.5, pa.float64()),
        "vec": pa.array(vec, pa.list_(pa.float32())),
        "tokens": pa.array(tokens, pa.list_(pa.int64())),
        "name": pa.array([f"row-{i}" for i in ids], pa.string()),
    })


def file_ranges(sizes: Sequence[int] = FILE_ROWS, start: int = 0) -> list[tuple[int, int]]:
    bounds = np.concatenate([[start], start + np.cumsum(sizes)])
    return [(int(a), int(b)) for a, b in itertools.pairwise(bounds)]


def write_delta(uri: str | Path, ranges: Iterable[tuple[int, int]], **kwargs: Any) -> None:
    """One append (so one data file) per id range, ``ROW_GROUP_ROWS`` rows per row group."""
    from deltalake import WriterProperties, write_deltalake

    props = WriterProperties(max_row_group_size=ROW_GROUP_ROWS, write_batch_size=ROW_GROUP_ROWS)
    for lo, hi in ranges:
        write_deltalake(str(uri), rows_table(lo, hi), mode="append", writer_properties=props,
                        **kwargs)


def write_one_row_group(uri: str | Path, rows: int) -> str:
    """ids ``0..rows-1`` (column ``id`` only) as one file of one row group: a range of rows
    is its ids."""
    from deltalake import WriterProperties, write_deltalake

    props = WriterProperties(max_row_group_size=rows, write_batch_size=rows)
    write_deltalake(str(uri), pa.table({"id": np.arange(rows, dtype=np.int64)}),
                    writer_properties=props)
    return str(uri)


def same_batch(a: Any, b: Any) -> bool:
    """Equal values of the same type, dtype and shape (2-D stays 2-D, Ragged stays Ragged)."""
    import torch

    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_batch(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_batch(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, pa.RecordBatch):
        return bool(a.equals(b))
    return bool(a == b)


def sql_catalog(root: Path) -> Any:
    """A pyiceberg SqlCatalog on SQLite with its warehouse under ``root``."""
    from pyiceberg.catalog.sql import SqlCatalog

    root.mkdir(parents=True, exist_ok=True)
    return SqlCatalog("lakeckpt_test", uri=f"sqlite:///{root}/catalog.db",
                      warehouse=f"file://{root}/warehouse")


def write_iceberg(catalog: Any, identifier: str, ranges: Iterable[tuple[int, int]]) -> Any:
    """Create ``identifier`` and append one data file per id range."""
    namespace = identifier.rsplit(".", 1)[0]
    catalog.create_namespace_if_not_exists(namespace)
    table = catalog.create_table(
        identifier, schema=rows_table(0, 1).schema,
        properties={"write.parquet.row-group-limit": str(ROW_GROUP_ROWS)})
    for lo, hi in ranges:
        table.append(rows_table(lo, hi))
    return table


def pytest_configure(config: pytest.Config) -> None:
    # CheckpointManager registers every run in the default catalog (~/.lakeckpt): tests do not,
    # except the registry tests, which turn it back on against their own catalogs.
    import os

    os.environ.setdefault("LAKECKPT_REGISTRY", "off")
    # torchdata calls the deprecated torch.set_vital for every StatefulDataLoader.
    config.addinivalue_line("filterwarnings", "ignore:.*set_vital.*:UserWarning")


@dataclass
class Table:
    """A test table: how to open it as a fresh source, and which ids it holds."""

    kind: str
    make_source: Callable[[], Any]
    ids: np.ndarray[Any, Any]
    location: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return len(self.ids)

    def dataset(self, **kwargs: Any) -> LakeDataset:
        kwargs.setdefault("columns", ["id"])
        return LakeDataset(self.make_source(), **kwargs)


@pytest.fixture(scope="module")
def delta_table(tmp_path_factory: pytest.TempPathFactory) -> Table:
    uri = tmp_path_factory.mktemp("delta") / "rows"
    ranges = file_ranges()
    write_delta(uri, ranges)
    ids = np.arange(ranges[0][0], ranges[-1][1], dtype=np.int64)
    return Table("delta", lambda: DeltaSource(str(uri)), ids, str(uri))


@pytest.fixture(scope="module")
def iceberg_table(tmp_path_factory: pytest.TempPathFactory) -> Table:
    root = tmp_path_factory.mktemp("iceberg")
    catalog = sql_catalog(root)
    ranges = file_ranges()
    write_iceberg(catalog, ICEBERG_IDENTIFIER, ranges)
    ids = np.arange(ranges[0][0], ranges[-1][1], dtype=np.int64)
    return Table("iceberg", lambda: IcebergSource(ICEBERG_IDENTIFIER, catalog=catalog), ids,
                 str(root), {"catalog": catalog})


@pytest.fixture(scope="module", params=["delta", "iceberg"])
def source(request: pytest.FixtureRequest) -> Table:
    """The same behaviour suite over both table formats."""
    table: Table = request.getfixturevalue(f"{request.param}_table")
    return table


# ------------------------------------------------------------------------------ helpers


def loader_for(dataset: LakeDataset, workers: int) -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(dataset, batch_size=None, num_workers=workers)


def take(loader: Any, limit: int | None = None) -> list[list[int]]:
    """The id column of the next ``limit`` batches (all when None), without fetching more."""
    return [batch["id"].tolist() for batch in itertools.islice(loader, limit)]


@contextlib.contextmanager
def raised_in_workers(expected: type[BaseException], match: str) -> Iterator[None]:
    """``pytest.raises`` for an error a DataLoader worker raised, then the workers shut down.

    torch re-raises a worker's error from a frame that holds it, so the error, its traceback
    and the loader's iterator form a reference cycle. The cyclic garbage collector clears the
    weak references of the iterator's queues before the iterator's ``__del__`` runs, so their
    feeder threads have ended when ``__del__`` sends each worker its stop signal: it waits 5 s
    per worker before terminating it, inside whichever later test the collector ran in. So the
    workers are shut down here, and the finished frames cleared to break the cycle (it also
    held every loader of the test's frame).
    """
    with pytest.raises(expected, match=match) as info:
        yield
    tb = info.tb
    while tb is not None:
        # only the loader's frames: f_locals caches a snapshot of a frame's locals on it, and
        # a snapshot of the re-raising frame (or of this one) would hold the error again
        if tb.tb_frame.f_code.co_filename.endswith("dataloader.py"):
            owner = tb.tb_frame.f_locals.get("self")
            if callable(getattr(owner, "_shutdown_workers", None)):
                owner._shutdown_workers()
        tb = tb.tb_next
    traceback.clear_frames(info.tb)
    del info  # this frame is in the traceback too


def flat(batches: Iterable[Sequence[int]]) -> list[int]:
    return [i for batch in batches for i in batch]


def canonical_unit_ids(table: Table) -> list[np.ndarray[Any, Any]]:
    """Ids of every unit of the table's latest snapshot, in canonical unit order (by reading
    each row group with pyarrow: an oracle independent of the reader)."""
    snap = table.make_source().snapshot()
    out = []
    for unit in snap.units:
        rg = pq.ParquetFile(unit.path).read_row_group(unit.row_group, columns=["id"])
        out.append(rg.column("id").to_numpy())
    return out


def plan_for(table: Table, *, batch_size: int, world_size: int = 1, workers: int = 1,
             shuffle: bool = True, seed: int = 0,
             shuffle_window: int = DEFAULT_SHUFFLE_WINDOW,
             epoch: int = 0) -> EpochPlan:
    """The plan a LakeDataset with these parameters follows for ``epoch`` (fresh start)."""
    snap = table.make_source().snapshot()
    policy = PlanPolicy(batch_size=batch_size, world_size=world_size, workers=workers,
                        shuffle=shuffle, seed=seed, shuffle_window=shuffle_window)
    return EpochPlan([u.rows for u in snap.units], policy, epoch=epoch)


def base_ids(plan: EpochPlan, unit_ids: Sequence[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    """Ids of the plan's base row space: units in the epoch's order, end to end."""
    return np.concatenate([unit_ids[int(u)] for u in plan.order])


def tail_ids(plan: EpochPlan, unit_ids: Sequence[np.ndarray[Any, Any]]) -> list[int]:
    """Ids the plan reports as the epoch's undelivered tail."""
    ids = base_ids(plan, unit_ids)
    return [int(i) for piece in plan.tail() for i in ids[piece.rows()]]


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants: torchrun starts each rank in a session of its own, so
    killing an agent's process group would leave its ranks running."""
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):  # the task ended meanwhile
            children += [int(c) for c in (task / "children").read_text().split()]
    return [pid] + [p for child in children for p in process_tree(child)]


def lose_machine(pid: int) -> None:
    """SIGKILL ``pid`` (a torchrun agent, say) and every process under it at once, as a lost
    machine would."""
    for each in process_tree(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)
