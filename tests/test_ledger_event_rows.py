"""A ledger keeps the event rows it read (NOTE [ event rows kept ] in
``ledger/delta_files.py``): a long-lived ledger object, as rank 0 holds one for a whole job,
opens only the files added since its last read, and still sees every event another process
commits and nothing of files no longer live. Delta and Iceberg (SQLite catalog) alike."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.io.pyarrow import ArrowScan

from lakeckpt_tables.ledger import (
    CheckpointRecord,
    ConsumptionRecord,
    DeltaLedger,
    IcebergLedger,
    LedgerEvent,
)
from lakeckpt_tables.ledger.base import LedgerBase
from lakeckpt_tables.ledger.contract import EVENT_RETIRED, EVENT_TAG

pytestmark = pytest.mark.timeout(60)

RUN = "run-a"
Opener = Callable[[], LedgerBase[Any]]


@pytest.fixture(params=["delta", "iceberg"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    if request.param == "delta":
        return lambda: DeltaLedger(str(tmp_path / "ledger"))
    return _iceberg(tmp_path)


def _iceberg(tmp_path: Path) -> Callable[[], IcebergLedger]:
    catalog_uri, warehouse = f"sqlite:///{tmp_path}/catalog.db", tmp_path / "warehouse"
    warehouse.mkdir()
    return lambda: IcebergLedger("ml.ledger", catalog=SqlCatalog(
        "events", uri=catalog_uri, warehouse=warehouse.as_uri()))


def _checkpoint(step: int) -> CheckpointRecord:
    return CheckpointRecord(
        run_id=RUN, checkpoint_id=f"ckpt-{step}", step=step,
        parent_id=None if step == 1 else f"ckpt-{step - 1}", model_location=f"m/{step}",
        manifest={}, reader_state="", source=None, source_version=None, world_size=1,
        tags=(), config_hash="h", wall_time_s=1.0)


def _tag(ledger: LedgerBase[Any], step: int, tag: str) -> None:
    ledger.record_events(RUN, [LedgerEvent(EVENT_TAG, {"checkpoint_id": f"ckpt-{step}",
                                                       "tag": tag})])


def _files_read(ledger: LedgerBase[Any], monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many data files each read of event rows opens, from now on."""
    reads: list[int] = []
    if isinstance(ledger, DeltaLedger):
        read = ledger._read_where

        def counted(*args: Any, paths: list[str] | None = None, **kwargs: Any) -> Any:
            reads.append(len(paths) if paths is not None else len(ledger._table.file_uris()))
            return read(*args, paths=paths, **kwargs)
        monkeypatch.setattr(ledger, "_read_where", counted)
    else:
        to_table = ArrowScan.to_table

        def counted_tasks(self: Any, tasks: Any) -> Any:
            tasks = list(tasks)
            reads.append(len(tasks))
            return to_table(self, tasks)
        monkeypatch.setattr(ArrowScan, "to_table", counted_tasks)
    return reads


def test_a_tag_given_by_another_process_is_seen_and_only_new_files_are_read(
        opener: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    job = opener()
    for step in (1, 2, 3):
        job.commit(_checkpoint(step))
    assert job.tags(RUN) == {}
    reads = _files_read(job, monkeypatch)
    _tag(opener(), 2, "best")  # `lakeckpt tag`, in another process
    job.commit(_checkpoint(4))
    assert job.tags(RUN) == {"ckpt-2": ("best",)}
    # the tag's commit and step 4's are new, the three read before are not read again (an
    # Iceberg scan of the two appends skips step 4's file too: its `record` bounds hold no
    # event)
    new = [2] if isinstance(job, DeltaLedger) else [1]
    assert reads == new
    assert job.tags(RUN) == {"ckpt-2": ("best",)}
    assert reads == new  # nothing new: nothing read
    _tag(opener(), 4, "keep")
    assert job.tags(RUN) == {"ckpt-2": ("best",), "ckpt-4": ("keep",)}
    assert [c.tags for c in job.checkpoints(RUN)] == [(), ("best",), (), ("keep",)]


def test_after_a_compaction_the_events_are_those_of_the_new_files_exactly(
        opener: Opener) -> None:
    job = opener()
    for step in (1, 2, 3):
        job.commit(_checkpoint(step))
    _tag(job, 1, "first")
    assert job.tags(RUN) == {"ckpt-1": ("first",)}
    opener().compact()  # another process rewrites every file
    _tag(opener(), 3, "last")
    assert job.tags(RUN) == {"ckpt-1": ("first",), "ckpt-3": ("last",)}
    job._refresh()
    events = job._read(record="event", run_id=RUN)
    assert sorted(events["event"].to_pylist()) == [EVENT_TAG, EVENT_TAG]  # none twice


def test_the_events_of_a_file_dropped_by_repair_no_longer_count(
        opener: Opener, tmp_path: Path) -> None:
    job = opener()
    for step in (1, 2):
        job.commit(_checkpoint(step))
    before = set(tmp_path.rglob("*.parquet"))
    job.record_events(RUN, [LedgerEvent(EVENT_RETIRED, {"checkpoint_id": "ckpt-2"})])
    (retire_file,) = set(tmp_path.rglob("*.parquet")) - before
    assert [c.step for c in job.checkpoints(RUN)] == [1]  # its event read, and kept
    shutil.move(retire_file, tmp_path / "aside.parquet")
    (dropped,) = opener().repair_missing()
    assert dropped.endswith(retire_file.name)
    assert [c.step for c in job.checkpoints(RUN)] == [1, 2]


def test_a_commits_checkpoint_and_events_are_a_row_group_apart_from_its_consumption(
        tmp_path: Path) -> None:
    """NOTE [ few rows first ] in ``ledger/records.py``, Delta: what lets a read of events skip
    the consumption row groups by their statistics."""
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.commit(_checkpoint(1), CONSUMED, EVENTS)
    (path,) = (tmp_path / "ledger").glob("*.parquet")
    footer = pq.read_metadata(path)
    column = footer.schema.names.index("record")
    groups = [footer.row_group(i) for i in range(footer.num_row_groups)]
    assert [g.num_rows for g in groups] == [3, 5]
    bounds = [(g.column(column).statistics.min, g.column(column).statistics.max) for g in groups]
    assert bounds == [("checkpoint", "event"), ("consumption", "consumption")]
    assert ledger.tags(RUN) == {} and len(ledger.consumption(RUN)) == 5


def test_a_commits_checkpoint_and_events_are_an_iceberg_file_apart_from_its_consumption(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [ few rows first ], Iceberg: a read of events never opens a file of consumption."""
    job = _iceberg(tmp_path)()
    job.commit(_checkpoint(1), CONSUMED, EVENTS)
    files = sorted(task.file.record_count for task in job._table.scan().plan_files())
    assert files == [3, 5]
    reads = _files_read(job, monkeypatch)
    assert [e for e in job._read(record="event")["event"].to_pylist()] == ["round", "note"]
    assert reads == [1]  # the three rows' file only
    assert len(job.consumption(RUN)) == 5 and [c.step for c in job.checkpoints(RUN)] == [1]


CONSUMED = [ConsumptionRecord(0, 0, 0, 0, f"f{i}.parquet", 0, 0, 9) for i in range(5)]
EVENTS = [LedgerEvent("round", {"round": 0}), LedgerEvent("note", {"n": 1})]
