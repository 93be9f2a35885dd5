"""torchrun's elastic agent restarts the job itself, exactly once: two agents on loopback
(``--nnodes 1:2 --max-restarts 3``, c10d rendezvous), one worker each, ``CheckpointManager``.

One campaign: rank 0's worker is SIGKILLed after step 3 (once); both agents restart the job in
place at world size 2, which restores step 2 and trains on, row for row as if never killed.
After step 7 the second node leaves for good (its agent and worker SIGKILLed); the first agent
restarts the job at world size 1, which restores step 6 and re-plans the rest of the pass:
every row is trained exactly once and ``lakeckpt verify`` passes. The agents run with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (NOTE [ elastic restarts in place ]).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from crash_jobs import logs, write_table

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.audit import connect
from lakeckpt_tables.audit.exactly_once import verify
from lakeckpt_tables.checkpoint import RunLedger
from lakeckpt_tables.errors import SharedRendezvousStoreWarning
from lakeckpt_tables.ledger import DeltaLedger
from lakeckpt_tables.plan.check import check_exactly_once

JOB = str(Path(__file__).parent / "jobs" / "train.py")
ROWS, BATCH = 480, 20  # 12 steps a rank at world size 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(300)
def test_the_elastic_agent_restarts_in_place_then_shrinks_exactly_once(tmp_path: Path) -> None:
    table, root, out = tmp_path / "t", tmp_path / "ck", tmp_path / "out"
    write_table(table, ROWS)
    port = _free_port()
    def agent(is_host: bool) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2",
                "--nproc-per-node", "1", "--max-restarts", "3", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "elastic",
                "--rdzv-conf", f"is_host={str(is_host).lower()},join_timeout=60,"
                "last_call_timeout=5,keep_alive_interval=1,keep_alive_max_attempt=3",
                "--monitor-interval", "0.5",
                JOB, "--table", str(table), "--root", str(root), "--out", str(out),
                "--batch", str(BATCH), "--every", "2", "--kill-after-step", "3",
                "--once", str(tmp_path / "killed-once"), "--leave-after-step", "7"]

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    env.pop("LAKECKPT_CRASH_AT", None)
    # the node that leaves is the one not hosting the rendezvous store; it starts first and
    # waits for the store, so the first round has both nodes (max reached: no last call)
    leaves = subprocess.Popen(agent(False), env={**env, "LAKECKPT_TEST_LEAVER": "1"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        stays = subprocess.run(agent(True), env={**env, "LAKECKPT_TEST_LEAVER": "0"},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=240)
        output = stays.stdout
        leaves.wait(timeout=60)
    finally:
        leaves.kill()
    assert leaves.returncode == -9  # SIGKILLed: the node left for good
    assert stays.returncode == 0, output[-3000:]
    assert "SharedRendezvousStoreWarning" not in output
    sizes = [(r.step, r.world_size) for r in DeltaLedger(str(root / "_ledger")).checkpoints("run")]
    assert sizes[:3] == [(2, 2), (4, 2), (6, 2)] and {w for _, w in sizes[3:]} == {1}
    assert connect(str(root)).sql("SELECT step FROM recoveries ORDER BY 1").fetchall() == [
        (2,), (6,)]
    trained = logs(out)
    # world size 2 until step 6, across the in-place restart: row for row the plan's
    for rank in (0, 1):
        plan = LakeDataset(DeltaSource(str(table)), columns=["id"], batch_size=BATCH, seed=7,
                           shuffle_window=2, rank=rank, world_size=2)
        assert trained[rank][:6] == [[int(i) for i in b["id"]] for b in plan][:6], rank
    assert len(trained[1]) == 6  # the rank that left: only what the ledger committed
    every_id = [i for batches in trained.values() for batch in batches for i in batch]
    assert check_exactly_once(every_id, range(ROWS))
    (verdict,) = verify(str(root), run="run")
    assert verdict.ok and verdict.rows == ROWS, verdict.violations[:3]


def test_a_shared_rendezvous_store_with_in_place_restarts_is_named_at_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    with pytest.warns(SharedRendezvousStoreWarning, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        RunLedger(tmp_path, "run")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")  # a relaunch, not a restart in place
    with warnings.catch_warnings():
        warnings.simplefilter("error", SharedRendezvousStoreWarning)
        RunLedger(tmp_path, "run")
