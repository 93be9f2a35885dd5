"""Where a reader stands in the job: its rank and world size, and values rank 0 decides.

From ``torch.distributed`` when a process group is up (one process without one is a world of
one), or as given: tests simulate ranks in one process that way.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from lakeckpt_tables.errors import ProcessGroupError

__all__ = ["broadcast_from_rank0", "rank_and_world"]


def rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``rank`` and ``world_size`` as given, or from torch.distributed (else 0 of 1).

    Raises:
        ProcessGroupError: torchrun's environment says several ranks but no process group
            is up.
    """
    dist = torch.distributed
    initialized = dist.is_available() and dist.is_initialized()
    launched = os.environ.get("WORLD_SIZE", "1").strip()
    if not initialized and world_size is None and launched.isdigit() and int(launched) > 1:
        # torchrun set the environment but nobody joined the ranks: every rank would believe
        # it is alone and read the whole table (duplicates until the ledger refuses a commit)
        raise ProcessGroupError(
            f"WORLD_SIZE={launched} (RANK={os.environ.get('RANK', '?')}) is set, as torchrun "
            "does, but torch.distributed has no process group. Call "
            "torch.distributed.init_process_group() (backend 'gloo' on CPU, 'nccl' on GPU) "
            "before building the LakeDataset, or pass rank= and world_size= explicitly")
    if world_size is None:
        world_size = dist.get_world_size() if initialized else 1
    if rank is None:
        rank = dist.get_rank() if initialized else 0
    return rank, world_size


def broadcast_from_rank0(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (``value`` itself without a process group)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
