"""``ReaderConfig``: what one LakeDataset reads, resolved against its table once and frozen.

A ``LakeDataset`` holds one of these: the source, the validated options
(:class:`~lakeckpt_tables.reader.options.ReaderOptions`), the pinned snapshot (the filter
applied), the columns read, the follow policy and the shuffler. Its :attr:`identity` is the
``config`` of every reader state the dataset writes: a state loads only into a reader with the
same.

NOTE [ a loaded state resolves a new configuration ]
Loading a state never changes a configuration, and checking one changes nothing. Where the
options leave something open, the state decides it: a reader built without ``version=`` reads
the version the state pinned (re-pinned in the main process only, where resolving a snapshot
is fork-safe), a follower left to the default ``min_segment_rows`` forms the segments the state
formed, and a shuffling reader permutes windows as the state's did (NOTE [ keyed permutation ]
in ``plan/shuffle.py``). :meth:`ReaderConfig.for_state` returns that configuration, a new value;
:meth:`ReaderConfig.mismatches` compares it with the state, and the dataset takes it only when
nothing differs.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lakeckpt_tables.errors import (
    EmptySourceError,
    SourceNotFoundError,
    StateMismatchError,
)
from lakeckpt_tables.plan.shuffle import BALANCED, LEGACY, SHUFFLERS
from lakeckpt_tables.reader.columns import resolve_columns
from lakeckpt_tables.reader.convert import check_convertible
from lakeckpt_tables.reader.deletions import check_honorable
from lakeckpt_tables.reader.options import Packing, ReaderOptions
from lakeckpt_tables.reader.packing.planner import StreamSizes, TokenPlanner
from lakeckpt_tables.reader.planner import Cursor, RoundPlanner
from lakeckpt_tables.reader.rounds import FollowPolicy, RoundSequence
from lakeckpt_tables.reader.state import PlanShape, ReaderState
from lakeckpt_tables.sources.base import Snapshot, Source
from lakeckpt_tables.sources.filters import filtered
from lakeckpt_tables.sources.nulls import check_nulls

__all__ = ["ReaderConfig"]


@dataclass(frozen=True, eq=False)
class ReaderConfig:
    """One reader's resolved configuration (NOTE [ a loaded state resolves a new
    configuration ]).

    Attributes:
        source: the table.
        options: the options as given (rank and world size resolved).
        snapshot: the pinned version, with the row filter applied.
        columns: the columns read, checked against the snapshot's schema and files.
        follow: how the reader follows its table; None for a pinned or re-pinned pass.
        shuffler: how windows are permuted (a loaded state may name an older one).
        cycle: the pass never ends: after its last epoch come the next ones (a Mixture's
            ``on_exhausted="cycle"``: a source's next pass is its next epochs).
    """

    source: Source
    options: ReaderOptions
    snapshot: Snapshot
    columns: tuple[str, ...]
    follow: FollowPolicy | None
    shuffler: str = BALANCED
    cycle: bool = False
    stream_sizes: dict[int, StreamSizes] = dataclasses.field(default_factory=dict, repr=False)
    """Packing: each pinned version's row groups' stream sizes, counted once per process
    (NOTE [ token plan ] in ``reader/packing/token_plan.py``)."""
    identity: dict[str, Any] = dataclasses.field(init=False)
    """What defines the rows: a state loads only into a reader with the same."""
    policy: dict[str, Any] = dataclasses.field(init=False)
    """Options that do not define the rows: they may change on resume (recorded in the
    ledger as ``policy_change`` events)."""

    @classmethod
    def resolve(cls, source: Source, options: ReaderOptions) -> ReaderConfig:
        """Pin ``source`` and check ``options`` against it (the reader's only I/O up front).

        Raises:
            TypeError: ``source`` is not a source (a path or URI string, say).
            SourceNotFoundError, UnsupportedTableError, EmptySourceError,
            UnknownColumnError, FilterError: see :mod:`lakeckpt_tables.errors`.
        """
        _check_source(source)
        snapshot = _pinned(source, options.version, options.filter)
        if snapshot.rows == 0 and not options.follow:
            raise EmptySourceError(f"{snapshot.describe()} holds no rows; nothing to read")
        follow = options.follow_policy()
        if follow is not None and follow.until_version is not None:
            _check_end_exists(source, follow.until_version)
        packing = options.packing()
        columns = options.columns if packing is None else (packing.column,)
        return cls(source, options, snapshot, resolve_columns(snapshot, columns),
                   follow)._checked()

    def _checked(self) -> ReaderConfig:
        """Output, decimal and null policies decided up front (sources.nulls, reader.convert)."""
        o = self.options
        check_convertible(self.snapshot.describe(), self.snapshot.schema, _converted(self),
                          output=o.output, nulls=o.nulls, decimals=o.decimals)
        check_nulls(self.snapshot, list(self.columns), o.nulls if o.output == "torch" else "fill")
        check_honorable(self.snapshot, o.deletes, o.deletes_key)
        if self.packing is not None:
            from lakeckpt_tables.reader.packing.stream import check_token_column
            if self.snapshot.whole_files:
                raise ValueError(
                    f"{self.snapshot.describe()}: a packing reader counts tokens per row group; "
                    "pin the source with units='row_groups' (its default) to pack it")
            check_token_column(self.snapshot.describe(), self.snapshot.schema,
                               self.packing.column, text=self.packing.text is not None)
        return self

    @property
    def packing(self) -> Packing | None:
        """How this reader packs tokens into sequences; None when it does not."""
        return self.options.packing()

    # ------------------------------------------------------------------ what a state says

    def __post_init__(self) -> None:
        # computed once: every reader state (one per batch in a DataLoader worker) holds them
        object.__setattr__(self, "identity", self._identity())
        object.__setattr__(self, "policy", {**self._policy(), **self.options.deletes_policy()})

    def _identity(self) -> dict[str, Any]:
        o = self.options
        config: dict[str, Any] = {
            "seed": o.seed, "shuffle": o.shuffle, "shuffle_window": o.shuffle_window,
            "drop_last": o.drop_last, "epochs": o.epochs, "columns": list(self.columns),
            "unit_rows": o.unit_rows}
        if o.shuffle and self.shuffler != LEGACY:  # states without one: LEGACY
            config["shuffler"] = self.shuffler
        if o.refresh is not None:
            config["refresh"] = o.refresh
        if o.filter is not None:
            config["filter"] = str(o.filter)
        if self.snapshot.schema_id is not None:  # NOTE [ schema read ] in sources/base.py
            config["schema_id"] = self.snapshot.schema_id
        if self.snapshot.whole_files:  # absent: row groups (NOTE [ lazy footers ], sources/)
            config["units"] = "files"
        if self.follow is not None:
            config["follow"] = {"min_segment_rows": self.follow.min_segment_rows}
        if self.packing is not None:
            config["pack"] = self.packing.to_json()
        if self.cycle:
            config["cycle"] = True
        return config

    def _policy(self) -> dict[str, Any]:
        if self.follow is None:
            return {}
        return {"on_change": self.follow.on_change, "until_version": self.follow.until_version,
                "max_idle": self.follow.max_idle, "poll_interval": self.follow.poll_interval}

    def empty_state(self, shape: PlanShape | None = None) -> ReaderState:
        """A state of this reader before it read anything (every slice null)."""
        slices = () if shape is None else (None,) * (shape[0] * shape[1])
        return ReaderState(self.snapshot.identity, self.snapshot.version, self.identity,
                           shape, {}, slices, policy=self.policy)

    def state_at(self, cursor: Cursor) -> ReaderState:
        """The state of a reader of this configuration whose slice stands at ``cursor``
        (other slices null: merge the states of every slice for a whole-reader state)."""
        slices: list[tuple[int, int] | None] = [None] * (cursor.shape[0] * cursor.shape[1])
        slices[cursor.slice_index] = (cursor.epoch, cursor.position)
        eos = () if self.packing is None else tuple(
            None if s is None else cursor.eos_inside for s in slices)
        return ReaderState(self.snapshot.identity, self.snapshot.version, self.identity,
                           cursor.shape, cursor.layouts, tuple(slices), cursor.rounds,
                           self.policy, eos, cursor.deletes_seen, cursor.exclusions_seen)

    # ------------------------------------------------------------------------- derived

    def rounds(self) -> RoundSequence:
        """The rounds this configuration reads (a fresh listing)."""
        o = self.options
        return RoundSequence(self.source, self.snapshot, self.columns,
                             epochs=None if self.cycle else o.epochs,
                             follow=self.follow, refresh=o.refresh is not None,
                             unit_rows=o.unit_rows)

    def same_rounds(self, other: ReaderConfig) -> bool:
        """Whether ``other`` reads the rounds this one does (only the shuffler differs)."""
        return other.snapshot is self.snapshot and other.follow == self.follow

    def planner(self, rounds: RoundSequence) -> RoundPlanner:
        """The plans of ``rounds`` (this configuration's) and what a state means to them (a
        packing reader's: ``reader/packing/planner.py``)."""
        o = self.options
        if self.packing is not None:
            return TokenPlanner(self.packing, o, self.snapshot,  # type: ignore[return-value]
                                self.stream_sizes, rounds)
        return RoundPlanner(rounds, o.shuffle, o.seed, o.shuffle_window, o.drop_last,
                            rounds.epochs,
                            follows=self.follow is not None, refreshes=o.refresh is not None,
                            rank=o.rank, where=self.snapshot.describe(), shuffler=self.shuffler)

    # ------------------------------------------------------------------- a loaded state

    def to_load(self, state: ReaderState, rounds: RoundSequence, *,
                may_repin: bool) -> tuple[ReaderConfig, RoundSequence]:
        """The configuration a reader of this one (reading ``rounds``) loads ``state`` with,
        and its rounds, once the state is known to fit them; ``may_repin``: the reader may
        take the state's version (in the main process). Nothing changes.

        Raises:
            StateMismatchError: what differs, or why the state is no position of its plan.
        """
        config = self.for_state(state, may_repin=may_repin)
        diffs = config.mismatches(state, may_repin=may_repin)
        if diffs:
            raise StateMismatchError("reader state does not match this LakeDataset: "
                                     + "; ".join(diffs))
        if not config.same_rounds(self):
            rounds = config.rounds()
        config.planner(rounds).check(state)
        return config, rounds

    def for_state(self, state: ReaderState, *, may_repin: bool) -> ReaderConfig:
        """The configuration ``state`` asks for, where the options leave it open (NOTE [ a
        loaded state resolves a new configuration ]); ``self`` when it asks for nothing.

        Raises:
            StateMismatchError: the state pinned a version the table does not list.
        """
        config = self
        schema_id = state.config.get("schema_id")
        if (_same_table(self, state) and may_repin and self.options.version is None
                and (state.version, schema_id) != (self.snapshot.version,
                                                   self.snapshot.schema_id)):
            try:
                config = config.pinned(state.version, schema_id)
            except SourceNotFoundError as exc:
                raise StateMismatchError(f"reader state pinned version {state.version}, which "
                                         f"the table does not list: {exc}") from exc
        follow = state.config.get("follow")
        theirs = follow.get("min_segment_rows") if isinstance(follow, dict) else None
        if (config.follow is not None and self.options.min_segment_rows is None
                and isinstance(theirs, int) and theirs != config.follow.min_segment_rows):
            config = dataclasses.replace(
                config, follow=dataclasses.replace(config.follow, min_segment_rows=theirs))
        shuffler = state.config.get("shuffler", LEGACY)
        if (self.options.shuffle and state.config.get("shuffle") is True
                and shuffler in SHUFFLERS and shuffler != config.shuffler):
            config = config.with_shuffler(shuffler)
        return config

    def pinned(self, version: int, schema_id: int | None = None) -> ReaderConfig:
        """This configuration reading ``version`` (with the Iceberg schema ``schema_id``,
        a state's: NOTE [ schema read ] in sources/base.py), the filter and columns kept."""
        snapshot = _pinned(self.source, version, self.options.filter, schema_id)
        return dataclasses.replace(self, snapshot=snapshot,
                                   columns=resolve_columns(snapshot, self.columns))._checked()

    def cycling(self) -> ReaderConfig:
        """This configuration reading epoch after epoch, never ending (``cycle``).

        Raises:
            ValueError: a follower or a ``refresh="epoch"`` reader (no next epoch of its own).
        """
        if self.follow is not None or self.options.refresh is not None:
            kind = "follow=True" if self.follow is not None else "refresh='epoch'"
            raise ValueError(f"{self.snapshot.describe()}: a {kind} reader has no next epoch "
                             "of its own to cycle into; cycle a reader of a pinned snapshot")
        return dataclasses.replace(self, cycle=True)

    def with_shuffler(self, shuffler: str) -> ReaderConfig:
        """This configuration permuting windows with ``shuffler`` (an older run's)."""
        if shuffler not in SHUFFLERS:
            raise ValueError(f"shuffler must be one of {SHUFFLERS}, got {shuffler!r}")
        return dataclasses.replace(self, shuffler=shuffler)

    def mismatches(self, state: ReaderState, *, may_repin: bool) -> list[str]:
        """What differs between ``state`` and a reader of this configuration (nothing when
        it may load); ``may_repin``: whether the reader could have taken the state's version."""
        if not _same_table(self, state):
            # another table's version and options mean nothing here: name the table only
            return [f"table: state is of {state.table.describe()}, this reader reads "
                    f"{self.snapshot.identity.describe()}; load a state of this table, or "
                    "build the LakeDataset over the table the state was saved from"]
        diffs = []
        if state.version != self.snapshot.version:
            how = (f"pass version={state.version}" if self.options.version is not None
                   or may_repin else "resume through dataset.load_state_dict(saved) in the "
                   f"main process, which pins it, or pass version={state.version}")
            diffs.append(f"version: state pinned {state.version}, this reader pinned "
                         f"{self.snapshot.version} ({how})")
        diffs.extend(_tokenizer_diff(state.config, ours := self.identity))
        for key in sorted(set(state.config) | set(ours)):
            if not _same_json(state.config.get(key), ours.get(key)):
                diffs.append(f"{key}: state has {state.config.get(key)!r}, this reader "
                             f"{ours.get(key)!r}")
        return diffs


def _converted(config: ReaderConfig) -> list[str]:
    """The columns converted to tensors: none when a text column is tokenized as it is read."""
    packing = config.packing
    return [] if packing is not None and packing.text is not None else list(config.columns)


def _tokenizer_diff(saved: Mapping[str, Any], ours: Mapping[str, Any]) -> list[str]:
    """The tokenizer of a text-packing state, when this reader's is another (NOTE [ text
    tokenized on the fly ] in ``reader/packing/tokenize.py``)."""
    was, now = ((c.get("pack") or {}).get("tokenizer") for c in (saved, ours))
    if was == now:
        return []
    return [f"tokenizer: the state's documents were tokenized by tokenizer {was}, this "
            f"reader's is {now}; resume with the run's tokenizer (another one cuts other "
            "sequences)"]


def _same_table(config: ReaderConfig, state: ReaderState) -> bool:
    ours = config.snapshot.identity
    return (state.table.format, state.table.table_id) == (ours.format, ours.table_id)


def _check_source(source: Any) -> None:
    if isinstance(source, str | bytes | os.PathLike):
        raise TypeError(
            f"LakeDataset reads a source, not a path or name ({source!r}): pass "
            f"DeltaSource({str(source)!r}) for a Delta table, or IcebergSource('namespace.table') "
            "for an Iceberg table (both from lakeckpt_tables)")
    if not callable(getattr(source, "snapshot", None)):
        raise TypeError(f"source must be a DeltaSource or IcebergSource (lakeckpt_tables), "
                        f"got {type(source).__name__}")


def _pinned(source: Source, version: int | None, row_filter: Any,
            schema_id: int | None = None) -> Snapshot:
    snapshot = source.snapshot(version, schema_id=schema_id)
    # the filter is part of what defines the rows: every pinned snapshot gets it
    return snapshot if row_filter is None else filtered(snapshot, row_filter)


def _same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values: ``True`` is not ``1`` (Python's ``==`` says it is)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _check_end_exists(source: Source, until_version: int) -> None:
    """An Iceberg snapshot id cannot be known before the snapshot exists (ids are random), so
    an ``until_version`` naming none would make a follower wait for ever: refuse it now."""
    from lakeckpt_tables.sources.iceberg import IcebergSource

    if isinstance(source, IcebergSource):
        source.snapshot(until_version)  # SourceNotFoundError naming the table and the id
