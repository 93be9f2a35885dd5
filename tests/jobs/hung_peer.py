"""Two ranks of a job that set a collective timeout; rank 1 hangs, rank 0 waits for it in the
checkpoint protocol.

``hung_peer.py DIR RANK TIMEOUT``: the ranks meet through files in DIR (no port to pick) and
make the protocol's group, then rank 1 sleeps without closing its connections, as a hung node
or a machine gone from the network would. Rank 0 prints ``<ErrorClass> <seconds>`` for its
failed barrier (``none <seconds>`` if it returned); rank 1 waits to be killed.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from lakeckpt_tables.checkpoint._world import World


def main() -> None:
    where, rank, timeout = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    (where / f"ready{rank}").touch()  # imports done: the timeout counts from here on
    while not (where / f"ready{1 - rank}").exists():
        time.sleep(0.01)
    dist.init_process_group("gloo", init_method=f"file://{where / 'store'}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=timeout))
    world = World()
    if rank == 1:
        time.sleep(600)
    start = time.monotonic()
    outcome = "none"
    try:
        world.barrier()
    except Exception as exc:  # its class is the outcome
        outcome = type(exc).__name__
    print(outcome, round(time.monotonic() - start, 2), flush=True)


if __name__ == "__main__":
    main()
