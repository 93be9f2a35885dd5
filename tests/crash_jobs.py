"""Jobs of the crash tests (``test_checkpoint_crash*.py``): a small Delta table with unique ids,
the training job ``jobs/train.py`` run alone or under torchrun, and the checks every crash test
makes against a failure-free run (ids per rank in order, bit-identical parameters, the ledger)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from deltalake import WriterProperties, write_deltalake

from lakeckpt_tables import DeltaSource
from lakeckpt_tables.ledger import DeltaLedger

JOB = str(Path(__file__).parent / "jobs" / "train.py")
ROWS = 600


def write_table(path: Path, rows: int, first_id: int = 0) -> None:
    rng = np.random.default_rng(first_id)
    props = WriterProperties(max_row_group_size=40)
    for start in range(first_id, first_id + rows, 150):
        ids = np.arange(start, min(start + 150, first_id + rows), dtype=np.int64)
        x = rng.standard_normal((len(ids), 4), dtype=np.float32)
        table = pa.table({
            "id": ids,
            "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 4),
            "y": pa.array(x.sum(axis=1) * 0.5, pa.float32()),
        })
        write_deltalake(str(path), table, mode="append", writer_properties=props)


def run(table: Path, root: Path, out: Path, *, nproc: int = 1, crash: str | None = None,
         extra: tuple[str, ...] = ()) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("LAKECKPT_CRASH_AT", None)
    if crash:
        env["LAKECKPT_CRASH_AT"] = crash
    args = ["--table", str(table), "--root", str(root), "--out", str(out), *extra]
    if nproc == 1:
        cmd = [sys.executable, JOB, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", "--max-restarts=0", JOB, *args]
    return subprocess.run(cmd, env=env, capture_output=True, timeout=180).returncode


RUN_EACH = """
import json, sys, traceback
sys.path.insert(0, sys.argv[1])
import train
codes = []
for argv in json.loads(sys.argv[2]):
    try:
        codes.append(train.main(argv))
    except Exception:
        traceback.print_exc()
        codes.append(1)
print(json.dumps(codes))
"""


def run_each(table: Path, jobs: list[tuple[Path, Path]]) -> list[int]:
    """The single-process job for each (root, out), one after the other in ONE fresh process
    (its start, torch's import, costs more than a resume): each job's exit status."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("LAKECKPT_CRASH_AT", None)
    argvs = [["--table", str(table), "--root", str(root), "--out", str(out)]
             for root, out in jobs]
    done = subprocess.run([sys.executable, "-c", RUN_EACH, str(Path(JOB).parent),
                           json.dumps(argvs)], env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    codes: list[int] = json.loads(done.stdout.strip().splitlines()[-1])
    return codes


def logs(out: Path) -> dict[int, list[list[int]]]:
    logs = {}
    for path in sorted(out.glob("rank*.log")):
        batches = []
        for line in path.read_text().splitlines():
            batches.append([int(i) for i in line.split(" ", 1)[1].split(",")])
        logs[int(path.stem[4:])] = batches
    return logs


def params(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "params.pt")


def assert_exactly_once(logs: dict[int, list[list[int]]], rows: int = ROWS) -> None:
    seen = Counter(i for batches in logs.values() for batch in batches for i in batch)
    duplicated = [i for i, n in seen.items() if n > 1]
    missing = sorted(set(range(rows)) - set(seen))
    assert not duplicated and not missing, (duplicated[:10], missing[:10])


def assert_ledger_exactly_once(root: Path, table: Path) -> None:
    """The ledger alone proves it: rows consumed per row group add up to its rows, once."""
    consumed: Counter[tuple[str, int]] = Counter()
    for rec in DeltaLedger(str(root / "_ledger")).consumption(run_id="run").to_pylist():
        consumed[(rec["file"], rec["row_group"])] += rec["rows"]
    units = DeltaSource(str(table)).snapshot().units
    assert consumed == Counter({(u.path, u.row_group): u.rows for u in units})


def assert_same_run(out: Path, reference: Path) -> None:
    assert logs(out) == logs(reference)
    ours, theirs = params(out), params(reference)
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
