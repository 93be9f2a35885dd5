"""``lakeckpt gc`` removes the ledger's orphan files (a commit that crashed before landing) and
the files a compaction replaced, each past its grace period, and nothing else: live files and
young files are kept, and every row still reads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.cli import main
from lakeckpt_tables.ledger import DeltaLedger
from lakeckpt_tables.ledger.summary import SUMMARY_DIR

SAVE = """
import sys, torch
from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.tools import crash
crash.install()
manager = CheckpointManager(sys.argv[1], "r")
for step in (1, 2):
    manager.save(step, model=torch.nn.Linear(2, 1))
"""


def _files(root: Path) -> set[str]:
    ledger = root / "_ledger"
    return {p.relative_to(ledger).as_posix() for p in ledger.rglob("*.parquet")
            if "_delta_log" not in p.parts}


def _gc(root: Path, capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    capsys.readouterr()
    assert main(["gc", str(root), "--output", "json", *args]) == 0
    return sorted(r["location"].rsplit("/_ledger/", 1)[1]
                  for r in json.loads(capsys.readouterr().out) if r["run_id"] == "(ledger)")


@pytest.mark.timeout(90)
def test_gc_removes_the_file_of_a_crashed_ledger_commit_and_nothing_else(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = {**os.environ, "LAKECKPT_CRASH_AT": "ledger:prepared#2", "OMP_NUM_THREADS": "1"}
    crashed = subprocess.run([sys.executable, "-c", SAVE, str(tmp_path)], env=env,
                             capture_output=True, text=True, timeout=80)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    ledger = DeltaLedger(str(tmp_path / "_ledger"))
    committed = {p.rsplit("/", 1)[-1] for p in ledger._table.file_uris()}
    (orphan,) = _files(tmp_path) - committed  # step 2's rows, written, never committed
    job = CheckpointManager(tmp_path, "r")
    assert job.restore(model=torch.nn.Linear(2, 1)) == 1
    job.save(2, model=torch.nn.Linear(2, 1))
    ledger.compact()  # replaced files: named by the log, remove_replaced's business later
    job.save(3, model=torch.nn.Linear(2, 1))
    ledger.compact()  # the first compaction's summary is now stale
    before = _files(tmp_path)
    assert _gc(tmp_path, capsys) == []  # within the grace period: a commit may be writing it
    assert _files(tmp_path) == before
    stale = sorted(p for p in before if p.startswith(SUMMARY_DIR)
                   and p.split("/")[1] not in {u.rsplit("/", 1)[-1]
                                               for u in ledger._table.file_uris()})
    assert len(stale) == 1
    assert _gc(tmp_path, capsys, "--orphans-older-than-hours", "0", "--dry-run") == \
        sorted([orphan, *stale])
    assert _files(tmp_path) == before
    assert _gc(tmp_path, capsys, "--orphans-older-than-hours", "0") == sorted([orphan, *stale])
    assert _files(tmp_path) == before - {orphan, *stale}
    fresh = CheckpointManager(tmp_path, "r")
    assert fresh.restore(model=torch.nn.Linear(2, 1)) == 3
    assert [r.step for r in fresh.checkpoints()] == [1, 2, 3]
    assert ledger.to_arrow().num_rows == DeltaLedger(str(tmp_path / "_ledger")).to_arrow().num_rows


@pytest.mark.timeout(90)
def test_gc_removes_files_a_compaction_replaced_once_past_their_grace_and_keeps_every_row(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = CheckpointManager(tmp_path, "r")
    for step in (1, 2, 3):
        job.save(step, model=torch.nn.Linear(2, 1))
    ledger = DeltaLedger(str(tmp_path / "_ledger"))
    rows = ledger.to_arrow().sort_by("checksum")
    before = _files(tmp_path)
    ledger.compact()
    live = {u.rsplit("/", 1)[-1] for u in DeltaLedger(str(tmp_path / "_ledger"))._table.file_uris()}
    replaced = sorted(p for p in before if p.rsplit("/", 1)[-1] not in live)
    assert replaced  # the compaction replaced the commits' files
    assert _gc(tmp_path, capsys) == []  # within a week: an audit may still read them
    assert _gc(tmp_path, capsys, "--replaced-older-than-hours", "0", "--dry-run") == replaced
    assert set(replaced) <= _files(tmp_path)
    assert _gc(tmp_path, capsys, "--replaced-older-than-hours", "0") == replaced
    assert not set(replaced) & _files(tmp_path)
    again = DeltaLedger(str(tmp_path / "_ledger"))
    assert again.to_arrow().sort_by("checksum").equals(rows)
    assert CheckpointManager(tmp_path, "r").restore(model=torch.nn.Linear(2, 1)) == 3


@pytest.mark.timeout(120)
def test_gc_removes_an_iceberg_ledgers_unreferenced_files_and_keeps_every_row(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    from lakeckpt_tables.ledger import IcebergLedger

    uri = f"sqlite:///{tmp_path}/catalog.db"
    catalog = SqlCatalog("lakeckpt", uri=uri, warehouse=f"file://{tmp_path}/warehouse")
    job = CheckpointManager(tmp_path / "ck", "r", ledger=IcebergLedger("ns.ledger",
                                                                      catalog=catalog))
    for step in (1, 2, 3):
        job.save(step, model=torch.nn.Linear(2, 1))
    ledger = IcebergLedger("ns.ledger", catalog=catalog)
    rows = ledger.to_arrow().sort_by("checksum")
    ledger.compact()
    table = catalog.load_table("ns.ledger")
    location = table.location().removeprefix("file://")
    live = {t.file.file_path.removeprefix("file://") for t in table.scan().plan_files()}

    def files() -> set[str]:
        return {str(p) for p in Path(location).rglob("*") if p.is_file()}

    data = {p for p in files() if "/data/" in p}
    replaced = data - live
    names = {p.rsplit("/", 1)[-1] for p in live}
    summaries = {p for p in files() if SUMMARY_DIR in p and p.rsplit("/", 1)[-1] in names}
    assert summaries  # the compacted file's consumption summary
    assert replaced and live <= data  # the compaction replaced the commits' files

    def gc(*args: str) -> set[str]:
        capsys.readouterr()
        assert main(["gc", str(tmp_path / "ck"), "--ledger", "iceberg:ns.ledger", "--catalog",
                     uri, "--output", "json", *args]) == 0
        return {f"{location}/{r['location'].split('/', 1)[1]}"
                for r in json.loads(capsys.readouterr().out) if r["run_id"] == "(ledger)"}

    assert gc() == set()  # within the grace period: a commit may be writing them
    removed = gc("--orphans-older-than-hours", "0")
    assert replaced <= removed and not removed & live
    assert not removed & files() and summaries <= files()
    again = IcebergLedger("ns.ledger", catalog=catalog)
    assert again.to_arrow().sort_by("checksum").equals(rows)
    restored = CheckpointManager(tmp_path / "ck", "r", ledger=again)
    assert restored.restore(model=torch.nn.Linear(2, 1)) == 3
    restored.save(4, model=torch.nn.Linear(2, 1))  # and the ledger goes on committing
    assert [c.step for c in again.checkpoints("r")] == [1, 2, 3, 4]


@pytest.mark.parametrize(("flag", "value"), [("--keep-last", "0"), ("--keep-last", "-1"),
                                           ("--orphans-older-than-hours", "-1"),
                                           ("--replaced-older-than-hours", "-1")])
def test_a_count_below_one_or_a_negative_grace_is_refused_before_anything_is_removed(
        tmp_path: Path, flag: str, value: str) -> None:
    job = CheckpointManager(tmp_path, "r")
    for step in (1, 2):
        job.save(step, model=torch.nn.Linear(2, 1))
    before = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    with pytest.raises(SystemExit) as exited:
        main(["gc", str(tmp_path), flag, value])
    assert exited.value.code == 2
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == before
