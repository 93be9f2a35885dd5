"""Whole-file units (NOTE [ lazy footers ] in sources/lazy.py): pinned from metadata row counts
without reading a footer, read row for row as the format's own reader reads them (deletion
vectors, positional deletes), a part's rows mapped to the row groups that hold them, resumed
exactly mid-file; states of row-group units resume as before."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from conformance import compare, delta_references, read_all
from conftest import loader_for, write_delta
from test_tables_iceberg import _add_file, _partitioned, _write_data_file

from lakeckpt_tables import DeltaSource, IcebergSource, LakeDataset
from lakeckpt_tables.errors import RowCountMismatchError, StateMismatchError
from lakeckpt_tables.sources import footers
from lakeckpt_tables.sources.lazy import WHOLE_FILE, row_group_parts
from lakeckpt_tables.types import Unit

DATA = Path(__file__).parent / "data" / "delta"


@pytest.mark.parametrize("name", ["table-with-dv-small", "table_with_deletion_logs",
                                  "checkpoint-v2-table", "table_with_column_mapping"])
def test_whole_files_pin_without_a_footer_and_read_as_deltalake_reads(name: str) -> None:
    path = str(DATA / name)
    footers.forget()
    before = footers.footer_reads()
    snap = DeltaSource(path, units="files").snapshot()
    assert footers.footer_reads() == before  # row counts from the log
    assert snap.whole_files and {u.row_group for u in snap.units} == {WHOLE_FILE}
    assert snap.rows == DeltaSource(path).snapshot().rows
    assert not compare(read_all(snap), delta_references(path, snap.version)[0])


def test_a_file_without_a_row_count_in_the_log_is_pinned_by_its_footer() -> None:
    snap = DeltaSource(str(DATA / "delta-0.8.0-null-partition"), units="files").snapshot()
    assert all(u.row_group >= 0 for u in snap.units)  # no stats: row groups, as before


def test_a_part_maps_to_the_row_groups_holding_its_live_rows() -> None:
    from lakeckpt_tables.sources._deletes import Deletes
    from lakeckpt_tables.sources.datafile import DataFile

    sizes = (4, 4, 3, 4, 5)
    deleted = [0, 3, 4, 5, 6, 7, 17, 19]  # the second row group wholly deleted
    data_file = DataFile("f", None, sum(sizes), Deletes.from_positions(deleted))
    live = [i for i in range(sum(sizes)) if i not in deleted]
    unit = Unit("f", WHOLE_FILE, len(live), data_file)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for first, end in itertools.combinations(range(len(live) + 1), 2):
        got = []
        for part, lo, hi in row_group_parts(unit, first, end, sizes):
            physical = range(int(starts[part.row_group]), int(starts[part.row_group + 1]))
            group_live = [i for i in physical if i not in deleted]
            assert part.rows == len(group_live) and 0 <= lo < hi <= part.rows
            got += group_live[lo:hi]
        assert got == live[first:end], (first, end)


def _iceberg_with_deletes(tmp_path: Path) -> tuple[Any, list[int]]:
    """40 ids in one file of 10 row groups of 4, six rows deleted by a positional delete file."""
    from pyiceberg.manifest import DataFileContent
    from pyiceberg.typedef import Record

    catalog, _ = _partitioned(tmp_path)
    data = tmp_path / "eu.parquet"
    _write_data_file(data, {"id": (1, pa.array(range(40), pa.int64()))})
    _add_file(catalog.load_table("ns.parted"), data, 40, Record("eu"))
    deleted = [0, 3, 4, 5, 17, 39]
    deletes = tmp_path / "eu-deletes.parquet"
    _write_data_file(deletes, {
        "file_path": (2147483546, pa.array([f"file://{data}"] * len(deleted), pa.string())),
        "pos": (2147483545, pa.array(deleted, pa.int64()))})
    _add_file(catalog.load_table("ns.parted"), deletes, len(deleted), Record("eu"),
              DataFileContent.POSITION_DELETES)
    return catalog, [i for i in range(40) if i not in deleted]


def test_iceberg_positional_deletes_read_exactly_by_parts_across_row_groups_and_resume(
        tmp_path: Path) -> None:
    catalog, live = _iceberg_with_deletes(tmp_path)
    footers.forget()
    before = footers.footer_reads()
    snap = IcebergSource("ns.parted", catalog=catalog, units="files").snapshot()
    assert footers.footer_reads() == before
    assert [(u.row_group, u.rows) for u in snap.units] == [(WHOLE_FILE, len(live))]
    reference = catalog.load_table("ns.parted").scan().to_arrow()
    assert not compare(read_all(snap), reference)

    def dataset(rank: int) -> LakeDataset:  # parts of 5 rows: most cross a row group
        return LakeDataset(IcebergSource("ns.parted", catalog=catalog, units="files"),
                           columns=["id"], batch_size=3, rank=rank, world_size=2, seed=5,
                           unit_rows=5)

    runs = [[b["id"].tolist() for b in loader_for(dataset(r), 0)] for r in range(2)]
    assert len(runs[0]) == len(runs[1])
    assert sorted(i for run in runs for b in run for i in b) == live
    loader = loader_for(dataset(1), 0)
    head = [b["id"].tolist() for b in itertools.islice(loader, 2)]
    state = loader.state_dict()
    assert '"units": "files"' in json.dumps(state)
    resumed = loader_for(dataset(1), 0)
    resumed.load_state_dict(state)
    assert head + [b["id"].tolist() for b in resumed] == runs[1]


def test_a_delta_deletion_vector_table_reads_exactly_once_by_parts_and_resumes_mid_file() -> None:
    path = str(DATA / "table_with_deletion_logs")
    reference = delta_references(path, DeltaSource(path).snapshot().version)[0]
    columns = reference.column_names[:2]

    def dataset() -> LakeDataset:  # one file of 98 live rows, parts of 8
        return LakeDataset(DeltaSource(path, units="files"), columns=columns, batch_size=4,
                           seed=3, unit_rows=8, output="arrow")

    whole = list(loader_for(dataset(), 0))
    assert not compare(pa.Table.from_batches(whole), reference.select(columns))
    loader = loader_for(dataset(), 0)
    head = list(itertools.islice(loader, 5))  # 20 of 98 rows: mid-file
    resumed = loader_for(dataset(), 0)
    resumed.load_state_dict(loader.state_dict())
    assert [t.to_pylist() for t in head + list(resumed)] == [t.to_pylist() for t in whole]


def test_a_row_group_state_resumes_as_before_and_a_whole_file_reader_refuses_it(
        tmp_path: Path) -> None:
    write_delta(tmp_path / "t", [(0, 90), (90, 151)])

    def dataset(units: str = "row_groups", **kw: Any) -> LakeDataset:
        source = (DeltaSource(str(tmp_path / "t"), units=units) if kw.pop("explicit", False)
                  or units != "row_groups" else DeltaSource(str(tmp_path / "t")))
        return LakeDataset(source, columns=["id"], batch_size=8, seed=1, **kw)

    whole = [b["id"].tolist() for b in loader_for(dataset(), 0)]
    loader = loader_for(dataset(), 0)
    head = [b["id"].tolist() for b in itertools.islice(loader, 3)]
    state = loader.state_dict()
    assert '"units"' not in json.dumps(state)  # as every state written before
    resumed = loader_for(dataset(explicit=True), 0)
    resumed.load_state_dict(state)
    assert head + [b["id"].tolist() for b in resumed] == whole
    refused = loader_for(dataset("files"), 0)
    refused.load_state_dict(state)
    with pytest.raises(StateMismatchError, match="units"):
        next(iter(refused))


def test_a_footer_disagreeing_with_the_log_is_refused_when_its_file_is_read(
        tmp_path: Path) -> None:
    table = tmp_path / "t"
    write_delta(table, [(0, 30)])
    log = next((table / "_delta_log").glob("*.json"))
    log.write_text(log.read_text().replace('\\"numRecords\\":30', '\\"numRecords\\":31'))
    assert '\\"numRecords\\":31' in log.read_text()
    with pytest.raises(RowCountMismatchError, match=r"31 rows.*footer says 30"):
        DeltaSource(str(table)).snapshot()  # row groups: when pinned
    snap = DeltaSource(str(table), units="files").snapshot()  # no footer read: pinned
    assert snap.rows == 31
    with pytest.raises(RowCountMismatchError, match=r"part-.*31 rows.*footer says 30.*None"):
        read_all(snap)


def test_a_packing_reader_refuses_whole_file_units_by_name(tmp_path: Path) -> None:
    write_delta(tmp_path / "t", [(0, 30)])
    with pytest.raises(ValueError, match="units='row_groups'"):
        LakeDataset(DeltaSource(str(tmp_path / "t"), units="files"), pack_tokens="tokens",
                    seq_len=4, eos_id=0)


def test_an_unknown_kind_of_unit_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="units must be one of"):
        DeltaSource(str(DATA / "table-with-dv-small"), units="rowgroups")


def test_a_read_of_parts_decodes_the_row_groups_they_overlap_never_the_whole_file(
        tmp_path: Path) -> None:
    from lakeckpt_tables.plan import PlanPolicy
    from lakeckpt_tables.plan.rounds import Round, RoundUnits, Tails
    from lakeckpt_tables.reader.loop import batches

    catalog, live = _iceberg_with_deletes(tmp_path)
    snap = IcebergSource("ns.parted", catalog=catalog, units="files").snapshot()
    units = RoundUnits.of(snap.units, 5)  # 34 live rows: 7 parts
    plan = Tails(PlanPolicy(batch_size=5, shuffle=False), {}).plan(
        Round(0, 0, 0, None, snap.version), units)
    reader = snap.row_reader()
    decoded: list[int] = []

    def row_group(unit: Unit) -> pa.Table:
        decoded.append(unit.row_group)
        return reader.read(unit, ["id"])

    cuts = batches(plan, units, 0, 0, row_group=row_group, row_ranges=reader.parts,
                   expect=lambda _: None, read_ahead=0, unit_rows=5)
    table, first, rows = next(cuts)[0]
    assert table.slice(first, rows)["id"].to_pylist() == live[:5]
    assert max(decoded) <= 6  # the first read: 4 parts, ids up to 25 (row group 6 of 10)
    ids = live[:5] + [i for (t, f, n), _ in cuts for i in t.slice(f, n)["id"].to_pylist()]
    assert ids == live
    assert sorted(set(decoded)) == list(range(10)) and WHOLE_FILE not in decoded


def test_the_ledger_and_the_audit_name_the_rows_of_whole_file_units(tmp_path: Path) -> None:
    from lakeckpt_tables.audit import rows, verify
    from lakeckpt_tables.checkpoint import CheckpointManager
    from lakeckpt_tables.ledger import DeltaLedger

    write_delta(tmp_path / "t", [(0, 90), (90, 151)])  # row groups of 17 rows
    dataset = LakeDataset(DeltaSource(str(tmp_path / "t"), units="files"), columns=["id"],
                          batch_size=10, seed=2, unit_rows=25)
    loader = loader_for(dataset, 0)
    manager = CheckpointManager(str(tmp_path / "ckpt"), run_id="run")
    delivered: list[list[int]] = []
    for step, batch in enumerate(loader, 1):
        delivered.append(batch["id"].tolist())
        if step % 4 == 0 or step == 16:
            manager.save(step, dataloader=loader)
    assert sorted(i for b in delivered for i in b) == list(range(151))
    records = DeltaLedger(str(tmp_path / "ckpt" / "_ledger")).checkpoints("run")
    assert [r.step for r in records] == [4, 8, 12, 16]
    offset = {u.path: 0 if u.rows == 90 else 90 for u in dataset.snapshot.units}
    for record, first in zip(records, (0, 4, 8, 12), strict=True):
        got = rows(str(tmp_path / "ckpt"), checkpoint=record.checkpoint_id)
        assert set(got["row_group"].to_pylist()) == {WHOLE_FILE}  # rows: live rows of a file
        ids = [offset[f] + r for f, r in zip(got["file"].to_pylist(), got["row"].to_pylist(),
                                              strict=True)]
        assert sorted(ids) == sorted(i for b in delivered[first:record.step] for i in b)
    [verdict] = verify(str(tmp_path / "ckpt"))
    assert verdict.violations == [] and verdict.rows == 151 and verdict.finished_passes


def test_a_follower_of_whole_files_reads_appended_files_by_row_groups_exactly_once(
        tmp_path: Path) -> None:
    write_delta(tmp_path / "t", [(0, 50)])
    write_delta(tmp_path / "t", [(50, 90), (90, 100)])  # versions 1 and 2

    def dataset(**kw: Any) -> LakeDataset:
        return LakeDataset(DeltaSource(str(tmp_path / "t"), units="files"), columns=["id"],
                           batch_size=3, rank=kw.pop("rank", 0), world_size=2, seed=4,
                           version=0, follow=True, until_version=2, min_segment_rows=10,
                           unit_rows=8, **kw)

    runs = [[b["id"].tolist() for b in loader_for(dataset(rank=r), 0)] for r in range(2)]
    assert sorted(i for run in runs for b in run for i in b) == list(range(100))
    loader = loader_for(dataset(rank=1), 0)
    head = [b["id"].tolist() for b in itertools.islice(loader, 9)]  # into the first segment
    resumed = loader_for(dataset(rank=1), 0)
    resumed.load_state_dict(loader.state_dict())
    assert head + [b["id"].tolist() for b in resumed] == runs[1]


@pytest.mark.parametrize("keep_file", [True, False])
def test_a_shuffled_pass_of_whole_files_decodes_each_row_group_once(
        tmp_path: Path, keep_file: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from lakeckpt_tables.plan import PlanPolicy
    from lakeckpt_tables.plan.rounds import Round, RoundUnits, Tails
    from lakeckpt_tables.reader import _cache
    from lakeckpt_tables.reader.loop import batches

    if not keep_file:  # what the file's row groups kept is for: without it, decoded again
        monkeypatch.setattr(_cache, "FILE_KEEP_BYTES", 0)
    catalog, live = _iceberg_with_deletes(tmp_path)
    snap = IcebergSource("ns.parted", catalog=catalog, units="files").snapshot()
    units = RoundUnits.of(snap.units, 2)  # 17 parts over 10 row groups, in a seeded order
    plan = Tails(PlanPolicy(batch_size=4, seed=7, shuffle_window=1), {}).plan(
        Round(0, 0, 0, None, snap.version), units)
    reader = snap.row_reader()
    decoded: list[int] = []

    def read(unit: Unit) -> pa.Table:
        decoded.append(unit.row_group)
        return reader.read(unit, ["id"])

    cache = _cache.RowGroupCache(read)
    ids = [i for (t, f, n), _ in batches(plan, units, 0, 0, row_group=cache.get,
                                         row_ranges=reader.parts, expect=lambda _: None,
                                         read_ahead=0, unit_rows=2)
           for i in t.slice(f, n)["id"].to_pylist()]
    assert sorted(ids) == live and ids != live
    assert (sorted(decoded) == list(range(10))) == keep_file
