"""``lakeckpt demo``: train from a synthetic Delta table, SIGKILL the trainer, resume, prove it.

The demo is the library's guarantees made visible: every row trained exactly once across a real
crash, in the same order and with bit-identical parameters as a run that never crashed.

Modules: :mod:`.table` builds the table, :mod:`.train` is the training child (run as
``python -m lakeckpt_tables.demo.train``), :mod:`.steplog` records what each step trained,
:mod:`.runner` starts, kills and restarts children, :mod:`.proof` checks the result.
"""

from lakeckpt_tables.errors import LakeckptError

__all__ = ["DemoError"]


class DemoError(LakeckptError):
    """A demo child failed for a reason other than the SIGKILL the demo sent it."""
