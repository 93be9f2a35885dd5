"""What every ledger shares besides its methods: the run scan, event names, commit attempts.

The methods are :class:`~lakeckpt_tables.ledger.base.Ledger`'s (one abstract class that every
backend derives from, so the contract is written once).

See NOTE [ ledger commit protocol ] in :mod:`lakeckpt_tables.ledger.base` for how commits keep
their promises, and NOTE [ retired and damaged records ] for what a scan leaves out.
"""

from __future__ import annotations

from dataclasses import dataclass

from lakeckpt_tables.ledger.records import CheckpointRecord, DamagedRecord

__all__ = ["COMMIT_ATTEMPTS", "EVENT_RETIRED", "EVENT_TAG", "RunScan"]

EVENT_RETIRED = "retired"
"""Event retiring a checkpoint: ``{"checkpoint_id", "step", "reason"}``."""

EVENT_TAG = "tag"
"""Event tagging a committed checkpoint (``lakeckpt tag``): ``{"checkpoint_id", "step", "tag"}``.
Checkpoint rows are immutable, so tags given later live here; reads add them to the record's."""

COMMIT_ATTEMPTS = 5
"""How many times a commit that lost a race is settled and tried again before giving up."""


@dataclass(frozen=True)
class RunScan:
    """What the ledger holds of one run's checkpoints, read from one snapshot.

    Attributes:
        committed: intact checkpoints that are not retired, oldest first.
        retired: ids of retired checkpoints.
        damaged: checkpoint rows (and retirements) whose checksum fails.
    """

    committed: list[CheckpointRecord]
    retired: frozenset[str]
    damaged: list[DamagedRecord]
