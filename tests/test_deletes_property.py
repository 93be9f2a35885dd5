"""Property: a ``deletes="honor"`` run interleaved with deletes (deletion vectors or Iceberg
position-delete files, and copy-on-write), updates, appends and crashes, on Delta and Iceberg,
against the tables' own readers (deltalake's kernel ``scan()``, pyiceberg) at every version:
every row delivered at most once, none after the first checkpoint that followed its deletion,
every row of the pin the table still holds delivered exactly once, and the ledger's
exclusions exactly the pinned rows the table deleted (NOTE [ deletions honored ])."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import loader_for, sql_catalog
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lakeckpt_tables import DeltaSource, IcebergSource, LakeDataset
from lakeckpt_tables.audit import verify
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.tools.bench.tables import write_deletion_vectors

FILES, ROWS, EVERY = 3, 30, 3  # rows per file; a checkpoint every EVERY batches
ACTIONS = ("vectors", "rewrite", "update", "append", "crash", "none")


class _Delta:
    def __init__(self, root: Path) -> None:
        from deltalake import write_deltalake

        self.uri = str(root / "t")
        for f in range(FILES):
            ids = np.arange(f * ROWS, (f + 1) * ROWS)
            write_deltalake(self.uri, pa.table({"id": ids, "user": ids % 7}), mode="append",
                            configuration=({"delta.enableDeletionVectors": "true"}
                                           if f == 0 else None))

    def source(self) -> Any:
        return DeltaSource(self.uri)

    def ids(self) -> set[int]:
        from deltalake import DeltaTable

        return set(pa.table(DeltaTable(self.uri).scan()).column("id").to_pylist())

    def versions(self) -> list[set[int]]:
        """The ids of every version, oldest first (deltalake's kernel scan)."""
        from deltalake import DeltaTable

        latest = DeltaTable(self.uri).version()
        return [set(pa.table(DeltaTable(self.uri, version=v).scan()).column("id").to_pylist())
                for v in range(latest + 1)]

    def vectors(self, ids: set[int]) -> None:
        from deltalake import DeltaTable

        deleted = {}
        for add in pa.table(DeltaTable(self.uri).get_add_actions(flatten=True)).to_pylist():
            file_ids = pq.read_table(f"{self.uri}/{add['path']}").column("id").to_numpy()
            hit = np.flatnonzero(np.isin(file_ids, sorted(ids)))
            if len(hit):
                deleted[add["path"]] = hit
        if deleted:
            write_deletion_vectors(self.uri, deleted)

    def rewrite(self, ids: set[int]) -> None:
        from deltalake import DeltaTable

        DeltaTable(self.uri).delete(f"id IN ({', '.join(map(str, sorted(ids)))})")

    def update(self, ids: set[int]) -> None:
        from deltalake import DeltaTable

        DeltaTable(self.uri).update({"user": "user + 100"},
                                    predicate=f"id IN ({', '.join(map(str, sorted(ids)))})")

    def append(self, first: int) -> None:
        from deltalake import write_deltalake

        ids = np.arange(first, first + 5)
        write_deltalake(self.uri, pa.table({"id": ids, "user": ids % 7}), mode="append")


class _Iceberg:
    def __init__(self, root: Path) -> None:
        from pyiceberg.schema import Schema
        from pyiceberg.types import LongType, NestedField

        self.root = root
        self.catalog = sql_catalog(root)
        self.catalog.create_namespace("ns")
        schema = Schema(NestedField(1, "id", LongType(), required=False),
                        NestedField(2, "user", LongType(), required=False))
        table = self.catalog.create_table("ns.t", schema=schema,
                                          properties={"format-version": "2"})
        for f in range(FILES):
            ids = np.arange(f * ROWS, (f + 1) * ROWS)
            table.append(pa.table({"id": ids, "user": ids % 7}))
        self.written = 0

    def source(self) -> Any:
        return IcebergSource("ns.t", catalog=self.catalog)

    def ids(self) -> set[int]:
        return set(self.catalog.load_table("ns.t").scan().to_arrow().column("id").to_pylist())

    def versions(self) -> list[set[int]]:
        """The ids of every snapshot, oldest first (pyiceberg)."""
        table = self.catalog.load_table("ns.t")
        return [set(table.scan(snapshot_id=e.snapshot_id).to_arrow().column("id").to_pylist())
                for e in table.metadata.snapshot_log]

    def vectors(self, ids: set[int]) -> None:
        from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
        from pyiceberg.typedef import Record

        table = self.catalog.load_table("ns.t")
        paths, positions = [], []
        for task in table.scan().plan_files():
            file_ids = pq.read_table(task.file.file_path.removeprefix("file://")).column(
                "id").to_numpy()
            for pos in np.flatnonzero(np.isin(file_ids, sorted(ids))).tolist():
                paths.append(task.file.file_path)
                positions.append(pos)
        if not paths:
            return
        self.written += 1
        path = self.root / f"deletes-{self.written}.parquet"
        schema = pa.schema([
            pa.field("file_path", pa.string(), metadata={b"PARQUET:field_id": b"2147483546"}),
            pa.field("pos", pa.int64(), metadata={b"PARQUET:field_id": b"2147483545"})])
        pq.write_table(pa.table([pa.array(paths), pa.array(positions, pa.int64())],
                                schema=schema), str(path))
        data_file = DataFile.from_args(content=DataFileContent.POSITION_DELETES,
                                       file_path=f"file://{path}",
                                       file_format=FileFormat.PARQUET, partition=Record(),
                                       record_count=len(paths),
                                       file_size_in_bytes=path.stat().st_size)
        data_file.spec_id = table.metadata.default_spec_id
        with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
            append.append_data_file(data_file)

    def rewrite(self, ids: set[int]) -> None:
        from pyiceberg.expressions import In

        self.catalog.load_table("ns.t").delete(In("id", sorted(ids)))

    def update(self, ids: set[int]) -> None:
        from pyiceberg.expressions import In

        table = self.catalog.load_table("ns.t")
        rows = table.scan(row_filter=In("id", sorted(ids))).to_arrow()
        if rows.num_rows:
            table.overwrite(rows.set_column(1, "user", pa.compute.add(rows["user"], 100)),
                            overwrite_filter=In("id", sorted(ids)))

    def append(self, first: int) -> None:
        ids = np.arange(first, first + 5)
        self.catalog.load_table("ns.t").append(pa.table({"id": ids, "user": ids % 7}))


def _ids_of(ranges: list[list[Any]]) -> set[int]:
    out: set[int] = set()
    for path, group, first, end in ranges:
        ids = pq.ParquetFile(path).read_row_group(group, columns=["id"]).column(0).to_pylist()
        out.update(ids[first:end])
    return out


def _run(table: Any, root: Path, actions: list[tuple[str, frozenset[int]]]) -> None:
    pinned, pin = table.ids(), len(table.versions()) - 1

    def dataset() -> LakeDataset:
        return LakeDataset(table.source(), batch_size=8, seed=3, unit_rows=16, shuffle_window=2,
                           deletes="honor", deletes_key="id")

    manager = CheckpointManager(root / "ck", "run")
    loader = loader_for(dataset(), 0)
    batches: list[list[int]] = []
    applied_at: dict[int, int] = {}  # deleted id -> the first checkpoint after its deletion
    pending: set[int] = set()
    todo = list(actions)
    it = iter(loader)
    appended = 1000
    while True:
        batch = next(it, None)
        if batch is None:
            break
        batches.append(batch["id"].tolist())
        if len(batches) % EVERY:
            continue
        manager.save(len(batches), dataloader=loader)
        applied_at.update((i, len(batches)) for i in pending - set(applied_at))
        pending = set()
        if not todo:
            continue
        action, ids = todo.pop(0)
        before, known = table.ids(), len(table.versions())
        if action == "crash":  # one more batch trained, lost: a new job restores
            next(it, None)
            manager = CheckpointManager(root / "ck", "run")
            loader = loader_for(dataset(), 0)
            assert manager.restore(dataloader=loader) == len(batches)
            it = iter(loader)
        elif action == "append":
            table.append(appended)
            appended += 5
        elif action != "none":
            getattr(table, action)(set(ids) & before)
        # a pinned row absent from any version since is deleted: each version, by its reader
        pending |= {i for seen in table.versions()[known:] for i in pinned - seen}
    manager.save(len(batches) + 1, dataloader=loader)  # the end: nothing read since
    applied_at.update((i, len(batches)) for i in pending - set(applied_at))
    ids = [i for b in batches for i in b]
    assert len(ids) == len(set(ids))  # at most once
    for i, step in applied_at.items():  # none after the checkpoint that applied it
        assert not any(i in b for b in batches[step:]), (i, step)
    final = pinned - {i for seen in table.versions()[pin:] for i in pinned - seen}
    assert set(ids) - set(applied_at) == final  # every row the table kept, exactly once
    assert set(ids) <= pinned
    assert manager.ledger is not None
    excluded = [json.loads(r["detail"]) for r in manager.ledger.to_arrow().to_pylist()
                if r["event"] == "excluded"]
    assert _ids_of([r for e in excluded for r in e["deleted"]]) == pinned - final, [
        (e["version"], sorted(_ids_of(e["deleted"]))) for e in excluded]
    (verdict,) = verify(root / "ck", source=table.source())
    assert verdict.ok and verdict.finished_passes == [(0, 0)], verdict.violations


_EVERY_KIND = [("vectors", frozenset({1, 2, 40})), ("rewrite", frozenset({3, 50, 61})),
               ("crash", frozenset({1})), ("update", frozenset({4, 41}))]
"""Deletion vectors (position deletes), a copy-on-write delete, a crash and an update: one
example of each kind whatever hypothesis draws."""

_STEPS = st.lists(st.tuples(st.sampled_from(ACTIONS),
                            st.frozensets(st.integers(0, FILES * ROWS - 1), min_size=1,
                                          max_size=6)), min_size=2, max_size=4)


@pytest.mark.timeout(300)
@settings(max_examples=3, deadline=None)
@given(actions=_STEPS)
@example(actions=_EVERY_KIND)
def test_a_delta_run_honors_every_deletion_exactly(tmp_path_factory: pytest.TempPathFactory,
                                                    actions: list[tuple[str, frozenset[int]]]
                                                    ) -> None:
    root = tmp_path_factory.mktemp("delta")
    _run(_Delta(root), root, actions)


@pytest.mark.timeout(300)
@settings(max_examples=2, deadline=None)
@given(actions=_STEPS)
@example(actions=[*_EVERY_KIND, ("append", frozenset({0}))])
def test_an_iceberg_run_honors_every_deletion_exactly(tmp_path_factory: pytest.TempPathFactory,
                                                      actions: list[tuple[str, frozenset[int]]]
                                                      ) -> None:
    root = tmp_path_factory.mktemp("iceberg")
    _run(_Iceberg(root), root, actions)
