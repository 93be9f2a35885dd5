"""Tags given after the commit (``lakeckpt tag``) are honoured by the manager: a tagged
checkpoint is never collected (retention, ``gc``), and ``restore(tag=...)`` finds it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lakeckpt_tables.checkpoint import CheckpointManager
from lakeckpt_tables.cli import main


def _model(value: float) -> torch.nn.Linear:
    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.fill_(value)
    return model


def test_a_checkpoint_tagged_by_the_cli_survives_retention_and_gc_and_restores_by_tag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = CheckpointManager(tmp_path, "r", keep_last=1)
    first = job.save(1, model=_model(1.0))
    assert main(["tag", str(tmp_path), first.checkpoint_id[:10], "best"]) == 0
    for step in (2, 3, 4):  # the running job read its records before the tag was given
        job.save(step, model=_model(float(step)))
    assert (tmp_path / first.model_location).is_dir()
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == sorted(
        Path(r.model_location).name for r in job.checkpoints() if r.step in (1, 4))
    assert job.gc() == []
    assert (tmp_path / first.model_location).is_dir()
    assert [(r.step, r.tags) for r in job.checkpoints()] == [
        (1, ("best",)), (2, ()), (3, ()), (4, ())]
    model = _model(0.0)
    assert CheckpointManager(tmp_path, "r").restore(model=model, tag="best",
                                                    read_only=True) == 1
    assert model.weight.tolist() == [[1.0, 1.0]]
    capsys.readouterr()
