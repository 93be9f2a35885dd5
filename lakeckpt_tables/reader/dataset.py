"""``LakeDataset``: a torch IterableDataset over a Delta or Iceberg table, resumable."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import torch
from torch.utils.data import IterableDataset, get_worker_info

from lakeckpt_tables.errors import (
    EmptySourceError,
    ProcessGroupError,
    ResumePathError,
    SourceNotFoundError,
    StateMismatchError,
    UnknownColumnError,
    UnsupportedTableError,
)
from lakeckpt_tables.io.prefetch import DEFAULT_PREFETCH, Prefetch
from lakeckpt_tables.plan import (
    DEFAULT_SHUFFLE_WINDOW,
    EpochPlan,
    Piece,
)
from lakeckpt_tables.plan.shuffle import BALANCED, LEGACY, SHUFFLERS
from lakeckpt_tables.reader._cache import RowGroupCache
from lakeckpt_tables.reader._torchdata import (
    is_loader_state,
    states_from_loader,
)
from lakeckpt_tables.reader.convert import check_convertible, convert
from lakeckpt_tables.reader.loop import batches
from lakeckpt_tables.reader.options import ReaderOptions
from lakeckpt_tables.reader.planner import RoundPlanner
from lakeckpt_tables.reader.readahead import DEFAULT_DEPTH
from lakeckpt_tables.reader.rounds import (
    DEFAULT_UNIT_ROWS,
    Round,
    RoundSequence,
    RoundUnits,
    Tails,
)
from lakeckpt_tables.reader.state import (
    STATE_FORMAT,
    PlanShape,
    ReaderState,
    merge_states,
)
from lakeckpt_tables.sources.base import RowGroupReader, Snapshot, Source
from lakeckpt_tables.sources.filters import filtered
from lakeckpt_tables.sources.nulls import check_nulls
from lakeckpt_tables.types import Unit

__all__ = ["LakeDataset"]

log = logging.getLogger(__name__)

Batch = dict[str, Any]


@dataclass
class _Cursor:
    """Where this process's slice stands: the live part of the reader state."""

    slice_index: int
    shape: PlanShape
    layouts: dict[int, tuple[Piece, ...]]
    epoch: int  # the round: an epoch, or a follow segment (lakeckpt_tables.reader.rounds)
    position: int
    rounds: dict[int, Round]


