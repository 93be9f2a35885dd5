"""The two warnings every run printed are silenced exactly where the library causes them
(docs/limits.md#warnings): torchdata's set_vital call, and DCP's single-process notice in the
manager's own save and load. The same warnings from anyone else's call still show."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
import torch.distributed.checkpoint as dcp
from deltalake import write_deltalake
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.checkpoint import CheckpointManager

ONE_PROCESS = "torch.distributed is disabled, unavailable or uninitialized"


def test_dcp_warns_for_its_own_callers_but_not_in_the_managers_save_and_restore(
        tmp_path: Path) -> None:
    write_deltalake(tmp_path / "t", pa.table({"id": np.arange(8)}))
    dataset = LakeDataset(DeltaSource(str(tmp_path / "t")), batch_size=4)
    model = torch.nn.Linear(1, 1)
    with warnings.catch_warnings(record=True) as caught:
        loader = StatefulDataLoader(dataset, batch_size=None)
        manager = CheckpointManager(str(tmp_path / "ckpt"), "r")
        assert manager.restore(model=model, dataloader=loader) is None
        assert len(list(loader)) == 2
        manager.save(2, model=model, dataloader=loader)
        assert CheckpointManager(str(tmp_path / "ckpt"), "r").restore(
            model=model, dataloader=StatefulDataLoader(dataset, batch_size=None)) == 2
    assert [str(w.message) for w in caught if ONE_PROCESS in str(w.message)] == []
    with warnings.catch_warnings(record=True) as caught:
        dcp.save({"w": torch.zeros(1)}, checkpoint_id=str(tmp_path / "own"))
    assert any(ONE_PROCESS in str(w.message) for w in caught)


def test_torchdatas_set_vital_call_is_silent_and_anyone_elses_still_warns() -> None:
    # A process of its own: pytest drops filters installed while it imports test modules, and
    # tests/conftest.py ignores every set_vital warning of the suite.
    script = textwrap.dedent("""
        import torch
        from torchdata.stateful_dataloader import StatefulDataLoader
        import lakeckpt_tables.reader
        StatefulDataLoader([0, 1])
        torch.set_vital("Dataloader", "enabled", "True")  # line 6: the script's own call
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    vital = [line for line in done.stderr.splitlines() if "'set_vital' is deprecated" in line]
    assert vital == ["<string>:6: UserWarning: 'set_vital' is deprecated, please do not call"]
