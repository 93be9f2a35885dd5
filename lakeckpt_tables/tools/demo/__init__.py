"""``lakeckpt demo``: train from a synthetic Delta table, SIGKILL it twice, resume, prove it.

The demo is the library's guarantees made visible: a trainer checkpointing with
``CheckpointManager`` is SIGKILLed once between checkpoints and once inside a save, resumed each
time, and still trains every row exactly once per epoch, in the same order and to bit-identical
parameters as a run that never crashed. The proof comes from two independent sources: the row
ids the trainer saw, and the ledger's checkpoint and consumption records.

Modules: :mod:`.table` builds the table, :mod:`.train` is the training child (run as
``python -m lakeckpt_tables.tools.demo.train``), :mod:`.steplog` records what each step trained,
:mod:`.runner` starts, kills and restarts children, :mod:`.proof` checks the ids and
:mod:`.ledger_proof` the ledger, :mod:`.scenario` runs it all.
"""

from lakeckpt_tables.errors import LakeckptError

__all__ = ["DemoError"]


class DemoError(LakeckptError):
    """A demo child failed for a reason other than the SIGKILL the demo sent it."""
