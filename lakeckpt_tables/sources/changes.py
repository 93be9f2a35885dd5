"""Rows of a pinned snapshot deleted from its table since: observed from the table's own metadata.

NOTE [ observing deletions ]
A pinned pass reads the rows of version P. Which of them has the table deleted by version V?
Only commits that delete or rewrite rows can (NOTE [ commit kinds ] in ``sources/commits.py``):
appends are passed over by reading their commit alone (one small read each, the cost of a
checkpoint that finds nothing). At each commit C that may delete, the table is listed at C
(``source.snapshot(C)``: deletion vectors, position deletes) and compared with what was
known before it, file by file:
- a pinned file still listed at C: the positions its deletes name at C and did not before
  are deleted *by C* (a Delta deletion vector, an Iceberg position delete or v3 vector);
- a pinned file no longer listed (a copy-on-write DELETE, UPDATE or MERGE rewrote it, or an
  OPTIMIZE moved its rows): its rows can only live on in files written since the pin. With a
  ``key`` column (unique per row), a row is deleted by C when its key is in none of the live
  rows of the files listed at C that were not pinned; rows of a rewritten file are followed
  by key from then on, through any later rewrite or deletion vector. Without a key the rows
  cannot be told apart: refused by name (``DeletionUntraceableError``), never guessed.
So every deletion is attributed to the commit that made it, with its operation. A row whose
old version an UPDATE replaced counts as deleted when its position is deleted (a deletion
vector: the table no longer holds that row), and as kept when its file was rewritten and its
key lives on (copy-on-write: the key names the row). Rows are given in the pinned snapshot's
coordinates, as the plan and the ledger's consumption records count them: (file, row group,
live row within the row group at the pin).

Called in the main process of rank 0 only (deltalake is not fork-safe).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lakeckpt_tables.errors import DeletionUntraceableError
from lakeckpt_tables.sources.base import Snapshot, Source
from lakeckpt_tables.sources.datafile import DataFile
from lakeckpt_tables.types import Unit

__all__ = ["Deletion", "DeletionWatch", "ExclusionList"]


@dataclass(frozen=True)
class ExclusionList:
    """A table of keys whose rows a run must not train on (NOTE [ exclusion lists ] in
    ``reader/deletions.py``): deletion requests, or rows of a table that cannot be changed.

    Args:
        source: the list, a :class:`~lakeckpt_tables.DeltaSource` or
            :class:`~lakeckpt_tables.IcebergSource`.
        column: its column of keys.
        matches: the column of the training table holding those keys (``column`` when None).
    """

    source: Any
    column: str
    matches: str | None = None

    @property
    def on(self) -> str:
        """The training table's column the keys are matched against."""
        return self.matches or self.column

    def describe(self) -> str:
        return f"{self.source!r}.{self.column} -> {self.on}"

    def keys(self, version: int | None) -> tuple[int, set[Any]]:
        """The list's version (the latest when None) and its keys there."""
        snap = self.source.snapshot(version)
        reader = snap.row_reader()
        keys: set[Any] = set()
        for unit in snap.units:
            keys.update(reader.read(unit, [self.column]).column(0).to_pylist())
        return snap.version, keys


@dataclass(frozen=True)
class Deletion:
    """Rows of one pinned row group one commit deleted.

    Attributes:
        version: the commit (Delta version, Iceberg snapshot id).
        operation: what its writer called it (DELETE, MERGE, delete, overwrite...).
        path: the pinned data file.
        row_group: row group index within it.
        rows: live rows within the row group at the pin (sorted, unique).
        how: ``"position"`` (deletion vector, position delete) or ``"key"`` (rewritten file).
    """

    version: int
    operation: str
    path: str
    row_group: int
    rows: np.ndarray[Any, Any]
    how: str


@dataclass
class _Pinned:
    """What is known of one pinned file: its row groups at the pin, and which of its rows
    are gone (file positions), or, once rewritten, the keys of its rows still alive."""

    units: list[Unit]
    data_file: DataFile
    gone: set[int] = field(default_factory=set)  # file positions deleted since the pin
    keys: dict[Any, tuple[int, int]] | None = None  # rewritten: key -> (row group, live row)


