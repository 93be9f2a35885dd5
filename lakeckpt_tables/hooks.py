"""Named instants of the save protocol where a test or a tool may act (crash points).

The library calls :func:`reached` at each instant below; the registry is empty unless a test or
a tool fills it (``lakeckpt_tables.tools.crash`` installs a SIGKILL there), so a training run
pays one check of an empty list, and no module of the library imports a test hook.

- ``prepare:before_write``   before the model shard is written
- ``prepare:mid_write``      data files written, DCP ``.metadata`` not yet
- ``prepare:after_write``    model written and reader state captured, before reporting
- ``commit:before``          every rank prepared, before the ledger commit (rank 0)
- ``ledger:prepared``        the ledger commit's file written, not yet in the log (rank 0)
- ``commit:after``           ledger committed, before the ranks hear of it (rank 0)
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["POINTS", "Hook", "install", "reached"]

POINTS = ("prepare:before_write", "prepare:mid_write", "prepare:after_write", "commit:before",
          "ledger:prepared", "commit:after")

Hook = Callable[[str, int], None]
"""Called with the point's name and the rank that reached it."""

_hooks: list[Hook] = []


def install(hook: Hook) -> Callable[[], None]:
    """Call ``hook`` at every point reached in this process; returns its removal."""
    _hooks.append(hook)
    return lambda: _hooks.remove(hook)


def reached(point: str, rank: int) -> None:
    """The protocol is at ``point`` on ``rank``: run the installed hooks (none in production)."""
    for hook in tuple(_hooks):
        hook(point, rank)
