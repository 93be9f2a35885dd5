"""The Delta ledger's log is checkpointed every few commits (NOTE [ log checkpoints ] in
``ledger/delta.py``), so that refreshing and committing do not replay a growing log."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from lakeckpt_tables.ledger import CheckpointRecord, DeltaLedger, LedgerEvent
from lakeckpt_tables.ledger.schema import FORMAT_PROPERTY, LEDGER_FORMAT_VERSION, LEDGER_SCHEMA

pytestmark = pytest.mark.timeout(60)

INTERVAL = "delta.checkpointInterval"


def _checkpoint(step: int) -> CheckpointRecord:
    return CheckpointRecord(
        run_id="r", checkpoint_id=f"ckpt-{step}", step=step,
        parent_id=None if step == 1 else f"ckpt-{step - 1}", model_location=f"m/{step}",
        manifest={}, reader_state="", source=None, source_version=None, world_size=1,
        tags=(), config_hash="h", wall_time_s=1.0)


def _log_checkpoints(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "_delta_log").glob("*.checkpoint.parquet"))


def test_a_new_ledger_checkpoints_its_log_every_ten_commits(tmp_path: Path) -> None:
    root = tmp_path / "ledger"
    ledger = DeltaLedger(str(root))
    assert DeltaTable(str(root)).metadata().configuration[INTERVAL] == "10"
    for step in range(1, 12):
        ledger.commit(_checkpoint(step))
    assert len(_log_checkpoints(root)) == 1  # the log replays from it
    assert [c.step for c in DeltaLedger(str(root)).checkpoints("r")] == list(range(1, 12))


def test_an_older_ledger_gains_the_interval_and_a_chosen_one_is_kept(tmp_path: Path) -> None:
    older, chosen = tmp_path / "older", tmp_path / "chosen"
    for root, config in ((older, {}), (chosen, {INTERVAL: "100"})):  # as older versions made it
        DeltaTable.create(str(root), LEDGER_SCHEMA, configuration={
            FORMAT_PROPERTY: str(LEDGER_FORMAT_VERSION), **config}, raise_if_key_not_exists=False)
    DeltaLedger(str(older)).record_events("r", [LedgerEvent("note", {})])
    assert DeltaTable(str(older)).metadata().configuration[INTERVAL] == "10"
    DeltaLedger(str(chosen)).record_events("r", [LedgerEvent("note", {})])
    assert DeltaTable(str(chosen)).metadata().configuration[INTERVAL] == "100"
