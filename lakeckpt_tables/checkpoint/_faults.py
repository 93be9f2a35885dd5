"""Crash points: a test seam that SIGKILLs this process at a named instant of the protocol.

Set ``LAKECKPT_CRASH_AT=<point>`` (or ``<point>@<rank>``, or ``<point>@<rank>#<n>`` for the n-th
time the point is reached, counting from 1) in a training process. Nothing is mocked: the
process really dies there, and the tests check what survives. Points:

- ``prepare:before_write``   before the model shard is written
- ``prepare:mid_write``      data files written, DCP ``.metadata`` not yet
- ``prepare:after_write``    model written and reader state captured, before reporting
- ``commit:before``          every rank prepared, before the ledger commit (rank 0)
- ``ledger:prepared``        the ledger commit's file written, not yet in the log (rank 0):
                             leaves an orphan ledger file for ``lakeckpt gc``
- ``commit:after``           ledger committed, before the ranks hear of it (rank 0)
"""

from __future__ import annotations

import os
import signal

__all__ = ["crash_point"]

ENV = "LAKECKPT_CRASH_AT"
_hits: dict[str, int] = {}


def crash_point(point: str, rank: int) -> None:
    """SIGKILL this process if ``LAKECKPT_CRASH_AT`` names ``point`` (for ``rank``)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    spec, _, nth = spec.partition("#")
    name, _, want_rank = spec.partition("@")
    if name != point:
        return
    if want_rank and int(want_rank) != rank:
        return
    _hits[point] = _hits.get(point, 0) + 1
    if nth and _hits[point] != int(nth):
        return
    os.kill(os.getpid(), signal.SIGKILL)
