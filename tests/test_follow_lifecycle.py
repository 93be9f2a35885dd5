"""How a follower ends: idle with rows pending, and orphaned by a SIGKILLed trainer."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import write_deltalake
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset

JOB = str(Path(__file__).parent / "jobs" / "orphan_follower.py")


def _append(path: Path, first: int, last: int) -> None:
    write_deltalake(str(path), pa.table({"id": np.arange(first, last, dtype=np.int64)}),
                    mode="append")


def test_an_idle_end_with_appended_rows_below_the_segment_size_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _append(tmp_path, 0, 50)
    _append(tmp_path, 50, 60)
    dataset = LakeDataset(DeltaSource(str(tmp_path)), version=0, batch_size=8, follow=True,
                          poll_interval=0.02, max_idle=0.2, min_segment_rows=25)
    with caplog.at_level(logging.WARNING):
        ids = [int(i) for b in StatefulDataLoader(dataset, batch_size=None) for i in b["id"]]
    assert sorted(ids) == list(range(50))
    assert "10 appended row(s) in versions (0, 1]" in caplog.text


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                         text=True).stdout
    return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


@pytest.mark.slow
def test_followers_workers_end_when_their_trainer_is_sigkilled(tmp_path: Path) -> None:
    _append(tmp_path, 0, 16)
    trainer = subprocess.Popen([sys.executable, JOB, str(tmp_path)], stdout=subprocess.PIPE,
                               text=True)
    assert trainer.stdout is not None
    trainer.stdout.readline()  # a batch came: the workers are up and then wait for commits
    workers = _children(trainer.pid)
    assert workers, "the trainer has DataLoader workers"
    os.kill(trainer.pid, signal.SIGKILL)
    trainer.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.2)
    assert not any(_alive(w) for w in workers), "orphaned workers kept polling"


def test_an_iceberg_end_snapshot_that_does_not_exist_is_refused_up_front(
        tmp_path: Path) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    from lakeckpt_tables import IcebergSource
    from lakeckpt_tables.errors import SourceNotFoundError

    catalog = SqlCatalog("c", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", schema=pa.schema([("id", pa.int64())]))
    table.append(pa.table({"id": pa.array([1, 2], pa.int64())}))
    with pytest.raises(SourceNotFoundError, match="no snapshot 12345"):
        LakeDataset(IcebergSource("ns.t", catalog=catalog), batch_size=2, follow=True,
                    until_version=12345)
