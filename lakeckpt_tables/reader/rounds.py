"""The rounds a reader passes through: epochs of a pinned snapshot, or segments of a followed table.

A *round* is one planned pass over a set of units; a slice's position is (round, rows). With a
pinned snapshot, round ``e`` is epoch ``e`` of it. In follow mode, round 0 is the pinned
snapshot and round ``k`` is segment ``k``: the rows appended by the commits after segment
``k - 1``'s last version. With ``refresh="epoch"``, round ``e`` is epoch ``e`` of the version
pinned for it by ``LakeDataset.set_epoch`` (NOTE [ re-pinned epochs ]).

Pure values (Round, RoundUnits, Tails) are in ``lakeckpt_tables.plan.rounds``, with
NOTE [ segment tails are carried ].

NOTE [ re-pinned epochs ]
Ranks and workers must read one version per epoch, but "the latest version" depends on when
one looks. So the main process decides: in ``LakeDataset.set_epoch`` rank 0 resolves the latest
version and broadcasts it over torch.distributed; every rank pins that snapshot
(:meth:`RoundSequence.pin`), and the DataLoader workers started for the epoch inherit it. An
epoch named by a loaded reader state keeps the version it had.

NOTE [ segment boundaries ]
Every DataLoader worker of every rank forms segments on its own (workers cannot run
collectives), so a boundary must not depend on when a process looks. Segment ``k`` therefore
spans the commits after segment ``k - 1`` up to the FIRST commit at which at least
``min_segment_rows`` appended rows have accumulated, or up to ``until_version``: a function of
the immutable commit log alone. Waiting never cuts a segment short; ``max_idle`` only ends the
pass, and the same segment is formed, identically, when reading resumes. With
``on_change="stop"`` a commit that deletes or rewrites rows is an end like ``until_version``,
also a function of the log: the segment holding appends before it ends at the version before
it, and no segment is formed after it, so the pass ends there on every rank and worker alike.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lakeckpt_tables.errors import SourceChangedError
from lakeckpt_tables.plan.rounds import (
    DEFAULT_UNIT_ROWS,
    Carry,
    Origin,
    Round,
    RoundUnits,
    Tails,
)
from lakeckpt_tables.reader.columns import resolve_columns
from lakeckpt_tables.reader.distributed import broadcast_from_rank0
from lakeckpt_tables.sources.base import Snapshot, units_from_files
from lakeckpt_tables.sources.commits import Commit
from lakeckpt_tables.types import Unit

__all__ = ["DEFAULT_UNIT_ROWS", "Carry", "FollowPolicy", "Round", "RoundSequence", "RoundUnits",
           "Tails"]

log = logging.getLogger(__name__)

_STOPPED: set[str] = set()  # commits a pass ended before, said once per process

OnChange = Literal["fail", "skip", "stop"]


@dataclass(frozen=True, kw_only=True)
class FollowPolicy:
    """How a reader follows its table (see NOTE [ re-pinned epochs ]
Ranks and workers must read one version per epoch, but "the latest version" depends on when
one looks. So the main process decides: in ``LakeDataset.set_epoch`` rank 0 resolves the latest
version and broadcasts it over torch.distributed; every rank pins that snapshot
(:meth:`RoundSequence.pin`), and the DataLoader workers started for the epoch inherit it. An
epoch named by a loaded reader state keeps the version it had.

NOTE [ segment boundaries ]).

    Attributes:
        min_segment_rows: appended rows a segment waits for before it is formed.
        poll_interval: seconds between looks at the table while waiting.
        max_idle: end the pass after this many seconds without a new commit (world size 1
            only: ranks would stop at different steps); None waits for ever.
        until_version: last version (Delta) or snapshot id (Iceberg) to read; None: no end.
        on_change: commits that delete or rewrite rows: ``"fail"``, ``"skip"`` or ``"stop"``
            (the pass ends before the first of them: NOTE [ segment boundaries ]).
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
        if self.on_change not in ("fail", "skip", "stop"):
            raise ValueError(f"on_change must be 'fail', 'skip' or 'stop', got "
                             f"{self.on_change!r}")