class LakeDataset(IterableDataset[Batch]):
    """Batches of a Delta or Iceberg table, resumable exactly from a position.

    What one iteration reads: ``epochs`` epochs of a pinned snapshot (the default); with
    ``follow=True`` the snapshot and then, segment by segment, the rows appended to the table
    (``lakeckpt_tables.reader.rounds``); with ``refresh="epoch"`` one epoch of the version
    :meth:`set_epoch` pinned. Each rank reads an equal contiguous share of each epoch's or
    segment's (permuted) rows and each DataLoader worker an equal share of its rank's; with
    more than one rank every rank yields the same number of batches per epoch or segment (see
    ``lakeckpt_tables.plan``). Batches are dicts: numeric columns as tensors (zero-copy where
    Arrow allows), fixed-length list columns as 2-D tensors, variable-length ones as
    :class:`~lakeckpt_tables.reader.convert.Ragged`, strings as lists.

    Use it with ``torchdata.stateful_dataloader.StatefulDataLoader(dataset, batch_size=None,
    num_workers=N)``: the dataset makes the batches. A state captured by the loader covers the
    batches it has *yielded*, not those prefetched.

    Resuming: ``loader.load_state_dict(saved)`` resumes mid-pass with the same world size and
    workers. ``dataset.load_state_dict(saved)`` (a loader state, a dataset state, or merged
    states of all ranks) additionally resumes at another world size, worker count or batch size,
    and resumes a finished pass as finished; it applies to the passes made by workers started
    afterwards, so iterate once per loaded state (or use ``persistent_workers=True``).

    Args:
        source: a :class:`~lakeckpt_tables.DeltaSource` or :class:`~lakeckpt_tables.IcebergSource`.
        columns: columns to read; all when None.
        batch_size: rows per batch.
        shuffle: permute units per epoch and rows within each shuffle window.
        seed: base seed of every permutation.
        version: table version (Delta) or snapshot id (Iceberg) to pin; the latest when None.
        epochs: epochs per iteration.
        rank: this process's rank; from torch.distributed when initialized, else 0.
        world_size: number of ranks; from torch.distributed when initialized, else 1.
        drop_last: deliver full batches only (per worker); the rest is reported undelivered.
        shuffle_window: plan units read and shuffled together (NOTE [ bounded units ] in
            ``reader/rounds.py``).
        transform: called on every batch dict in the worker, before it is yielded.
        follow: after the pinned snapshot, go on with the rows appended to the table, segment
            by segment, without epochs (see ``lakeckpt_tables.reader.rounds``).
        poll_interval: follow mode: seconds between looks at the table while waiting.
        max_idle: follow mode: end the pass after this many seconds without a new commit
            (one rank only); None waits until ``until_version`` or for ever.
        until_version: follow mode: the last version (Delta) or snapshot id (Iceberg) to read.
        on_change: follow mode: commits that delete or rewrite rows raise
            :class:`~lakeckpt_tables.errors.SourceChangedError` (``"fail"``) or are skipped.
        min_segment_rows: follow mode: appended rows a segment waits for; default
            ``world_size * batch_size``. Must be at least ranks x workers.
        refresh: ``"epoch"``: every epoch reads the table's latest version, pinned for it by
            :meth:`set_epoch` (call it before iterating each epoch); one pass is one epoch.
        output: ``"torch"`` (tensors, the default) or ``"arrow"`` (``pyarrow.RecordBatch``:
            every type, nulls kept; same state, resume and exactly-once).
        nulls: torch output: ``"refuse"`` at construction, ``"fill"`` or ``"mask"``
            (NOTE [ null policy ] in :mod:`lakeckpt_tables.sources.nulls`).
        filter: a ``pyarrow.compute`` expression over the table's columns: only the rows it
            keeps are read; decided at construction (NOTE [ row filters ] in
            :mod:`lakeckpt_tables.sources.filters`) and part of the run configuration.
        decimals: torch output: ``"refuse"`` decimal columns or give ``"float64"`` tensors.
        unit_rows: rows of a plan unit at most: row groups are planned as row ranges of this
            size, so shuffle mixes and work divides at any row-group size.
        read_ahead: windows decoded ahead on background threads while the loop trains
            (NOTE [ read-ahead ] in ``lakeckpt_tables.reader.readahead``); 0 reads in the
            iterating thread. Changes no row and no position: not part of the state.

    Raises:
        SourceNotFoundError, UnsupportedTableError, EmptySourceError, UnknownColumnError,
        PinnedFileMissingError, RowCountMismatchError, SourceChangedError: see
        :mod:`lakeckpt_tables.errors`.
    """

    def __init__(
        self,
        source: Source,
        *,
        columns: Sequence[str] | None = None,
        batch_size: int = 1024,
        shuffle: bool = True,
        seed: int = 0,
        version: int | None = None,
        epochs: int = 1,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        shuffle_window: int = DEFAULT_SHUFFLE_WINDOW,
        transform: Callable[[Batch], Any] | None = None,
        follow: bool = False,
        poll_interval: float = 1.0,
        max_idle: float | None = None,
        until_version: int | None = None,
        on_change: Literal["fail", "skip"] = "fail",
        min_segment_rows: int | None = None,
        refresh: Literal["epoch"] | None = None,
        output: Literal["torch", "arrow"] = "torch",
        nulls: Literal["refuse", "fill", "mask"] = "refuse",
        decimals: Literal["refuse", "float64"] = "refuse",
        filter: Any = None,
        unit_rows: int = DEFAULT_UNIT_ROWS,
        read_ahead: int = DEFAULT_DEPTH,
    ) -> None:
        super().__init__()
        rank, world_size = _rank_and_world(rank, world_size)
        # every option, and every combination, refused with its reason before any I/O
        options = ReaderOptions(
            columns=columns, batch_size=batch_size, shuffle=shuffle, seed=seed, version=version,
            epochs=epochs, rank=rank, world_size=world_size, drop_last=drop_last,
            shuffle_window=shuffle_window, transform=transform, follow=follow,
            poll_interval=poll_interval, max_idle=max_idle, until_version=until_version,
            on_change=on_change, min_segment_rows=min_segment_rows, refresh=refresh,
            output=output, nulls=nulls, decimals=decimals, filter=filter, unit_rows=unit_rows,
            read_ahead=read_ahead)
        self.options = options
        self.unit_rows, self.read_ahead = options.unit_rows, options.read_ahead
        self.source = source
        self._requested_version = version
        self._requested_min_segment_rows = min_segment_rows
        self.snapshot: Snapshot = source.snapshot(version)
        self.filter = filter
        if filter is not None:
            self.snapshot = filtered(self.snapshot, filter)
        if self.snapshot.rows == 0 and not follow:
            raise EmptySourceError(f"{self.snapshot.describe()} holds no rows; nothing to read")
        self.columns = _check_columns(self.snapshot, options.columns)
        self.output, self.nulls, self.decimals = output, nulls, decimals
        self._check_output()
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.epochs, self.drop_last, self.shuffle_window = epochs, drop_last, shuffle_window
        self.shuffler = BALANCED  # a loaded state may name another (NOTE [ keyed permutation ])
        self.transform = transform
        self.rank, self.world_size = rank, world_size
        self.follow = options.follow_policy()
        if self.follow is not None and until_version is not None:
            _check_end_exists(source, until_version)
        self.refresh = refresh
        self.rounds = RoundSequence(source, self.snapshot, self.columns, epochs=epochs,
                                    follow=self.follow, refresh=refresh is not None,
                                    unit_rows=unit_rows)
        self._epoch: int | None = None  # refresh="epoch": the epoch set_epoch pinned last
        self._resume: ReaderState | None = None
        self._resume_own = False  # the state was handed to this DataLoader worker by torchdata
        self._cursor: _Cursor | None = None
        self._row_reader = self.snapshot.row_reader()
        self._cache = RowGroupCache(self._read_row_group)
        self._prefetch = _prefetch(self._read_unit, self._row_reader, self.read_ahead)

    # ----------------------------------------------------------------------------- state

    @property
    def config(self) -> dict[str, Any]:
        """What defines the rows: a state loads only into a reader with the same."""
        config: dict[str, Any] = {
            "seed": self.seed, "shuffle": self.shuffle, "shuffle_window": self.shuffle_window,
            "drop_last": self.drop_last, "epochs": self.epochs, "columns": list(self.columns),
            "unit_rows": self.unit_rows}
        if self.shuffle and self.shuffler != LEGACY:  # states without one: LEGACY
            config["shuffler"] = self.shuffler
        if self.refresh is not None:
            config["refresh"] = self.refresh
        if self.filter is not None:
            config["filter"] = str(self.filter)
        if self.snapshot.schema_id is not None:  # NOTE [ schema read ] in sources/base.py
            config["schema_id"] = self.snapshot.schema_id
        if self.follow is not None:
            config["follow"] = {"min_segment_rows": self.follow.min_segment_rows}
        return config

    @property
    def follows(self) -> bool:
        """Whether this reader follows its table (rounds are follow segments)."""
        return self.follow is not None

    @property
    def policy(self) -> dict[str, Any]:
        """Options that do not define the rows: they may change on resume (recorded in the
        ledger as ``policy_change`` events)."""
        if self.follow is None:
            return {}
        return {"on_change": self.follow.on_change, "until_version": self.follow.until_version,
                "max_idle": self.follow.max_idle, "poll_interval": self.follow.poll_interval}

    @property
    def planner(self) -> RoundPlanner:
        """The plans of this reader's rounds, and what a reader state means against them."""
        return RoundPlanner(self.rounds, self.shuffle, self.seed, self.shuffle_window,
                            self.drop_last, self.epochs, follows=self.follow is not None,
                            refreshes=self.refresh is not None, rank=self.rank,
                            where=self.snapshot.describe(), shuffler=self.shuffler)

    def _empty_state(self, shape: PlanShape | None) -> ReaderState:
        slices = () if shape is None else (None,) * (shape[0] * shape[1])
        return ReaderState(self.snapshot.identity, self.snapshot.version, self.config,
                           shape, {}, slices, policy=self.policy)

    def state_dict(self) -> dict[str, Any]:
        """This reader's position (torchdata ``Stateful``): JSON-clean, small, never pickled.

        In a DataLoader worker it holds that worker's slice only; merge the workers' states
        with :func:`~lakeckpt_tables.reader.state.merge_states` for a whole-reader state.
        """
        if self._cursor is None and get_worker_info() is not None:
            self._cursor = self._start_cursor()
        cursor = self._cursor
        if cursor is None:
            return (self._resume or self._empty_state(None)).to_dict()
        state = ReaderState(self.snapshot.identity, self.snapshot.version, self.config,
                            cursor.shape, cursor.layouts,
                            (None,) * (cursor.shape[0] * cursor.shape[1]), cursor.rounds,
                            self.policy)
        return state.with_slice(cursor.slice_index, (cursor.epoch, cursor.position)).to_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from a dataset state, merged states, or a ``StatefulDataLoader`` state.

        Raises:
            StateMismatchError: the state is of another table, version, run configuration or
                format version, or corrupt; the message says what differs.
        """
        try:
            if is_loader_state(state_dict) and state_dict.get("format") != STATE_FORMAT:
                parsed = merge_states(states_from_loader(state_dict))
            else:
                parsed = ReaderState.from_dict(state_dict)
            self._check_compatible(parsed)
            self.planner.check(parsed)
        except (TypeError, ValueError, KeyError, IndexError, AttributeError,
                OverflowError) as exc:  # whatever shape a damaged state takes: named
            raise StateMismatchError(f"{self.snapshot.describe()}: reader state is corrupt: "
                                     f"{exc!r}") from exc
        self._resume = parsed if parsed.plan is not None else None
        self._resume_own = get_worker_info() is not None
        self._cursor = None
        if self._resume_own and self._resume is not None:
            self._refuse_a_finished_pass_restored_by_the_loader()

    def _refuse_a_finished_pass_restored_by_the_loader(self) -> None:
        """NOTE [ torchdata's end-of-pass trap ] (``reader/_torchdata.py``): this worker was
        handed its state by ``loader.load_state_dict``; if its slice has delivered its whole
        pass, torchdata may be about to start the pass again in fresh workers."""
        cursor = self._start_cursor()
        if not self.planner.pass_finished(cursor.slice_index, cursor.shape, cursor.layouts,
                                          cursor.epoch, cursor.position, cursor.rounds):
            return
        raise ResumePathError(
            f"{self.snapshot.describe()}: DataLoader worker {cursor.slice_index % cursor.shape[1]}"
            f" of rank {self.rank} was restored by StatefulDataLoader.load_state_dict at the end "
            "of its pass; torchdata (0.11) cannot tell a finished pass from one it restarts "
            "afresh in new workers, so the pass could be delivered twice. Resume through the "
            "dataset instead: dataset.load_state_dict(saved) before iterating the loader "
            "(CheckpointManager.restore does this)")

    def _check_compatible(self, state: ReaderState) -> None:
        ours = self._empty_state(None)
        diffs = []
        same_table = (state.table.format, state.table.table_id) == (ours.table.format,
                                                                     ours.table.table_id)
        if not same_table:
            diffs.append(f"table: state is of {state.table.describe()}, "
                         f"this reader reads {ours.table.describe()}")
        schema_id = state.config.get("schema_id")
        if same_table and (state.version, schema_id) != (ours.version, self.snapshot.schema_id) \
                and self._adopts_versions():
            try:
                self._repin(state.version, schema_id)
            except SourceNotFoundError as exc:
                raise StateMismatchError(f"reader state pinned version {state.version}, which "
                                         f"the table does not list: {exc}") from exc
            ours = self._empty_state(None)
        if self._adopt_min_segment_rows(state):
            ours = self._empty_state(None)
        before = self.shuffler
        theirs = state.config.get("shuffler", LEGACY)
        if self.shuffle and state.config.get("shuffle") is True and theirs in SHUFFLERS:
            self.shuffler = theirs  # the state's rows were ordered with it
            ours = self._empty_state(None)
        if state.version != ours.version:
            how = (f"pass version={state.version}" if self._requested_version is not None
                   else "resume through dataset.load_state_dict(saved) in the main process, "
                   f"which pins it, or pass version={state.version}")
            diffs.append(f"version: state pinned {state.version}, this reader pinned "
                         f"{ours.version} ({how})")
        for key in sorted(set(state.config) | set(ours.config)):
            if not _same_json(state.config.get(key), ours.config.get(key)):
                diffs.append(f"{key}: state has {state.config.get(key)!r}, this reader "
                             f"{ours.config.get(key)!r}")
        if diffs:
            self.shuffler = before
            raise StateMismatchError("reader state does not match this LakeDataset: "
                                     + "; ".join(diffs))

    def _adopts_versions(self) -> bool:
        """A reader built without ``version=`` pins the version its loaded state pinned: the
        state decides (in the main process only: resolving a snapshot there is fork-safe)."""
        return self._requested_version is None and get_worker_info() is None

    def _adopt_min_segment_rows(self, state: ReaderState) -> bool:
        """A follower left to the default ``min_segment_rows`` (ranks x batch size) resumes
        with the state's: segments are a function of it, and an elastic resume at another
        world or batch size must go on forming the same ones."""
        follow = state.config.get("follow")
        theirs = follow.get("min_segment_rows") if isinstance(follow, dict) else None
        if (self.follow is None or self._requested_min_segment_rows is not None
                or not isinstance(theirs, int) or theirs == self.follow.min_segment_rows):
            return False
        self.follow = dataclasses.replace(self.follow, min_segment_rows=theirs)
        # rounds formed under the old value are dropped (no snapshot is resolved: fork-safe)
        self.rounds = RoundSequence(self.source, self.snapshot, self.columns,
                                    epochs=self.epochs, follow=self.follow,
                                    refresh=self.refresh is not None,
                                    unit_rows=self.unit_rows)
        return True

    def _check_output(self) -> None:
        """Output, decimal and null policies decided up front (sources.nulls, reader.convert)."""
        check_convertible(self.snapshot.describe(), self.snapshot.schema, self.columns,
                          output=self.output, nulls=self.nulls, decimals=self.decimals)
        check_nulls(self.snapshot, self.columns, self.nulls if self.output == "torch" else "fill")

    def _repin(self, version: int, schema_id: int | None = None) -> None:
        snapshot = self.source.snapshot(version, schema_id=schema_id)
        # the filter is part of what defines the rows: the re-pinned snapshot gets it too
        self.snapshot = snapshot if self.filter is None else filtered(snapshot, self.filter)
        self._row_reader = self.snapshot.row_reader()
        self._cache = RowGroupCache(self._read_row_group)
        self._prefetch = _prefetch(self._read_unit, self._row_reader, self.read_ahead)
        self.columns = _check_columns(self.snapshot, self.columns)
        self._check_output()
        self.rounds = RoundSequence(self.source, self.snapshot, self.columns,
                                    epochs=self.epochs, follow=self.follow,
                                    refresh=self.refresh is not None,
                                    unit_rows=self.unit_rows)

    # ------------------------------------------------------------------- re-pinned epochs

    @property
    def resume_epoch(self) -> int:
        """The earliest round a loaded state stands in (0 without one): with
        ``refresh="epoch"``, the epoch to call :meth:`set_epoch` with first after a restore."""
        if self._resume is None:
            return 0
        return min((s[0] for s in self._resume.slices if s is not None), default=0)

    def set_epoch(self, epoch: int) -> None:
        """``refresh="epoch"``: pin the version epoch ``epoch`` reads (collective).

        NOTE [ re-pinned epochs ]
        Ranks and workers must read one version per epoch, but "the latest version" depends
        on when one looks. So the main process decides: rank 0 resolves the latest version
        and broadcasts it over torch.distributed; every rank pins that snapshot, and the
        DataLoader workers started for the epoch inherit it. An epoch named by a loaded
        reader state keeps the version it had.

        Raises:
            ValueError: the dataset was not built with ``refresh="epoch"``.
        """
        if self.refresh is None:
            raise ValueError("set_epoch pins a version per epoch; build the LakeDataset with "
                             "refresh='epoch' for that")
        resumed = self._resume.rounds.get(epoch) if self._resume is not None else None
        if resumed is not None:
            version = resumed.to
        else:
            latest = self.source.snapshot(None).version if self.rank == 0 else None
            version = _broadcast_from_rank0(latest)
        snapshot = self.source.snapshot(version)
        _check_columns(snapshot, self.columns)
        self.rounds.pin(epoch, snapshot)
        self._epoch = epoch

    # ------------------------------------------------------------------------- planning

    def _start_cursor(self) -> _Cursor:
        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        shape = (self.world_size, workers, self.batch_size)
        g = self.rank * workers + worker
        if self.follow is not None and self.follow.min_segment_rows < self.world_size * workers:
            raise ValueError(
                f"min_segment_rows={self.follow.min_segment_rows} is below ranks x workers = "
                f"{self.world_size * workers}: a segment could not give every worker a row. "
                "Raise min_segment_rows.")
        resume = self._resume
        start = 0
        if self.refresh is not None:
            if self._epoch is None:
                raise ValueError("refresh='epoch': call dataset.set_epoch(epoch) in the main "
                                 "process before iterating each epoch")
            start = self._epoch
            if resume is not None and all(s is None or s[0] < start for s in resume.slices):
                resume = None  # the loaded state's epochs are over; this one starts afresh
        if resume is None or resume.plan is None:
            return _Cursor(g, shape, {}, start, 0, {})
        planner = self.planner
        if resume.plan == shape:
            g = planner.resumed_slice(resume, shape, worker, own=self._resume_own)
            epoch, position = resume.slices[g] or (0, 0)
            return _Cursor(g, shape, dict(resume.layouts), epoch, position,
                           planner.own_round(resume.rounds, epoch))
        reshaped = planner.reshape(resume, shape)
        first = min(index for index, _ in reshaped.positions())  # every slice starts there
        return _Cursor(g, shape, dict(reshaped.layouts), first, 0,
                       planner.own_round(reshaped.rounds, first))

    def reshape(self, state: ReaderState, shape: PlanShape) -> ReaderState:
        """``state`` as a reader of ``shape`` starts from it (:meth:`RoundPlanner.reshape`)."""
        return self.planner.reshape(state, shape)

    def round_plan(self, index: int, shape: PlanShape,
                   layouts: Mapping[int, tuple[Piece, ...]],
                   known: Mapping[int, Round]) -> tuple[EpochPlan, RoundUnits]:
        """Round ``index``'s plan for ``shape`` and its units (:meth:`RoundPlanner.round_plan`)."""
        return self.planner.round_plan(index, shape, layouts, known)

    def round_at(self, index: int, shape: PlanShape, layouts: Mapping[int, tuple[Piece, ...]],
                 known: Mapping[int, Round]) -> Round | None:
        """Round ``index`` as a reader of ``shape`` forms it (:meth:`RoundPlanner.round_at`)."""
        return self.planner.round_at(index, shape, layouts, known)

    # -------------------------------------------------------------------------- reading

    def __iter__(self) -> Iterator[Batch]:
        for table in self._tables():
            batch = convert(table, self.output, self.nulls)
            yield self.transform(batch) if self.transform is not None else batch

    def _tables(self) -> Iterator[pa.Table]:
        """The batches as Arrow tables, the cursor at each one's end (the worker hand-off,
        ``reader/handoff.py``, converts them in the main process)."""
        cursor = self._start_cursor()
        self._cursor = cursor
        if get_worker_info() is None or self._resume_own:
            # a later pass in this process starts afresh (persistent workers: in this worker)
            self._resume = None
        planner = self.planner
        policy = planner.policy(cursor.shape)
        tails = Tails(policy, cursor.layouts)
        index = cursor.epoch
        plan: EpochPlan | None = None
        while (rnd := self.rounds.get(index, cursor.rounds, wait=True, tails=tails)) is not None:
            plan = planner.plan(policy, rnd, cursor.layouts.get(index))
            units = self.rounds.units(rnd)
            if self.follow is None:
                self._warn_tail(plan, cursor)
            start = cursor.position if index == cursor.epoch else 0
            own = planner.own_round({index: rnd}, index)
            if index != cursor.epoch and plan.batch_count(cursor.slice_index) == 0:
                # a round this slice has nothing of (all of it a tail, carried or not) is
                # passed, and the state says so: the ledger then names its tail
                cursor.epoch, cursor.position, cursor.rounds = index, 0, own
            for table, position in batches(plan, units, cursor.slice_index, start,
                                           row_group=self._cache.get,
                                           expect=self._prefetch.expect,
                                           read_ahead=self.read_ahead,
                                           unit_rows=self.unit_rows):
                cursor.epoch, cursor.position, cursor.rounds = index, position, own
                yield table
            index += 1
        if self.follow is not None and plan is not None:
            self._warn_tail(plan, cursor)

    def _warn_tail(self, plan: EpochPlan, cursor: _Cursor) -> None:
        """An epoch's tail, or the tail of the follow segment a pass ends with, is not
        delivered (a follow segment's tail is carried into the next one, if any)."""
        tail = sum(p.size for p in plan.tail())
        if tail and cursor.slice_index == 0:
            log.warning("%s segment %d epoch %d: %d row(s) cannot be split in lockstep over "
                        "%d slices with batch size %d; they are not delivered%s "
                        "(CheckpointManager records them in the ledger as an 'undelivered' "
                        "event)", self.snapshot.describe(), plan.segment, plan.epoch, tail,
                        plan.policy.slices, plan.policy.batch_size,
                        "" if self.follow is None else " as the pass ends here; following "
                        "on past this version (a later until_version) delivers them first")

    def _read_row_group(self, unit: Unit) -> pa.Table:
        return self._prefetch.get(unit)

    def _read_unit(self, unit: Unit) -> pa.Table:
        return self._row_reader.read(unit, self.columns)


def _prefetch(read: Callable[[Unit], pa.Table], reader: RowGroupReader,
              read_ahead: int) -> Prefetch[Unit, pa.Table]:
    """Row group reads issued ahead on object stores (none with ``read_ahead=0``)."""
    remote = reader.storage is not None and not reader.storage.is_local
    return Prefetch(read, depth=DEFAULT_PREFETCH if remote and read_ahead else 0,
                    key=_unit_key)


def _unit_key(unit: Unit) -> tuple[str, int]:
    return unit.path, unit.row_group


def _same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values: ``True`` is not ``1`` (Python's ``==`` says it is)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _check_columns(snapshot: Snapshot, columns: Sequence[str] | None) -> list[str]:
    names = list(snapshot.schema.names)
    if columns is None:
        wanted = names
    else:
        if isinstance(columns, str):
            raise TypeError("columns must be a list of names, not a string")
        wanted = list(columns)
        unknown = [c for c in wanted if c not in names]
        if unknown:
            raise UnknownColumnError(
                f"{snapshot.describe()} has no column(s) {unknown}; its columns are {names}")
    for path, present in snapshot.file_columns.items():
        lacking = [c for c in wanted if c not in present]
        if lacking:
            raise UnsupportedTableError(
                f"{snapshot.describe()}: data file {path} lacks column(s) {lacking} (added or "
                "renamed after the file was written); select other columns or rewrite the file")
    return wanted


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    dist = torch.distributed
    initialized = dist.is_available() and dist.is_initialized()
    launched = os.environ.get("WORLD_SIZE", "1").strip()
    if not initialized and world_size is None and launched.isdigit() and int(launched) > 1:
        # torchrun set the environment but nobody joined the ranks: every rank would believe
        # it is alone and read the whole table (duplicates until the ledger refuses a commit)
        raise ProcessGroupError(
            f"WORLD_SIZE={launched} (RANK={os.environ.get('RANK', '?')}) is set, as torchrun "
            "does, but torch.distributed has no process group. Call "
            "torch.distributed.init_process_group() (backend 'gloo' on CPU, 'nccl' on GPU) "
            "before building the LakeDataset, or pass rank= and world_size= explicitly")
    if world_size is None:
        world_size = dist.get_world_size() if initialized else 1
    if rank is None:
        rank = dist.get_rank() if initialized else 0
    return rank, world_size


def _check_end_exists(source: Source, until_version: int) -> None:
    """An Iceberg snapshot id cannot be known before the snapshot exists (ids are random), so
    an ``until_version`` naming none would make a follower wait for ever: refuse it now."""
    from lakeckpt_tables.sources.iceberg import IcebergSource

    if isinstance(source, IcebergSource):
        source.snapshot(until_version)  # SourceNotFoundError naming the table and the id


def _broadcast_from_rank0(value: Any) -> Any:
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
