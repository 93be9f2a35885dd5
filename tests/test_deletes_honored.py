"""``deletes="honor"`` (NOTE [ deletions honored ] in ``reader/deletions.py``): rows a table
deletes after the pin are not delivered once the checkpoint that observed the deletion is
saved; every other row exactly once; lockstep over ranks; exact resume after a crash; the
ledger's ``excluded`` events name exactly the rows deleted and the rows taken out. Deletion
vectors and Iceberg position deletes are written as commits, as Spark and Iceberg engines
write them; a copy-on-write DELETE is followed through a key column or refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import loader_for, raised_in_workers, sql_catalog

from lakeckpt_tables import DeltaSource, ExclusionList, IcebergSource, LakeDataset
from lakeckpt_tables.audit import connect, verify
from lakeckpt_tables.audit import rows as audit_rows
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.cli import main
from lakeckpt_tables.errors import DeletionUntraceableError
from lakeckpt_tables.reader import ReaderState, merge_states
from lakeckpt_tables.reader.deletions import continue_from, observe_deletions
from lakeckpt_tables.tools.bench.tables import write_deletion_vectors

FILES, ROWS = 3, 100
USER = 3  # the user whose rows are deleted: id % 7 == USER


def _write(path: Path, *, vectors: bool = True) -> None:
    from deltalake import write_deltalake

    for f in range(FILES):
        ids = np.arange(f * ROWS, (f + 1) * ROWS)
        write_deltalake(str(path), pa.table({"id": ids, "user": ids % 7}), mode="append",
                        configuration=({"delta.enableDeletionVectors": "true"}
                                       if vectors and f == 0 else None))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("honored") / "table"
    _write(path)
    return path


def _copy(pristine: Path, to: Path) -> Path:
    shutil.copytree(pristine, to)
    return to


def _delete_user_by_vectors(table: Path) -> set[int]:
    """Commit deletion vectors deleting the user's rows of every file; their ids."""
    from deltalake import DeltaTable

    deleted: dict[str, np.ndarray[Any, Any]] = {}
    ids: set[int] = set()
    for add in pa.table(DeltaTable(str(table)).get_add_actions(flatten=True)).to_pylist():
        file_ids = pq.read_table(table / add["path"]).column("id").to_numpy()
        deleted[add["path"]] = np.flatnonzero(file_ids % 7 == USER)
        ids.update(file_ids[file_ids % 7 == USER].tolist())
    write_deletion_vectors(str(table), deleted)
    return ids


def _dataset(table: Path, **options: Any) -> LakeDataset:
    return LakeDataset(DeltaSource(str(table)), **{
        "batch_size": 10, "seed": 1, "shuffle_window": 2, "unit_rows": 40, "deletes": "honor",
        **options})


def _events(manager: CheckpointManager, name: str) -> list[tuple[int, dict[str, Any]]]:
    assert manager.ledger is not None
    return [(r["step"], json.loads(r["detail"])) for r in manager.ledger.to_arrow().to_pylist()
            if r["event"] == name]


def _ids_of(ranges: list[list[Any]], table: Path) -> set[int]:
    """Ids of [file, row group, first, end] live-row ranges (no deletes at the pin)."""
    out: set[int] = set()
    for path, group, first, end in ranges:
        ids = pq.ParquetFile(path).read_row_group(group, columns=["id"]).column(0).to_pylist()
        out.update(ids[first:end])
    return out


def _train(table: Path, root: Path, *, delete_after: int, crash_after: int | None = None,
           saves: tuple[int, ...] = (5, 10, 20)) -> tuple[list[list[int]], set[int]]:
    """Train to the end, saving at ``saves`` and at the end; the user's rows deleted by
    deletion vectors after step ``delete_after``'s save; with ``crash_after``, the job dies
    after that step and a new one restores. Returns the batches trained (lost ones dropped)
    and the ids deleted."""
    manager = CheckpointManager(root, "run")
    loader = loader_for(_dataset(table), 0)
    batches: list[list[int]] = []
    deleted: set[int] = set()
    for step, batch in enumerate(loader, 1):
        batches.append(batch["id"].tolist())
        if step in saves:
            manager.save(step, dataloader=loader)
        if step == delete_after:
            deleted = _delete_user_by_vectors(table)
        if step == crash_after:
            break
    if crash_after is not None:  # a new job: the steps after the last checkpoint are lost
        manager = CheckpointManager(root, "run")
        loader = loader_for(_dataset(table), 0)
        step = manager.restore(dataloader=loader) or 0
        del batches[step:]
        for batch in loader:
            step += 1
            batches.append(batch["id"].tolist())
            if step in saves:
                manager.save(step, dataloader=loader)
    manager.save(len(batches), dataloader=loader)  # the end of the pass
    return batches, deleted


