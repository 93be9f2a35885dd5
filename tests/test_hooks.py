"""The ground-floor hook registry: empty unless a tool or a test fills it; a filled hook sees
every point the protocol reaches, in this process, until it is removed."""

from __future__ import annotations

from pathlib import Path

import torch

from lakeckpt_tables import hooks
from lakeckpt_tables.checkpoint import CheckpointManager


def test_an_installed_hook_sees_every_protocol_point_of_a_save_until_removed(
        tmp_path: Path) -> None:
    seen: list[tuple[str, int]] = []
    job = CheckpointManager(tmp_path, "r")
    remove = hooks.install(lambda point, rank: seen.append((point, rank)))
    try:
        job.save(1, model=torch.nn.Linear(2, 1))
    finally:
        remove()
    assert [p for p, _ in seen] == ["prepare:before_write", "prepare:mid_write",
                                    "prepare:after_write", "commit:before", "ledger:prepared",
                                    "commit:after"]
    assert set(hooks.POINTS) == {p for p, _ in seen} and {r for _, r in seen} == {0}
    job.save(2, model=torch.nn.Linear(2, 1))
    assert len(seen) == 6  # removed: the second save reached no hook
