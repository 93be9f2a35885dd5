"""Checkpoints committed through the ledger: model, optimizer, RNG and reader state together."""

from lakeckpt_tables.checkpoint.manager import CheckpointManager

__all__ = ["CheckpointManager"]