class DeletionWatch:
    """Deletions of a pinned snapshot's rows, observed commit by commit (NOTE [ observing
    deletions ]). One per reader, in rank 0's main process; :meth:`since` is incremental.

    Args:
        source: the table.
        pinned: the pinned snapshot.
        key: a column unique per row naming rows across rewrites; None: position deletes only.
    """

    def __init__(self, source: Source, pinned: Snapshot, key: str | None,
                 exclusions: ExclusionList | None = None) -> None:
        self.source = source
        self.pinned = pinned
        self.key = key
        self.exclusions = exclusions
        self._listed: set[Any] = set()  # keys of the exclusion list applied so far
        self._list_seen: int | None = None
        self._values: dict[tuple[str, int], list[Any]] = {}  # pinned rows' matched values
        self.seen = pinned.version  # the last commit looked at
        self._files: dict[str, _Pinned] = {}
        for unit in pinned.units:
            data_file = unit.file
            assert isinstance(data_file, DataFile)
            entry = self._files.setdefault(unit.path, _Pinned([], data_file))
            entry.units.append(unit)
        self._new_keys: dict[tuple[str, bytes], np.ndarray[Any, Any] | list[Any]] = {}

    def since(self, seen: int) -> tuple[int, list[Deletion]]:
        """Deletions committed after version ``seen`` up to the latest commit, and that
        commit (``seen`` when there is none). ``seen`` must be the pin or a version this
        watch returned (a reader state's).

        Raises:
            DeletionUntraceableError: a pinned file was rewritten and no ``key`` names its rows.
        """
        if seen != self.seen:
            self._replay_to(seen)
        out: list[Deletion] = []
        for version, operation, deletes in self._commits(seen):
            if deletes:
                out.extend(self._at(version, operation))
            self.seen = version
        return self.seen, out

    def _replay_to(self, seen: int) -> None:
        """Bring the watch to ``seen`` (a resume from a state that observed up to there)."""
        self.seen = self.pinned.version
        for entry in self._files.values():
            entry.gone, entry.keys = set(), None
        for version, operation, deletes in self._commits(self.seen, until=seen):
            if deletes:
                self._at(version, operation)
            self.seen = version
        if self.seen != seen:
            raise DeletionUntraceableError(
                f"{self.pinned.describe()}: version {seen}, recorded as observed, is not in "
                "the table's history after the pin; the log was rewritten")

    def _commits(self, after: int, until: int | None = None) -> Iterator[tuple[int, str, bool]]:
        """Every commit after ``after`` (up to ``until``): (version, operation, whether it
        may delete rows: all but appends)."""
        version = after
        while version != until:
            commit = self.source.commit_after(version, self.pinned, [])
            if commit is None:
                return
            version = commit.version
            yield version, commit.operation, commit.kind != "append"

    def listed(self, seen: int | None, version: int | None = None) -> tuple[int, list[Deletion]]:
        """The exclusion list at ``version`` (the latest when None): its version, and the
        pinned rows whose key it lists and the list did not at ``seen`` (the version a reader
        state applied; None: none yet), as deletions by the list's version."""
        assert self.exclusions is not None
        if seen != self._list_seen:  # a resume: the keys applied are the list's at ``seen``
            self._listed = set() if seen is None else self.exclusions.keys(seen)[1]
            self._list_seen = seen
        at, keys = self.exclusions.keys(version)
        new = keys - self._listed
        out: list[Deletion] = []
        if new:
            reader = self.pinned.row_reader()
            operation = f"exclusion list {self.exclusions.describe()}"
            for unit in self.pinned.units:
                key = (unit.path, unit.row_group)
                if key not in self._values:
                    self._values[key] = reader.read(unit, [self.exclusions.on]).column(
                        0).to_pylist()
                rows = [i for i, v in enumerate(self._values[key]) if v in new]
                if rows:
                    out.append(Deletion(at, operation, unit.path, unit.row_group,
                                        np.array(rows, dtype=np.int64), "list"))
        self._listed |= keys
        self._list_seen = at
        return at, out

    def _at(self, version: int, operation: str) -> list[Deletion]:
        kw = {} if self.pinned.schema_id is None else {"schema_id": self.pinned.schema_id}
        # whole files: their deletes and row counts from the metadata, no footer read
        listing = getattr(self.source, "with_units", None)
        now = (listing("files") if listing is not None else self.source).snapshot(version, **kw)
        listed: dict[str, DataFile] = {}
        for unit in now.units:
            assert isinstance(unit.file, DataFile)
            listed.setdefault(unit.path, unit.file)
        out: list[Deletion] = []
        for path, entry in self._files.items():
            if entry.keys is not None:
                continue  # followed by key below
            current = listed.get(path)
            if current is not None:
                out.extend(self._positions(version, operation, path, entry, current))
            else:
                self._rewritten(version, operation, path, entry)
        keyed = [(p, e) for p, e in self._files.items() if e.keys]
        if keyed:
            alive = self._keys_alive(now, listed)
            for path, entry in keyed:
                assert entry.keys is not None
                dead = [k for k in entry.keys if k not in alive]
                by_group: dict[int, list[int]] = {}
                for k in dead:
                    group, live = entry.keys.pop(k)
                    by_group.setdefault(group, []).append(live)
                out.extend(Deletion(version, operation, path, g, np.unique(np.array(rows)),
                                    "key") for g, rows in sorted(by_group.items()))
        return out

    def _positions(self, version: int, operation: str, path: str, entry: _Pinned,
                   current: DataFile) -> list[Deletion]:
        now = set() if current.deletes is None else set(current.deletes.positions().tolist())
        pinned = entry.data_file.deletes
        before = set() if pinned is None else set(pinned.positions().tolist())
        new = np.array(sorted(now - before - entry.gone), dtype=np.int64)
        if not len(new):
            return []
        entry.gone.update(new.tolist())
        out = []
        sizes = np.asarray(entry.data_file.row_group_rows or (), dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        dead_at_pin = (np.empty(0, np.int64) if pinned is None
                       else pinned.positions().astype(np.int64))
        groups = np.searchsorted(starts, new, "right") - 1
        for g in np.unique(groups):
            pos = new[groups == g]
            # live row = row within the group less the rows deleted at the pin before it
            live = (pos - starts[g]) - (np.searchsorted(dead_at_pin, pos) -
                                        np.searchsorted(dead_at_pin, starts[g]))
            out.append(Deletion(version, operation, path, int(g), live, "position"))
        return out

    def _rewritten(self, version: int, operation: str, path: str, entry: _Pinned) -> None:
        """A pinned file left the table at ``version``: follow its live rows by key."""
        if self.key is None:
            raise DeletionUntraceableError(
                f"{self.pinned.identity.describe()} version {version} ({operation}) rewrote "
                f"data file {path} of the pinned version {self.pinned.version}: which of its "
                "rows were deleted cannot be told by position. Name a column unique per row "
                "with LakeDataset(..., deletes='honor', deletes_key=COLUMN), or keep "
                "deletes='pin'")
        reader = self.pinned.row_reader()
        keys: dict[Any, tuple[int, int]] = {}
        gone = entry.gone
        sizes = np.asarray(entry.data_file.row_group_rows or (), dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        pinned = entry.data_file.deletes
        for unit in entry.units:
            values = reader.read(unit, [self.key]).column(0).to_pylist()
            if gone:  # rows deleted by position since the pin are gone already
                live_pos = _live_positions(int(starts[unit.row_group]),
                                           int(sizes[unit.row_group]), pinned)
                dead = {i for i, p in enumerate(live_pos.tolist()) if p in gone}
            else:
                dead = set()
            for i, value in enumerate(values):
                if i not in dead:
                    if value in keys:
                        raise DeletionUntraceableError(
                            f"{self.pinned.describe()}: key column {self.key!r} holds "
                            f"{value!r} twice in data file {path}; deletes_key must name a "
                            "column unique per row")
                    keys[value] = (unit.row_group, i)
        entry.keys = keys

    def _keys_alive(self, now: Snapshot, listed: Mapping[str, DataFile]) -> set[Any]:
        """Keys of the live rows of the files listed at ``now`` that were not pinned."""
        assert self.key is not None
        reader = now.row_reader()
        alive: set[Any] = set()
        by_path: dict[str, list[Unit]] = {}
        for unit in now.units:
            if unit.path not in self._files:
                by_path.setdefault(unit.path, []).append(unit)
        for path, units in by_path.items():
            deletes = listed[path].deletes
            cache = (path, b"" if deletes is None else deletes.data)
            values = self._new_keys.get(cache)
            if values is None:
                values = [v for u in units
                          for v in reader.read(u, [self.key]).column(0).to_pylist()]
                self._new_keys[cache] = values
            alive.update(values)
        return alive


def _live_positions(start: int, rows: int, deletes: Any) -> np.ndarray[Any, Any]:
    """File positions of the live rows of a row group at the pin, in order."""
    keep = np.ones(rows, dtype=bool) if deletes is None else deletes.keep(start, rows)
    return np.flatnonzero(keep) + start
