"""Two torchrun nodes on loopback lose one and go on at a smaller world size, exactly once.

Two agents (``--nnodes 2``, one rank each, static rendezvous on 127.0.0.1) share no local disk:
each runs in its own directory with its own ``TMPDIR`` and keeps its step log there. What they
share is one S3 server holding the table and the checkpoint root, as the nodes of a real job
share an object store (per-node local roots are refused by name:
tests/test_storage_checkpoint.py). After the checkpoint at step 2, node 0 is lost (its agent
and rank SIGKILLed at once): the node of rank 0, which commits to the ledger, and of the
rendezvous store. Node 1's rank fails at its next collective and its agent exits by itself.
The job restarts on node 1 alone (world 1) from that checkpoint and re-plans the rest of the
pass. The ids trained in committed steps plus those trained after the restart are every row
once, and ``lakeckpt verify`` proves it from the ledger.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import _s3server
import numpy as np
import pyarrow as pa
import pytest
from _s3server import S3Server
from conftest import lose_machine
from deltalake import WriterProperties, write_deltalake

from lakeckpt_tables.cli import main as lakeckpt
from lakeckpt_tables.io import Storage
from lakeckpt_tables.ledger import DeltaLedger
from lakeckpt_tables.plan.check import check_exactly_once

s3 = _s3server.s3  # the fixture of the module

pytestmark = pytest.mark.slow

JOB = str(Path(__file__).parent / "jobs" / "storage_train.py")
HUNG = str(Path(__file__).parent / "jobs" / "hung_peer.py")
ROWS = 128  # batch 16: 4 steps per rank at world 2, checkpoints every 2 steps
HELD = 3  # node 0 is lost after step 3: step 3 of both ranks was trained and is lost


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _node(node: Path, launch: list[str], table: str, root: str, options: dict[str, str],
          *extra: str) -> subprocess.Popen[bytes]:
    """One node's torchrun agent, in its own directory with its own TMPDIR."""
    (node / "tmp").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(node / "tmp"),
           "LAKECKPT_TEST_OPTIONS": json.dumps(options)}
    env.pop("LAKECKPT_CRASH_AT", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", *launch, "--nproc-per-node=1",
           "--max-restarts=0", JOB, "--table", table, "--root", root, "--out",
           str(node / "out"), "--every", "2", "--collective-timeout", "30", *extra]
    with open(node / "agent.err", "ab") as err:
        return subprocess.Popen(cmd, env=env, cwd=node, stdout=subprocess.DEVNULL, stderr=err)


def _ids(log: Path, *, up_to: int | None = None) -> list[int]:
    ids = []
    for line in log.read_text().splitlines():
        step, batch = line.split(" ", 1)
        if up_to is None or int(step) <= up_to:
            ids.extend(int(i) for i in batch.split(","))
    return ids


def _steps(log: Path) -> list[int]:
    return [int(line.split(" ", 1)[0]) for line in log.read_text().splitlines()]


@pytest.mark.timeout(240)  # three agents, three ranks: 40 s at load 1 on 2 cores, 90 s at 15
def test_two_nodes_lose_one_and_resume_on_one_exactly_once(
        s3: S3Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    options = s3.options()
    table = f"s3://{s3.bucket('src')}/t"
    props = WriterProperties(max_row_group_size=24)
    for start in range(0, ROWS, 64):
        ids = np.arange(start, start + 64, dtype=np.int64)
        write_deltalake(table, pa.table({"id": ids, "x": ids.astype(np.float32)}),
                        mode="append", writer_properties=props,
                        storage_options=Storage(table, options).delta_options())
    root = f"s3://{s3.bucket('ckpt')}/ckpt"
    ledger = DeltaLedger(f"{root}/_ledger", storage_options=Storage(root, options)
                         .delta_options())
    node0, node1 = tmp_path / "node0", tmp_path / "node1"

    port = _free_port()
    pair = ["--nnodes=2", "--master-addr=127.0.0.1", f"--master-port={port}"]
    agents = [_node(node0, [*pair, "--node-rank=0"], table, root, options,
                    "--hold-after-step", str(HELD)),
              _node(node1, [*pair, "--node-rank=1"], table, root, options)]
    try:
        deadline = time.monotonic() + 120
        while not (node0 / "out" / "held").exists():
            for node, agent in zip((node0, node1), agents, strict=True):
                assert agent.poll() is None, (node / "agent.err").read_text()[-3000:]
            assert time.monotonic() < deadline, "node 0 never reached its hold"
            time.sleep(0.02)
        lose_machine(agents[0].pid)
        # node 1's rank fails at its next collective (gloo sees the peer's sockets close) and
        # its agent gives up (no restarts): a named error, no hang, no success
        assert agents[1].wait(timeout=60) != 0
        assert "CheckpointError: rank 1 of 2" in (node1 / "agent.err").read_text()
    finally:
        for agent in agents:
            if agent.poll() is None:
                lose_machine(agent.pid)
                agent.wait()
    assert [c.step for c in ledger.checkpoints("run")] == [2]
    assert max(_steps(node0 / "out" / "rank0.log")) == HELD  # trained, then lost

    # the scheduler brings the job back on the surviving node alone: world 1, and rank 0 is
    # on the node that had rank 1
    restart = node1 / "restart"
    again = _node(restart, ["--standalone", "--nnodes=1"], table, root, options)
    assert again.wait(timeout=120) == 0, (restart / "agent.err").read_text()[-3000:]
    after = restart / "out" / "rank0.log"
    assert _steps(after)[0] == 3  # restored step 2, re-planned for one rank
    committed = _ids(node0 / "out" / "rank0.log", up_to=2) + _ids(
        node1 / "out" / "rank1.log", up_to=2)
    verdict = check_exactly_once(committed + _ids(after), np.arange(ROWS))
    assert verdict, str(verdict)
    assert [c.step for c in ledger.checkpoints("run")] == [2, 4, 6, 7]
    local = [p for p in tmp_path.rglob("*") if p.suffix == ".distcp" or p.name == "_delta_log"]
    assert not local, local  # every checkpoint byte went to the object store

    capsys.readouterr()
    code = lakeckpt(["verify", root, "--storage-options", json.dumps(options), "--run", "run",
                     "--output", "json"])
    [proof] = json.loads(capsys.readouterr().out)
    assert code == 0 and proof["ok"] and proof["step"] == 7, proof
    assert proof["rows"] == ROWS and proof["finished_passes"] == [{"segment": 0, "epoch": 0}]


@pytest.mark.timeout(120)  # two ranks and a 2 s timeout: 15-38 s at load 15 on 2 cores
def test_a_hung_peer_fails_the_checkpoint_protocol_within_the_jobs_timeout(
        tmp_path: Path) -> None:
    """A node that hangs (or vanishes without closing its connections) is noticed only by a
    timeout: the protocol's own group must keep the job's, not gloo's 30 minutes."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, HUNG, str(tmp_path), str(rank), "2"], env=env,
                              stdout=subprocess.PIPE, text=True) for rank in (0, 1)]
    try:
        out, _ = ranks[0].communicate(timeout=90)
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()
    outcome, seconds = out.split()
    assert outcome == "CheckpointError" and 1.8 <= float(seconds) < 15, out
