"""A short process that commits to and reads a Delta ledger, then exits (exit-abort campaign)."""

import sys

from lakeckpt_tables.ledger import CheckpointRecord, DeltaLedger

ledger = DeltaLedger(sys.argv[1])
run = f"run-{sys.argv[2]}"
ledger.commit(CheckpointRecord(
    run_id=run, checkpoint_id=f"c-{sys.argv[2]}", step=1, parent_id=None, model_location="m",
    manifest={}, reader_state="", source=None, source_version=None, world_size=1, tags=(),
    config_hash="h", wall_time_s=0.0))
for _ in range(3):
    ledger.checkpoints()
    ledger.consumption()
print(len(ledger.checkpoints()))
