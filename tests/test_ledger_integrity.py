"""Damaged ledger bytes are detected, named, and the run goes on from the newest intact state."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tempfile
from pathlib import Path

import parquet_spans
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from deltalake import DeltaTable
from pyiceberg.catalog.sql import SqlCatalog

from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.errors import LedgerCorruptError
from lakeckpt_tables.ledger import DeltaLedger, IcebergLedger, LedgerEvent
from lakeckpt_tables.ledger.records import intact_rows, row_checksum


def _run(root: Path, steps: list[int]) -> list[str]:
    manager = CheckpointManager(root, "r")
    return [manager.save(step, model=torch.nn.Linear(2, 1)).checkpoint_id for step in steps]


def _file_of(root: Path, checkpoint_id: str) -> Path:
    for path in (root / "_ledger").glob("*.parquet"):
        if checkpoint_id in pq.read_table(path)["checkpoint_id"].to_pylist():
            return path
    raise AssertionError(checkpoint_id)


def _events(root: Path, name: str) -> list[dict[str, object]]:
    rows = DeltaLedger(str(root / "_ledger")).to_arrow().sort_by("committed_at").to_pylist()
    return [json.loads(r["detail"]) for r in rows if r["event"] == name]


def test_every_row_carries_a_checksum_over_all_its_fields(tmp_path: Path) -> None:
    _run(tmp_path, [1])
    rows = DeltaLedger(str(tmp_path / "_ledger")).to_arrow()
    assert rows.num_rows == 1
    row = rows.to_pylist()[0]
    assert row["checksum"] == row_checksum(row)
    for name, other in (("step", 2), ("reader_state", "x"), ("manifest", "{}"),
                        ("source_version", 7), ("owner", "1")):
        assert row_checksum({**row, name: other}) != row["checksum"], name
    changed = rows.set_column(rows.schema.get_field_index("step"), "step",
                              pa.array([16777217], pa.int64()))
    kept, damaged = intact_rows(changed)
    assert kept.num_rows == 0 and [(d.record, d.step) for d in damaged] == [("checkpoint",
                                                                           16777217)]


def test_a_rewritten_record_makes_restore_fall_back_to_the_newest_intact_and_go_on(
        tmp_path: Path) -> None:
    ids = _run(tmp_path, [10, 20])
    path = _file_of(tmp_path, ids[1])
    rows = pq.read_table(path)
    step = rows.schema.get_field_index("step")
    pq.write_table(rows.set_column(step, rows.schema.field(step),
                                   pa.array([16777236], pa.int64())), path)  # 20 -> 2**24 + 20
    job = CheckpointManager(tmp_path, "r")
    assert job.restore(model=torch.nn.Linear(2, 1)) == 10
    (retired,) = _events(tmp_path, "retired")
    assert retired["checkpoint_id"] == ids[1] and "fails its checksum" in str(retired["reason"])
    (restore,) = _events(tmp_path, "restore")
    assert (restore["checkpoint_id"], restore["steps_lost"]) == (ids[0], 16777226)
    assert job.save(20, model=torch.nn.Linear(2, 1)).parent_id == ids[0]
    assert [r.step for r in job.checkpoints()] == [10, 20]


@pytest.mark.parametrize("damage", ["bit flips", "truncated", "missing"])
def test_a_damaged_ledger_file_is_a_named_error_naming_the_file_and_the_way_out(
        tmp_path: Path, damage: str) -> None:
    ids = _run(tmp_path, [10, 20])
    path = _file_of(tmp_path, ids[1])
    data = bytearray(path.read_bytes())
    if damage == "bit flips":
        rng = random.Random(3)
        for _ in range(8):
            k = rng.randrange(4, len(data) - 8)
            data[k] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
    elif damage == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:  # a file that is gone has nothing to inspect: restore drops it itself (issue 19.4)
        path.unlink()
        assert CheckpointManager(tmp_path, "r").restore(model=torch.nn.Linear(2, 1)) == 10
        assert [e["files"] for e in _events(tmp_path, "ledger_repaired")] == [[path.name]]
        return
    with pytest.raises(LedgerCorruptError, match=rf"{path.name} is missing, truncated or "
                       r"damaged .*The way out: move the file aside .*\.repair\(\)"):
        CheckpointManager(tmp_path, "r").restore(model=torch.nn.Linear(2, 1))
    path.rename(tmp_path / "aside.parquet")
    DeltaTable(str(tmp_path / "_ledger")).repair()
    job = CheckpointManager(tmp_path, "r")
    assert job.restore(model=torch.nn.Linear(2, 1)) == 10
    assert job.save(11, model=torch.nn.Linear(2, 1)).parent_id == ids[0]


def test_a_tampered_consumption_record_is_a_named_error(tmp_path: Path) -> None:
    _run(tmp_path, [1])
    ledger = DeltaLedger(str(tmp_path / "_ledger"))
    ledger.record_events("r", [])
    path = next((tmp_path / "_ledger").glob("*.parquet"))
    rows = pq.read_table(path)
    consumption = rows.filter(pc.field("record") == "checkpoint").to_pylist()[0]
    consumption.update(record="consumption", rank=0, worker=0, segment=0, epoch=0, file="f",
                       row_group=0, row_start=0, row_end=5, rows=5)
    pq.write_table(pa.Table.from_pylist([consumption], schema=rows.schema), path)
    with pytest.raises(LedgerCorruptError, match=r"1 consumption record\(s\) fail their checksum"):
        ledger.consumption("r")


def test_a_run_whose_only_checkpoint_was_repaired_away_starts_afresh_and_saves(
        tmp_path: Path) -> None:
    (only,) = _run(tmp_path, [3])
    path = _file_of(tmp_path, only)
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(LedgerCorruptError):
        CheckpointManager(tmp_path, "r").restore(model=torch.nn.Linear(2, 1))
    path.rename(tmp_path / "aside.parquet")
    DeltaTable(str(tmp_path / "_ledger")).repair()
    job = CheckpointManager(tmp_path, "r")
    assert job.restore(model=torch.nn.Linear(2, 1)) is None
    assert job.save(3, model=torch.nn.Linear(2, 1)).parent_id is None


# -- the Iceberg ledger: the same integrity ------------------------------------------------


def _iceberg_run(tmp_path: Path, steps: list[int]) -> tuple[IcebergLedger, list[str]]:
    catalog = SqlCatalog("c", uri=f"sqlite:///{tmp_path}/cat.db",
                         warehouse=f"file://{tmp_path}/wh")
    ledger = IcebergLedger("ml.ledger", catalog=catalog)
    manager = CheckpointManager(tmp_path / "ck", "r", ledger=ledger)
    return ledger, [manager.save(step, model=torch.nn.Linear(2, 1)).checkpoint_id
                    for step in steps]


def _iceberg_file_of(ledger: IcebergLedger, checkpoint_id: str) -> Path:
    table = ledger._table
    table.refresh()
    for task in table.scan().plan_files():
        path = Path(task.file.file_path.removeprefix("file://"))
        if checkpoint_id in pq.read_table(path)["checkpoint_id"].to_pylist():
            return path
    raise AssertionError(checkpoint_id)


def _iceberg_manager(tmp_path: Path, ledger: IcebergLedger) -> CheckpointManager:
    fresh = IcebergLedger("ml.ledger", catalog=ledger._catalog)
    return CheckpointManager(tmp_path / "ck", "r", ledger=fresh)


def test_iceberg_a_rewritten_record_makes_restore_fall_back_to_the_newest_intact(
        tmp_path: Path) -> None:
    ledger, ids = _iceberg_run(tmp_path, [10, 20])
    path = _iceberg_file_of(ledger, ids[1])
    rows = pq.read_table(path)  # keeps the field ids pyiceberg reads by
    step = rows.schema.get_field_index("step")
    pq.write_table(rows.set_column(step, rows.schema.field(step),
                                   pa.array([16777236], pa.int64())), path)
    job = _iceberg_manager(tmp_path, ledger)
    assert job.restore(model=torch.nn.Linear(2, 1)) == 10
    events = [json.loads(r["detail"]) for r in job.ledger.to_arrow().to_pylist()
              if r["event"] == "retired"]
    assert [e["checkpoint_id"] for e in events] == [ids[1]]
    assert "fails its checksum" in str(events[0]["reason"])
    assert job.save(20, model=torch.nn.Linear(2, 1)).parent_id == ids[0]
    assert [r.step for r in job.checkpoints()] == [10, 20]


@pytest.mark.parametrize("damage", ["bit flips", "truncated", "missing"])
def test_iceberg_a_damaged_ledger_file_is_named_with_the_way_out_which_works(
        tmp_path: Path, damage: str) -> None:
    ledger, ids = _iceberg_run(tmp_path, [10, 20])
    path = _iceberg_file_of(ledger, ids[1])
    data = bytearray(path.read_bytes())
    if damage == "bit flips":  # in the footer's length and magic: the file cannot be opened
        for k in (-6, -5, -2):
            data[k] ^= 0x5A
        path.write_bytes(bytes(data))
    elif damage == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:  # a file that is gone has nothing to inspect: restore drops it itself (issue 19.4)
        path.unlink()
        assert _iceberg_manager(tmp_path, ledger).restore(model=torch.nn.Linear(2, 1)) == 10
        return
    with pytest.raises(LedgerCorruptError, match=rf"{path.name} is missing, truncated or "
                       r"damaged .*The way out: .*\.repair\(\)"):
        _iceberg_manager(tmp_path, ledger).restore(model=torch.nn.Linear(2, 1))
    fresh = IcebergLedger("ml.ledger", catalog=ledger._catalog)
    assert [Path(p).name for p in fresh.repair()] == [path.name]
    assert fresh.repair() == []
    job = _iceberg_manager(tmp_path, ledger)
    assert job.restore(model=torch.nn.Linear(2, 1)) == 10
    assert job.save(11, model=torch.nn.Linear(2, 1)).parent_id == ids[0]


def test_a_flipped_row_group_statistic_is_named_not_trusted_to_hide_records(
        tmp_path: Path) -> None:
    """Page checksums do not cover the footer; its statistics decide which row groups a
    filtered read skips. Found by ``lakeckpt chaos``: "run" -> "rwn" in a min statistic hid a
    checkpoint and its consumption from every read of the run (restore went back to 10)."""
    manager = CheckpointManager(tmp_path, "zz9")
    ids = [manager.save(step, model=torch.nn.Linear(2, 1)).checkpoint_id for step in (10, 20)]
    path = _file_of(tmp_path, ids[1])
    data = path.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    footer = data[-8 - length:-8]
    assert footer.count(b"zz9") >= 2  # the run_id column's min and max
    path.write_bytes(data[:-8 - length] + footer.replace(b"zz9", b"zz1") + data[-8:])
    # the footer fails its digest: the file is read whole, its statistics unused
    job = CheckpointManager(tmp_path, "zz9")
    assert [r.step for r in job.checkpoints()] == [10, 20]
    assert job.restore(model=torch.nn.Linear(2, 1)) == 20


# -- a flipped bit anywhere: every kind of byte of a ledger file -------------------------------


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


@pytest.fixture(scope="module")
def flips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Flip one bit at a time in the smallest real ledger data file (the only file of a
    ledger holding one events commit, 8 KB) and read the run through the ledger's own
    filtered read, as restore does: the offsets hit (and their kind of byte), by outcome.

    Not every byte: what a flip does depends on the kind of byte it lands in (a page header
    field, a page body, a footer field's header, length or value, the magic), not on which
    of 32 alike column entries holds it. :func:`parquet_spans.sample` flips every byte of four
    spans of each kind (more where a short value differs: each type, encoding, repetition),
    and of long values (page bodies, statistics, the Arrow schema) the first 16 bytes and
    every 11th: 1,500 of 8,150 bytes, every one of 181 kinds. Against flipping every byte (45 s
    on CI), the sample met 170 kinds with every outcome the full sweep gave them and 11 with
    one of their two (all named, warned or unchanged); the bug of issue 19 (a ValueError left
    unnamed) and page checksums left unverified both show in sampled offsets. One ledger
    object for all offsets (its footer verification of the file forgotten each time); the
    ledger sits on tmpfs where the machine has one, so that the reads cost what pyarrow
    costs."""
    shm = Path("/dev/shm")
    base = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() and os.access(shm, os.W_OK) \
        else tmp_path_factory.mktemp("flips")
    try:
        ledger = DeltaLedger(str(base / "_ledger"))
        ledger.record_events("r", [LedgerEvent("restore", {"checkpoint_id": "c" * 32,
                                                           "step": 7, "owner": "12"})])
        (path,) = (base / "_ledger").glob("*.parquet")
        original = path.read_bytes()
        layout = parquet_spans.spans(str(path))
        kind_of = {k: span.key for span in layout for k in range(span.start, span.end)}
        ledger._refresh()
        expected = intact_rows(ledger._read(run_id="r"))[0].to_pylist()
        assert len(expected) == 1
        warnings = _Warnings()
        logger = logging.getLogger("lakeckpt_tables.ledger")
        logger.addHandler(warnings)
        outcomes: dict[str, list[str]] = {}
        try:
            for k in parquet_spans.sample(original, layout):
                flipped = bytearray(original)
                flipped[k] ^= 1 << (k % 8)
                path.write_bytes(bytes(flipped))
                ledger._verified.discard(str(path))  # a new file to this process
                before = warnings.count
                try:
                    rows, damaged = intact_rows(ledger._read(run_id="r"))
                except LedgerCorruptError:
                    outcome = "named"
                except Exception as e:  # what the test hunts
                    outcome = f"unnamed {type(e).__name__}: {e}"
                else:
                    if warnings.count > before or damaged:
                        outcome = "warned"
                    elif rows.to_pylist() == expected:
                        outcome = "unchanged"
                    else:
                        outcome = "silent"
                outcomes.setdefault(outcome, []).append(f"{k} ({kind_of[k]})")
        finally:
            logger.removeHandler(warnings)
            path.write_bytes(original)
        ledger._verified.clear()
        assert intact_rows(ledger._read(run_id="r"))[0].to_pylist() == expected
        return outcomes
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.timeout(120)
def test_every_flipped_bit_of_a_ledger_file_is_named_or_warned_never_unnamed_or_silent(
        flips: dict[str, list[str]]) -> None:
    """Issue 19: a bit flip at offset 5940 of a Delta ledger file raised a bare ValueError (a
    null where the schema allows none, from a flipped footer schema or definition level)."""
    unnamed = {o: ks[:5] for o, ks in flips.items() if o.startswith("unnamed")}
    assert unnamed == {}
    assert flips.get("silent", []) == []
    hit = [k for ks in flips.values() for k in ks]
    assert len(hit) > 1000
    # the flips in page bodies are caught by their checksums, those in the footer by its digest
    assert {k for k in hit if "page body" in k} <= set(flips["named"])
    assert {k for k in hit if "(footer." in k} <= set(flips["named"]) | set(flips["warned"])
    assert len(flips["warned"]) > len(hit) // 5
