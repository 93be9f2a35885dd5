"""No abnormal exit: read-only commands on an S3 root end with the status of their result.

``lakeckpt verify`` on an S3 root aborted at interpreter shutdown (``terminate called without
an active exception``, exit 134) in 5 of 40 runs, after printing the right result: S3 clients
still referenced when pyarrow shut the AWS SDK down (NOTE [ S3 at exit ] in
:mod:`lakeckpt_tables.io.filesystems`). The commands run here against the real S3 server,
reaching it through the ``AWS_*`` environment as the command line does without options.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter

import _s3server
import pytest
import torch
from _s3server import S3Server

from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.io import Storage
from lakeckpt_tables.io.filesystems import release_s3_clients

s3 = _s3server.s3  # the fixture of the module

LAKECKPT = [sys.executable, "-m", "lakeckpt_tables.cli"]
COMMANDS = (("verify",), ("checkpoints",), ("progress",), ("audit", "--file", "none.parquet"))
SECONDS = 15.0
RUNS = int(os.environ.get("LAKECKPT_EXIT_RUNS", "0"))
"""``LAKECKPT_EXIT_RUNS=50``: every command that many times (the campaign), not for SECONDS."""


def test_the_exit_hook_drops_every_s3_client_a_store_built(s3: S3Server) -> None:
    store = Storage(f"s3://{s3.bucket('exit')}/root", s3.options())
    store.put("a", b"1")
    assert store._fs is not None
    release_s3_clients()
    assert store._fs is None
    assert store.read_bytes("a") == b"1"  # a store used after it builds a client again


@pytest.mark.slow
@pytest.mark.timeout(180 + 10 * RUNS * len(COMMANDS))
def test_read_only_commands_on_an_s3_root_never_exit_abnormally(s3: S3Server) -> None:
    root = f"s3://{s3.bucket('exitcli')}/ckpt"
    manager = CheckpointManager(root, "run", storage_options=s3.options())
    for step in (1, 2):
        manager.save(step, model=torch.nn.Linear(2, 1))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=s3.key, AWS_SECRET_ACCESS_KEY=s3.secret, AWS_REGION="us-east-1",
               AWS_ENDPOINT_URL=s3.endpoint, AWS_ALLOW_HTTP="true",
               AWS_EC2_METADATA_DISABLED="true")
    codes: Counter[tuple[str, int]] = Counter()
    aborted = []
    started = time.monotonic()
    runs = 0
    wanted = RUNS * len(COMMANDS) or len(COMMANDS)
    while runs < wanted or (not RUNS and time.monotonic() - started < SECONDS):
        command, *extra = COMMANDS[runs % len(COMMANDS)]
        done = subprocess.run([*LAKECKPT, command, root, *extra], env=env, capture_output=True,
                              text=True, timeout=120)
        codes[(command, done.returncode)] += 1
        if done.returncode not in (0, 1) or "terminate called" in done.stderr:
            aborted.append((command, done.returncode, done.stderr[-500:]))
        runs += 1
    assert aborted == [], codes
    assert codes[("verify", 0)] >= 1 and codes[("checkpoints", 0)] >= 1
