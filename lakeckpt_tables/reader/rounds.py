"""The rounds a reader passes through: epochs of a pinned snapshot, or segments of a followed table.

A *round* is one planned pass over a set of units; a slice's position is (round, rows). With a
pinned snapshot, round ``e`` is epoch ``e`` of it. In follow mode, round 0 is the pinned
snapshot and round ``k`` is segment ``k``: the rows appended by the commits after segment
``k - 1``'s last version. With ``refresh="epoch"``, round ``e`` is epoch ``e`` of the version
pinned for it by ``LakeDataset.set_epoch`` (NOTE [ re-pinned epochs ] there).

NOTE [ segment boundaries ]
Every DataLoader worker of every rank forms segments on its own (workers cannot run
collectives), so a boundary must not depend on when a process looks. Segment ``k`` therefore
spans the commits after segment ``k - 1`` up to the FIRST commit at which at least
``min_segment_rows`` appended rows have accumulated, or up to ``until_version``: a function of
the immutable commit log alone. Waiting never cuts a segment short; ``max_idle`` only ends the
pass, and the same segment is formed, identically, when reading resumes.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from lakeckpt_tables.errors import SourceChangedError
from lakeckpt_tables.sources.base import Snapshot, units_from_files
from lakeckpt_tables.sources.commits import Commit
from lakeckpt_tables.types import Unit

__all__ = ["DEFAULT_UNIT_ROWS", "FollowPolicy", "Round", "RoundSequence", "RoundUnits"]

log = logging.getLogger(__name__)

OnChange = Literal["fail", "skip"]


@dataclass(frozen=True, slots=True)
class Round:
    """One round. ``base is None``: the whole snapshot at ``to``; else rows appended in
    commits ``(base, to]``, minus ``skipped`` commits (version, reason)."""

    index: int
    segment: int
    epoch: int
    base: int | None
    to: int
    skipped: tuple[tuple[int, str], ...] = ()

    def to_json(self) -> list[Any]:
        return [self.index, self.segment, self.epoch, self.base, self.to,
                [list(s) for s in self.skipped]]

    @classmethod
    def from_json(cls, value: Any) -> Round:
        index, segment, epoch, base, to, skipped = value
        return cls(int(index), int(segment), int(epoch), None if base is None else int(base),
                   int(to), tuple((int(v), str(r)) for v, r in skipped))


DEFAULT_UNIT_ROWS = 4096
"""Rows of a plan unit at most: row groups are planned as row ranges of this size, so that
shuffle mixes and work divides at any row-group size (issue 8 item 9)."""


@dataclass(frozen=True)
class RoundUnits:
    """A round's row groups (canonical order) and the bounded plan units cut from them.

    NOTE [ bounded units ]
    Sources read whole row groups; the plan works on *plan units*: row group ``source[u]``'s
    live rows ``[first[u], first[u] + rows[u])``, at most ``unit_rows`` each. The plan keeps
    the parts of one row group together (groups are permuted, then parts within a group), so
    a slice's range, and so its shuffle windows, touch few row groups, and the reader keeps
    those few decoded (``reader/_cache.py``) instead of decoding a row group per part.
    """

    units: tuple[Unit, ...]
    rows: np.ndarray[Any, np.dtype[np.int64]]
    source: np.ndarray[Any, np.dtype[np.int64]]
    first: np.ndarray[Any, np.dtype[np.int64]]

    @classmethod
    def of(cls, units: Sequence[Unit], unit_rows: int = DEFAULT_UNIT_ROWS) -> RoundUnits:
        sizes = np.array([u.rows for u in units], dtype=np.int64)
        if not len(sizes):
            empty = np.zeros(0, dtype=np.int64)
            return cls((), empty, empty, empty)
        parts = np.maximum(-(-sizes // unit_rows), 1)
        source = np.repeat(np.arange(len(units), dtype=np.int64), parts)
        start = np.concatenate([[0], np.cumsum(parts)[:-1]]).astype(np.int64)
        k = np.arange(len(source), dtype=np.int64) - np.repeat(start, parts)
        # parts of equal size (+-1 row) rather than a small remainder at the end
        first = (k * sizes[source]) // parts[source]
        end = ((k + 1) * sizes[source]) // parts[source]
        return cls(tuple(units), (end - first).astype(np.int64), source, first)

    def at(self, u: int, r0: int, r1: int) -> tuple[Unit, int, int]:
        """Plan unit ``u``'s rows ``[r0, r1)`` as (row group, first row, end row) of it."""
        first = int(self.first[u])
        return self.units[int(self.source[u])], first + r0, first + r1