class RoundSequence:
    """The rounds of one reader: the same in every process that asks."""

    def __init__(self, source: Any, snapshot: Snapshot, columns: Sequence[str], *,
                 epochs: int | None, follow: FollowPolicy | None, refresh: bool = False,
                 unit_rows: int = DEFAULT_UNIT_ROWS) -> None:
        self.unit_rows = unit_rows
        self.source = source
        self.snapshot = snapshot
        self.columns = list(columns)
        self.epochs = epochs  # None: endless (ReaderConfig.cycle)
        self.follow = follow
        self.refresh = refresh
        self._units: dict[Round, RoundUnits] = {}  # follow segments, by descriptor
        self._formed: dict[tuple[int, Hashable], Round] = {}
        self._pinned: dict[int, Round] = {}  # refresh="epoch": epochs pinned by set_epoch
        self._versions: dict[int, RoundUnits] = {
            snapshot.version: RoundUnits.of(snapshot.units, unit_rows,
                                            origin=(None, snapshot.version))}
        self._origins: dict[Origin, dict[tuple[str, int], Unit]] = {}
        self._listed: dict[tuple[int, int], list[Unit]] = {}  # units of commits (base, to]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # other rounds are cheap to list again
        state["_versions"] = {self.snapshot.version: self._versions[self.snapshot.version]}
        state["_units"], state["_formed"], state["_origins"], state["_listed"] = {}, {}, {}, {}
        return state

    def pin(self, index: int, snapshot: Snapshot) -> Round:
        """refresh="epoch": round ``index`` reads all of ``snapshot`` (resolved by the caller
        in the main process, since resolving a Delta snapshot is not fork-safe)."""
        rnd = Round(index, index, index, None, snapshot.version)
        self._pinned[index] = rnd
        self._versions[snapshot.version] = RoundUnits.of(snapshot.units, self.unit_rows,
                                                         origin=(None, snapshot.version))
        return rnd

    def pin_epoch(self, index: int, known: Round | None, *, rank: int) -> None:
        """refresh="epoch": round ``index`` reads the version ``known`` names (a loaded
        state's), else the latest, which rank 0 resolves for every rank (NOTE [ re-pinned
        epochs ]; collective). Call it in the main process: workers inherit the pin."""
        if known is not None:
            version = known.to
        else:
            version = broadcast_from_rank0(self.source.snapshot(None).version if rank == 0
                                           else None)
        snapshot = self.source.snapshot(version)
        resolve_columns(snapshot, self.columns)
        self.pin(index, snapshot)

    def needs_descriptor(self, rnd: Round) -> bool:
        """Whether a reader state must name ``rnd`` (it cannot be derived from the config)."""
        return self.refresh or rnd.base is not None

    def first(self) -> Round:
        return Round(0, 0, 0, None, self.snapshot.version)

    def get(self, index: int, known: Mapping[int, Round], *, wait: bool,
            tails: Tails | None = None) -> Round | None:
        """Round ``index``; None when the pass ends before it (epochs done, end version,
        idle). ``known`` holds rounds named by a reader state; ``tails`` says how the round
        before a follow segment is planned, to carry its tail (none carried when None: for
        a look at the commits only)."""
        if self.refresh:
            return known.get(index, self._pinned.get(index))
        if self.follow is None:
            return Round(index, 0, index, None, self.snapshot.version) \
                if self.epochs is None or index < self.epochs else None
        if index == 0:
            return self.first()
        if index in known:
            return known[index]
        key = (index, None if tails is None else tails.key(index - 1))
        if key in self._formed:
            return self._formed[key]
        prev = self.get(index - 1, known, wait=wait, tails=tails)
        if prev is None:
            return None
        formed = self._form(prev, wait)
        if formed is not None:
            if tails is not None:
                formed = dataclasses.replace(formed, carry=tails.carry(prev, self.units(prev)))
            self._formed[key] = formed
        return formed

    def units(self, rnd: Round) -> RoundUnits:
        """The units a round reads (listed from the commit log for follow segments)."""
        if rnd.base is None:
            if rnd.to not in self._versions:  # a re-pinned epoch named by a reader state
                self._versions[rnd.to] = RoundUnits.of(self.source.snapshot(rnd.to).units,
                                                       self.unit_rows, origin=(None, rnd.to))
            return self._versions[rnd.to]
        if rnd not in self._units:
            carried = [(self._origin_unit(c), c[4], c[5], (c[0], c[1])) for c in rnd.carry]
            self._units[rnd] = RoundUnits.of(self._segment_units(rnd.base, rnd.to, rnd.skipped),
                                             self.unit_rows, origin=(rnd.base, rnd.to),
                                             carried=carried)
        return self._units[rnd]

    def _origin_unit(self, carry: Carry) -> Unit:
        """The whole row group carried rows come from, listed again from their round."""
        base, to, path, group = carry[:4]
        origin = (base, to)
        if origin not in self._origins:
            if base is None:
                units = self.units(Round(0, 0, 0, None, to)).units
            else:
                units = tuple(self._segment_units(base, to, ()))
            self._origins[origin] = {(u.path, u.row_group): u for u in units}
        unit = self._origins[origin].get((path, group))
        if unit is None or not 0 <= carry[4] < carry[5] <= unit.rows:
            raise SourceChangedError(
                f"{self.snapshot.identity.describe()}: rows [{carry[4]}, {carry[5]}) of row "
                f"group {group} of {path}, carried from versions ({base}, {to}], are not in "
                "the table's log; the log was rewritten or the reader state is damaged")
        return unit

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
        """Segment after ``prev``, by NOTE [ re-pinned epochs ]
Ranks and workers must read one version per epoch, but "the latest version" depends on when
one looks. So the main process decides: in ``LakeDataset.set_epoch`` rank 0 resolves the latest
version and broadcasts it over torch.distributed; every rank pins that snapshot
(:meth:`RoundSequence.pin`), and the DataLoader workers started for the epoch inherit it. An
epoch named by a loaded reader state keeps the version it had.

NOTE [ segment boundaries ]; None if not formed yet."""
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
            if commit.kind == "change" and self.follow.on_change == "stop":
                self._stop_before(commit, version)
                break  # the pass ends at ``version``, the last before the commit
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
        self._listed[(prev.to, version)] = sorted(units)
        return Round(prev.index + 1, prev.segment + 1, 0, prev.to, version, tuple(skipped))

    def _stop_before(self, commit: Commit, version: int) -> None:
        """``on_change="stop"``: say once why the pass ends before ``commit``."""
        where = f"{self.snapshot.identity.describe()} version {commit.version}"
        if where in _STOPPED:
            return
        _STOPPED.add(where)
        log.warning("%s (%s) deletes or rewrites rows: %s. The pass ends at version %d, the "
                    "last before it (on_change='stop'): save after the loop to record every "
                    "row read; resume with on_change='skip' to go on without that commit's "
                    "rows", where, commit.operation, commit.detail, version)

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

    def _segment_units(self, base: int, to: int,
                       skipped_commits: Sequence[tuple[int, str]]) -> list[Unit]:
        """List the units appended in commits ``(base, to]`` (in another process, after a
        resume, or for rows carried from there)."""
        if (base, to) in self._listed:
            return self._listed[(base, to)]
        skipped = {v for v, _ in skipped_commits}
        version, units = base, list[Unit]()
        while version != to:
            commit = self.source.commit_after(version, self.snapshot, self.columns)
            if commit is None:
                raise SourceChangedError(
                    f"{self.snapshot.identity.describe()}: the commit after version {version} "
                    f"is gone, but the reader state covers versions ({base}, {to}]; the log "
                    "was cleaned up or rewritten")
            version = commit.version
            if commit.kind == "append" and version not in skipped:
                units.extend(units_from_files(self.snapshot.identity, version, commit.files,
                                              self.snapshot.row_reader().storage)[0])
        self._listed[(base, to)] = sorted(units)
        return self._listed[(base, to)]


def _in_dataloader_worker() -> bool:
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None
