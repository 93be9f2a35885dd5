"""Crash points: SIGKILL this process at a named instant of the protocol (a test seam).

Set ``LAKECKPT_CRASH_AT=<point>`` (or ``<point>@<rank>``, or ``<point>@<rank>#<n>`` for the n-th
time the point is reached, counting from 1) in a training process that called :func:`install`
(the tests' jobs, the demo's child, the chaos job). Nothing is mocked: the process really dies
there, and the tests check what survives. The points are listed in :mod:`lakeckpt_tables.hooks`;
``ledger:prepared`` leaves an orphan ledger file for ``lakeckpt gc``.
"""

from __future__ import annotations

import os
import signal

from lakeckpt_tables import hooks

__all__ = ["ENV", "crash_point", "install"]

ENV = "LAKECKPT_CRASH_AT"
_hits: dict[str, int] = {}
_installed: list[bool] = []


def install() -> None:
    """Let ``LAKECKPT_CRASH_AT`` kill this process (read when a point is reached); idempotent."""
    if not _installed:
        hooks.install(crash_point)
        _installed.append(True)


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
