"""Checkpoints committed through the ledger: model, optimizer, RNG and reader state together.

:class:`CheckpointManager` writes the model files itself (torch.distributed.checkpoint);
:class:`RunLedger` commits a checkpoint a trainer wrote (NOTE [ someone else's checkpoint ]).
Both make the same ledger commit.
"""

from lakeckpt_tables.checkpoint.manager import CheckpointManager
from lakeckpt_tables.checkpoint.run_ledger import RunLedger

__all__ = ["CheckpointManager", "RunLedger"]
