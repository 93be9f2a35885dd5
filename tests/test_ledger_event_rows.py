"""The Delta ledger keeps the event rows of the files it read (NOTE [ event rows kept ] in
``ledger/delta.py``): a long-lived ledger object, as rank 0 holds one for a whole job, must
still see every event another process commits, and nothing of files no longer live."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from lakeckpt_tables.ledger import CheckpointRecord, DeltaLedger, LedgerEvent
from lakeckpt_tables.ledger.contract import EVENT_RETIRED, EVENT_TAG

pytestmark = pytest.mark.timeout(60)

RUN = "run-a"


def _checkpoint(step: int) -> CheckpointRecord:
    return CheckpointRecord(
        run_id=RUN, checkpoint_id=f"ckpt-{step}", step=step,
        parent_id=None if step == 1 else f"ckpt-{step - 1}", model_location=f"m/{step}",
        manifest={}, reader_state="", source=None, source_version=None, world_size=1,
        tags=(), config_hash="h", wall_time_s=1.0)


def _tag(ledger: DeltaLedger, step: int, tag: str) -> None:
    ledger.record_events(RUN, [LedgerEvent(EVENT_TAG, {"checkpoint_id": f"ckpt-{step}",
                                                       "tag": tag})])


def _reads(ledger: DeltaLedger) -> list[list[str]]:
    """The paths of every data-file read the ledger makes from now on."""
    reads: list[list[str]] = []
    read = ledger._read_where

    def counted(*args: object, paths: list[str] | None = None, **kwargs: object) -> pa.Table:
        reads.append(list(paths) if paths is not None
                     else [ledger._path(u) for u in ledger._table.file_uris()])
        return read(*args, paths=paths, **kwargs)  # type: ignore[arg-type]
    ledger._read_where = counted  # type: ignore[method-assign]
    return reads


def test_a_tag_given_by_another_process_is_seen_and_only_new_files_are_read(
        tmp_path: Path) -> None:
    job = DeltaLedger(str(tmp_path / "ledger"))
    for step in (1, 2, 3):
        job.commit(_checkpoint(step))
    assert job.tags(RUN) == {}
    reads = _reads(job)
    _tag(DeltaLedger(str(tmp_path / "ledger")), 2, "best")  # `lakeckpt tag`, elsewhere
    job.commit(_checkpoint(4))
    assert job.tags(RUN) == {"ckpt-2": ("best",)}
    # the tag's commit and step 4's: two new files, the three read before not again
    assert [len(paths) for paths in reads] == [2]
    assert job.tags(RUN) == {"ckpt-2": ("best",)}
    assert [len(paths) for paths in reads] == [2]  # nothing new: nothing read
    _tag(DeltaLedger(str(tmp_path / "ledger")), 4, "keep")
    assert job.tags(RUN) == {"ckpt-2": ("best",), "ckpt-4": ("keep",)}
    assert [c.tags for c in job.checkpoints(RUN)] == [(), ("best",), (), ("keep",)]


def test_after_a_compaction_the_events_are_those_of_the_new_files_exactly(
        tmp_path: Path) -> None:
    job = DeltaLedger(str(tmp_path / "ledger"))
    for step in (1, 2, 3):
        job.commit(_checkpoint(step))
    _tag(job, 1, "first")
    assert job.tags(RUN) == {"ckpt-1": ("first",)}
    DeltaLedger(str(tmp_path / "ledger")).compact()  # another process rewrites every file
    _tag(DeltaLedger(str(tmp_path / "ledger")), 3, "last")
    job._refresh()
    events = job._read(record="event", run_id=RUN)
    assert sorted(events["event"].to_pylist()) == [EVENT_TAG, EVENT_TAG]  # none twice
    assert job.tags(RUN) == {"ckpt-1": ("first",), "ckpt-3": ("last",)}


def test_the_events_of_a_file_dropped_by_repair_no_longer_count(tmp_path: Path) -> None:
    where = tmp_path / "ledger"
    job = DeltaLedger(str(where))
    for step in (1, 2):
        job.commit(_checkpoint(step))
    before = {p.name for p in where.glob("*.parquet")}
    job.record_events(RUN, [LedgerEvent(EVENT_RETIRED, {"checkpoint_id": "ckpt-2"})])
    (retire_file,) = {p.name for p in where.glob("*.parquet")} - before
    assert [c.step for c in job.checkpoints(RUN)] == [1]  # its event read, and kept
    os.makedirs(tmp_path / "aside")
    shutil.move(where / retire_file, tmp_path / "aside" / retire_file)
    assert DeltaLedger(str(where)).repair_missing() == [retire_file]
    assert [c.step for c in job.checkpoints(RUN)] == [1, 2]