def test_deletion_vectors_after_the_pin_stop_at_the_next_checkpoint_and_resume_exactly(
        pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = _copy(pristine, tmp_path / "a")
    batches, deleted = _train(table, tmp_path / "ck-a", delete_after=5)
    ids = [i for b in batches for i in b]
    assert len(ids) == len(set(ids))  # at most once
    trained_before = {i for b in batches[:10] for i in b}  # up to the checkpoint applying it
    assert not deleted & {i for b in batches[10:] for i in b}  # none after it
    assert set(ids) == (set(range(FILES * ROWS)) - deleted) | (deleted & trained_before)
    assert 0 < len(deleted & trained_before) < len(deleted)
    # the ledger: one exclusion, with the checkpoint that applied it, exact rows
    manager = CheckpointManager(tmp_path / "ck-a", "run")
    (step, event), = _events(manager, "excluded")
    assert (step, event["version"], event["operation"], event["how"]) == (10, 3, "DELETE",
                                                                          "position")
    assert _ids_of(event["deleted"], table) == deleted and event["rows"] == len(deleted)
    assert _ids_of(event["excluded"]["0"], table) == deleted - trained_before
    assert event["excluded_rows"] == len(deleted - trained_before)
    # the audit replays every checkpoint's rows: the re-planned one's up to its state before
    con = connect(tmp_path / "ck-a")
    steps = dict(con.sql("SELECT step, checkpoint_id FROM checkpoints").fetchall())
    for step, first, end in ((10, 5, 10), (20, 10, 20)):
        replayed = audit_rows(tmp_path / "ck-a", checkpoint=steps[step])
        assert set(_ids_of([[f, g, r, r + 1] for f, g, r in zip(
            replayed["file"].to_pylist(), replayed["row_group"].to_pylist(),
            replayed["row"].to_pylist(), strict=True)], table)) == {
            i for b in batches[first:end] for i in b}
    # the deletions view: the deleted rows, the checkpoint that took them out
    view = con.sql("SELECT applied_at_step, version, operation, file, row_group, row_start, "
                   "row_end, excluded_rows FROM deletions").fetchall()
    assert {r[:3] for r in view} == {(10, 3, "DELETE")}
    assert _ids_of([list(r[3:7]) for r in view], table) == deleted
    assert {r[7] for r in view} == {len(deleted - trained_before)}
    # exposure per matching row: the checkpoints that trained on it, the version that
    # deleted it, the checkpoint after which none trained on it
    exposure = audit_rows(tmp_path / "ck-a", where=f"user = {USER}").to_pylist()
    trained_user = {i for i in ids if i % 7 == USER}
    got = {next(iter(_ids_of([[r["file"], r["row_group"], r["row"], r["row"] + 1]], table))): r
           for r in exposure}
    assert set(got) == trained_user
    step_bounds = [0, 5, 10, 20, len(batches)]
    for i, r in got.items():
        at = next(k for k, b in enumerate(batches) if i in b) + 1  # the step it trained at
        assert r["steps"] == [next(e for e in step_bounds[1:] if e >= at)]
        assert r["last_trained_step"] == r["steps"][-1]
        if i in deleted:
            assert (r["deleted_version"], r["deleted_by"], r["stopped_after_step"]) == (
                3, "DELETE", 10)
        else:
            assert r["deleted_version"] is r["stopped_after_step"] is None
    # the command line: per run, and per row
    assert main(["audit", str(tmp_path / "ck-a"), "--where", f"user = {USER}",
                 "--output", "json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)
    assert (run["deleted"], run["deleted_versions"], run["stopped_after_step"]) == (
        len(deleted & trained_before), [3], 10)
    assert run["rows"] == len(got)
    assert main(["audit", str(tmp_path / "ck-a"), "--where", f"user = {USER}", "--rows",
                 "--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(exposure))
    # verify: the finished pass gave every row but those taken out, counted as excluded
    (verdict,) = verify(tmp_path / "ck-a")
    assert verdict.ok and verdict.finished_passes == [(0, 0)], verdict.violations
    assert verdict.excluded == len(deleted - trained_before)
    assert verdict.rows == FILES * ROWS - verdict.excluded
    # a crash after step 14 resumes step 10's checkpoint: the same rows, row for row
    other = _copy(pristine, tmp_path / "b")
    resumed, _ = _train(other, tmp_path / "ck-b", delete_after=5, crash_after=14)
    assert resumed == batches


def test_two_ranks_stay_in_lockstep_when_a_deletion_is_taken_out(pristine: Path,
                                                                  tmp_path: Path) -> None:
    table = _copy(pristine, tmp_path / "t")
    datasets = [_dataset(table, rank=r, world_size=2, batch_size=7) for r in range(2)]
    loaders = [loader_for(d, 0) for d in datasets]
    its = [iter(loader) for loader in loaders]
    head = [[next(it)["id"].tolist() for _ in range(4)] for it in its]
    deleted = _delete_user_by_vectors(table)
    merged = merge_states([ReaderState.from_dict(loader.state_dict()["dataset_state"])
                           for loader in loaders])
    state, events = observe_deletions(datasets[0], merged)
    assert state.deletes_seen == 3 and len(events) == 1
    for d in datasets:
        continue_from(d, state)
    tails = [[b["id"].tolist() for b in it] for it in its]
    assert len(tails[0]) == len(tails[1]) > 0  # lockstep: as many batches on every rank
    before = {i for h in head for b in h for i in b}
    after = [i for t in tails for b in t for i in b]
    assert len(after) == len(set(after)) and not set(after) & (before | deleted)
    assert set(after) | before == (set(range(FILES * ROWS)) - deleted) | (before & deleted)
    # a state loaded afresh (a resume) holds the exclusion
    again = _dataset(table, rank=1, world_size=2, batch_size=7)
    again.load_state_dict(state.to_dict())
    assert [b["id"].tolist() for b in loader_for(again, 0)] == tails[1]


def test_a_deletion_is_taken_out_of_every_later_epoch_too(pristine: Path,
                                                          tmp_path: Path) -> None:
    table = _copy(pristine, tmp_path / "t")
    dataset = _dataset(table, epochs=2, batch_size=16)
    loader = loader_for(dataset, 0)
    it = iter(loader)
    head = {i for _ in range(4) for i in next(it)["id"].tolist()}
    deleted = _delete_user_by_vectors(table)
    state, events = observe_deletions(
        dataset, ReaderState.from_dict(loader.state_dict()["dataset_state"]))
    assert sorted(events[0]["excluded"]) == ["0", "1"]
    assert _ids_of(events[0]["excluded"]["1"], table) == deleted  # all of them, next epoch
    continue_from(dataset, state)
    rest = [i for b in it for i in b["id"].tolist()]
    everything = set(range(FILES * ROWS))
    first_epoch = len(everything) - len(head) - len(deleted - head)
    assert set(rest[:first_epoch]) == everything - head - deleted
    assert sorted(rest[first_epoch:]) == sorted(everything - deleted)


def test_a_copy_on_write_delete_is_refused_without_a_key_and_followed_with_one(
        tmp_path: Path) -> None:
    from deltalake import DeltaTable

    table = tmp_path / "cow"
    _write(table, vectors=False)
    plain, keyed = _dataset(table), _dataset(table, deletes_key="id")
    heads, states, its = [], [], []
    for d in (plain, keyed):
        loader = loader_for(d, 0)
        its.append(iter(loader))
        heads.append({i for _ in range(6) for i in next(its[-1])["id"].tolist()})
        states.append(ReaderState.from_dict(loader.state_dict()["dataset_state"]))
    DeltaTable(str(table)).delete(f"user = {USER}")  # rewrites every file
    DeltaTable(str(table)).update({"user": "100"}, predicate="id < 50")  # kept: same keys
    with pytest.raises(DeletionUntraceableError, match=r"version 3 \(DELETE\) rewrote data "
                       r"file .*part-.*deletes_key"):
        observe_deletions(plain, states[0])
    state, events = observe_deletions(keyed, states[1])
    deleted = {i for i in range(FILES * ROWS) if i % 7 == USER}
    assert [(e["version"], e["operation"], e["how"]) for e in events] == [(3, "DELETE", "key")]
    assert _ids_of(events[0]["deleted"], table) == deleted
    assert _ids_of(events[0]["excluded"]["0"], table) == deleted - heads[1]
    continue_from(keyed, state)
    rest = [i for b in its[1] for i in b["id"].tolist()]
    assert sorted(rest) == sorted(set(range(FILES * ROWS)) - deleted - heads[1])


def test_iceberg_position_deletes_after_the_pin_are_taken_out(tmp_path: Path) -> None:
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.schema import Schema
    from pyiceberg.typedef import Record
    from pyiceberg.types import LongType, NestedField

    catalog = sql_catalog(tmp_path)
    catalog.create_namespace("ns")
    schema = Schema(NestedField(1, "id", LongType(), required=False))
    table = catalog.create_table("ns.t", schema=schema, properties={"format-version": "2"})
    for f in range(2):
        table.append(pa.table({"id": pa.array(range(f * 50, (f + 1) * 50), pa.int64())}))
    source = IcebergSource("ns.t", catalog=catalog)
    dataset = LakeDataset(source, batch_size=8, seed=2, deletes="honor")
    loader = loader_for(dataset, 0)
    it = iter(loader)
    head = {i for _ in range(3) for i in next(it)["id"].tolist()}
    # a position delete file deleting rows 0, 5, 10, ... of the first data file
    first = sorted(task.file.file_path for task in catalog.load_table("ns.t").scan()
                   .plan_files())[0]
    path = tmp_path / "deletes.parquet"
    positions = list(range(0, 50, 5))
    pq.write_table(pa.table({"file_path": pa.array([first] * len(positions)),
                             "pos": pa.array(positions, pa.int64())},
                            schema=pa.schema([
                                pa.field("file_path", pa.string(),
                                         metadata={b"PARQUET:field_id": b"2147483546"}),
                                pa.field("pos", pa.int64(),
                                         metadata={b"PARQUET:field_id": b"2147483545"})])),
                   str(path))
    t = catalog.load_table("ns.t")
    data_file = DataFile.from_args(content=DataFileContent.POSITION_DELETES,
                                   file_path=f"file://{path}", file_format=FileFormat.PARQUET,
                                   partition=Record(),
                                   record_count=len(positions),
                                   file_size_in_bytes=path.stat().st_size)
    data_file.spec_id = t.metadata.default_spec_id
    with t.transaction() as tx, tx.update_snapshot().fast_append() as append:
        append.append_data_file(data_file)
    reference = set(catalog.load_table("ns.t").scan().to_arrow().column("id").to_pylist())
    deleted = set(range(100)) - reference
    assert len(deleted) == len(positions)
    state, events = observe_deletions(
        dataset, ReaderState.from_dict(loader.state_dict()["dataset_state"]))
    assert [e["how"] for e in events] == ["position"]
    assert events[0]["rows"] == len(deleted)
    continue_from(dataset, state)
    rest = [i for b in it for i in b["id"].tolist()]
    assert len(rest) == len(set(rest))
    assert set(rest) == reference - head


def test_an_exclusion_list_withholds_its_keys_from_the_start_and_from_the_next_checkpoint(
        pristine: Path, tmp_path: Path) -> None:
    from deltalake import write_deltalake

    requests = tmp_path / "requests"
    write_deltalake(str(requests), pa.table({"user": pa.array([USER], pa.int64())}))
    listed = ExclusionList(DeltaSource(str(requests)), "user")
    manager = CheckpointManager(tmp_path / "ck", "run")
    loader = loader_for(_dataset(pristine, exclusions=listed), 0)
    batches = []
    for step, batch in enumerate(loader, 1):
        batches.append(batch["id"].tolist())
        if step == 3:
            write_deltalake(str(requests), pa.table({"user": pa.array([5], pa.int64())}),
                            mode="append")  # version 1 of the list
        if step in (4, 8):
            manager.save(step, dataloader=loader)
    manager.save(len(batches), dataloader=loader)
    ids = [i for b in batches for i in b]
    assert len(ids) == len(set(ids)) and not {i % 7 for i in ids} & {USER} 
    before = {i for b in batches[:4] for i in b}
    assert not {i for b in batches[4:] for i in b if i % 7 == 5}
    assert set(ids) == {i for i in range(FILES * ROWS) if i % 7 not in (USER, 5)} | {
        i for i in before if i % 7 == 5}
    events = _events(manager, "excluded")
    assert [(step, e["version"], e["how"], e["rows"]) for step, e in events] == [
        (4, 0, "list", FILES * ROWS // 7 + (FILES * ROWS % 7 > USER)),
        (4, 1, "list", FILES * ROWS // 7 + (FILES * ROWS % 7 > 5))]
    assert events[0][1]["operation"].startswith("exclusion list")
    (verdict,) = verify(tmp_path / "ck")
    assert verdict.ok and verdict.excluded == sum(e["excluded_rows"] for _, e in events)


def test_what_cannot_be_honored_is_refused_by_name(pristine: Path) -> None:
    with pytest.raises(ValueError, match=r"deletes='honor'.*follow=True"):
        LakeDataset(DeltaSource(str(pristine)), deletes="honor", follow=True)
    with pytest.raises(ValueError, match="deletes_key and exclusions are for deletes='honor'"):
        LakeDataset(DeltaSource(str(pristine)), deletes_key="id")
    with pytest.raises(ValueError, match="deletes must be one of"):
        LakeDataset(DeltaSource(str(pristine)), deletes="forget")  # type: ignore[arg-type]
    with raised_in_workers(ValueError, "deletes='honor'.*num_workers=0"):
        next(iter(loader_for(_dataset(pristine), 1)))