@dataclass(frozen=True, kw_only=True)
class FollowPolicy:
    """How a reader follows its table (see NOTE [ segment boundaries ]).

    Attributes:
        min_segment_rows: appended rows a segment waits for before it is formed.
        poll_interval: seconds between looks at the table while waiting.
        max_idle: end the pass after this many seconds without a new commit (world size 1
            only: ranks would stop at different steps); None waits for ever.
        until_version: last version (Delta) or snapshot id (Iceberg) to read; None: no end.
        on_change: commits that delete or rewrite rows: ``"fail"`` or ``"skip"``.
    """

    min_segment_rows: int
    poll_interval: float = 1.0
    max_idle: float | None = None
    until_version: int | None = None
    on_change: OnChange = "fail"

    def __post_init__(self) -> None:
        if self.min_segment_rows < 1:
            raise ValueError(f"min_segment_rows must be >= 1, got {self.min_segment_rows}")
        if self.poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0, got {self.poll_interval}")
        if self.on_change not in ("fail", "skip"):
            raise ValueError(f"on_change must be 'fail' or 'skip', got {self.on_change!r}")


class RoundSequence:
    """The rounds of one reader: the same in every process that asks."""

    def __init__(self, source: Any, snapshot: Snapshot, columns: Sequence[str], *,
                 epochs: int, follow: FollowPolicy | None, refresh: bool = False,
                 unit_rows: int = DEFAULT_UNIT_ROWS) -> None:
        self.unit_rows = unit_rows
        self.source = source
        self.snapshot = snapshot
        self.columns = list(columns)
        self.epochs = epochs
        self.follow = follow
        self.refresh = refresh
        self._units: dict[int, RoundUnits] = {0: RoundUnits.of(snapshot.units, unit_rows)}
        self._formed: dict[int, Round] = {}
        self._pinned: dict[int, Round] = {}  # refresh="epoch": epochs pinned by set_epoch
        self._versions: dict[int, RoundUnits] = {snapshot.version: self._units[0]}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_units"] = {0: self._units[0]}  # other rounds are cheap to list again
        state["_formed"] = {}
        return state

    def pin(self, index: int, snapshot: Snapshot) -> Round:
        """refresh="epoch": round ``index`` reads all of ``snapshot`` (resolved by the caller
        in the main process, since resolving a Delta snapshot is not fork-safe)."""
        rnd = Round(index, index, index, None, snapshot.version)
        self._pinned[index] = rnd
        self._versions[snapshot.version] = RoundUnits.of(snapshot.units, self.unit_rows)
        return rnd

    def needs_descriptor(self, rnd: Round) -> bool:
        """Whether a reader state must name ``rnd`` (it cannot be derived from the config)."""
        return self.refresh or rnd.base is not None

    def first(self) -> Round:
        return Round(0, 0, 0, None, self.snapshot.version)

    def get(self, index: int, known: Mapping[int, Round], *, wait: bool) -> Round | None:
        """Round ``index``; None when the pass ends before it (epochs done, end version,
        idle). ``known`` holds rounds named by a reader state."""
        if self.refresh:
            return known.get(index, self._pinned.get(index))
        if self.follow is None:
            return Round(index, 0, index, None, self.snapshot.version) \
                if index < self.epochs else None
        if index == 0:
            return self.first()
        if index in known:
            return known[index]
        if index in self._formed:
            return self._formed[index]
        prev = self.get(index - 1, known, wait=wait)
        if prev is None:
            return None
        formed = self._form(prev, wait)
        if formed is not None:
            self._formed[index] = formed
        return formed

    def units(self, rnd: Round) -> RoundUnits:
        """The units a round reads (listed from the commit log for follow segments)."""
        if rnd.base is None:
            if rnd.to not in self._versions:  # a re-pinned epoch named by a reader state
                self._versions[rnd.to] = RoundUnits.of(self.source.snapshot(rnd.to).units,
                                                            self.unit_rows)
            return self._versions[rnd.to]
        key = rnd.index
        if key not in self._units:
            self._units[key] = RoundUnits.of(self._segment_units(rnd), self.unit_rows)
        return self._units[key]

    # ------------------------------------------------------------------------ follow

    def at_end(self, version: int) -> bool:
        """Follow mode: whether ``version`` is at or past ``until_version`` (the pass ends)."""
        assert self.follow is not None
        until = self.follow.until_version
        return until is not None and (version == until or self.source.is_after(version, until))

    def _next_commit(self, version: int, wait: bool) -> Commit | None:
        assert self.follow is not None
        idle_since = time.monotonic()
        parent = os.getppid()
        while True:
            commit: Commit | None = self.source.commit_after(version, self.snapshot,
                                                             self.columns)
            if commit is not None or not wait:
                return commit
            if (self.follow.max_idle is not None
                    and time.monotonic() - idle_since >= self.follow.max_idle):
                return None
            if os.getppid() != parent and _in_dataloader_worker():
                # our trainer died (SIGKILL): a DataLoader worker waiting here never returns
                # to torch's own check, so it must notice and end. A trainer whose launcher
                # died is left to its launcher's fate: ending its pass would look finished.
                return None
            time.sleep(self.follow.poll_interval)

    def _form(self, prev: Round, wait: bool) -> Round | None:
        """Segment after ``prev``, by NOTE [ segment boundaries ]; None if not formed yet."""
        assert self.follow is not None
        version, rows = prev.to, 0
        units: list[Unit] = []
        skipped: list[tuple[int, str]] = []
        while not self.at_end(version):
            commit = self._next_commit(version, wait)
            if commit is None:
                if wait and rows:
                    log.warning(
                        "%s: the pass ends idle with %d appended row(s) in versions (%d, %d] "
                        "waiting for min_segment_rows=%d; they are read when following resumes",
                        self.snapshot.identity.describe(), rows, prev.to, version,
                        self.follow.min_segment_rows)
                return None  # idle: the segment is formed, identically, when reading resumes
            version = commit.version
            if commit.kind == "append":
                new, _ = units_from_files(self.snapshot.identity, version, commit.files,
                                          self.snapshot.row_reader().storage)
                units.extend(new)
                rows += sum(u.rows for u in new)
            else:
                skipped.append((version, self._skip_reason(commit)))
            if rows >= self.follow.min_segment_rows:
                break
        if version == prev.to:
            return None  # at the end version already
        formed = Round(prev.index + 1, prev.segment + 1, 0, prev.to, version, tuple(skipped))
        self._units[formed.index] = RoundUnits.of(sorted(units), self.unit_rows)
        return formed

    def _skip_reason(self, commit: Commit) -> str:
        assert self.follow is not None
        where = f"{self.snapshot.identity.describe()} version {commit.version}"
        if commit.kind == "schema":
            raise SourceChangedError(f"{where} ({commit.operation}): {commit.detail}; the "
                                     "reader cannot honour it. Start a new run on the new schema.")
        if commit.kind == "change" and self.follow.on_change == "fail":
            raise SourceChangedError(
                f"{where} ({commit.operation}) deletes or rewrites rows: {commit.detail}. "
                "Pass on_change='skip' to go on without that commit's rows.")
        return f"{commit.kind} {commit.operation}: {commit.detail}"

    def _segment_units(self, rnd: Round) -> list[Unit]:
        """List a known segment's units again (in another process, or after a resume)."""
        assert rnd.base is not None
        skipped = {v for v, _ in rnd.skipped}
        version, units = rnd.base, list[Unit]()
        while version != rnd.to:
            commit = self.source.commit_after(version, self.snapshot, self.columns)
            if commit is None:
                raise SourceChangedError(
                    f"{self.snapshot.identity.describe()}: the commit after version {version} "
                    f"is gone, but segment {rnd.segment} of the reader state covers versions "
                    f"({rnd.base}, {rnd.to}]; the log was cleaned up or rewritten")
            version = commit.version
            if commit.kind == "append" and version not in skipped:
                units.extend(units_from_files(self.snapshot.identity, version, commit.files,
                                              self.snapshot.row_reader().storage)[0])
        return sorted(units)


def _in_dataloader_worker() -> bool:
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None
