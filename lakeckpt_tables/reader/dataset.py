"""``LakeDataset``: a torch IterableDataset over a Delta or Iceberg table, resumable.

Iterate it under ``StatefulDataLoader(dataset, batch_size=None, num_workers=N)``: the
dataset makes the batches (a loader that batches them again is refused on its first batch);
a state the loader captures covers the batches it has *yielded*, not those prefetched.
``loader.load_state_dict(saved)`` resumes mid-pass at the same world size and workers;
``dataset.load_state_dict(saved)`` (a loader's state, a dataset's, or merged states) also at
another world size, worker count or batch size, and a finished pass as finished, for the
passes of workers started afterwards (iterate once per loaded state, or use
``persistent_workers=True``). The dataset holds one frozen
:class:`~lakeckpt_tables.reader.config.ReaderConfig`: a loaded state swaps in the one it
resolves to, once it is known to fit.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, Literal, NoReturn, TypeVar

from torch.utils.data import IterableDataset, get_worker_info

from lakeckpt_tables.errors import PackingError, StateMismatchError
from lakeckpt_tables.plan import DEFAULT_SHUFFLE_WINDOW, EpochPlan, Piece
from lakeckpt_tables.reader.config import ReaderConfig
from lakeckpt_tables.reader.convert import Batch, CutConverter
from lakeckpt_tables.reader.deletions import reading
from lakeckpt_tables.reader.distributed import rank_and_world
from lakeckpt_tables.reader.loaders import parse_state, refuse_finished_pass
from lakeckpt_tables.reader.loop import SliceReader, start_cursor
from lakeckpt_tables.reader.options import ReaderOptions
from lakeckpt_tables.reader.packing.planner import sequences
from lakeckpt_tables.reader.planner import Cursor, RoundPlanner
from lakeckpt_tables.reader.readahead import DEFAULT_DEPTH
from lakeckpt_tables.reader.rounds import (
    DEFAULT_UNIT_ROWS,
    FollowPolicy,
    Round,
    RoundSequence,
    RoundUnits,
)
from lakeckpt_tables.reader.state import PlanShape, ReaderState
from lakeckpt_tables.sources.base import Snapshot, Source

__all__ = ["LakeDataset", "cycling"]

T = TypeVar("T")


class _Fixed(Generic[T]):
    """A read-only attribute of the dataset's configuration: an option (``dataset.seed``), or
    a resolved value (``dataset.snapshot``). Fixed when the dataset is built."""

    def __init__(self, resolved: bool = False) -> None:
        self._resolved = resolved

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, dataset: Any, owner: type | None = None) -> T:
        if dataset is None:
            return self  # type: ignore[return-value]
        config = dataset._config
        return getattr(config if self._resolved else config.options, self._name)  # type: ignore[no-any-return]

    def __set__(self, dataset: Any, value: Any) -> NoReturn:
        raise AttributeError(f"LakeDataset.{self._name} is fixed when the dataset is built; "
                             "build another LakeDataset")


class LakeDataset(IterableDataset[Batch]):
    """Batches of a Delta or Iceberg table, resumable exactly from a position.

    What one iteration reads: ``epochs`` epochs of a pinned snapshot (the default); with
    ``follow=True`` the snapshot, then segment by segment the rows appended to the table
    (``reader/rounds.py``); with ``refresh="epoch"`` one epoch of the version set_epoch pinned.
    Each rank reads an equal contiguous share of each epoch's or segment's (permuted) rows and
    each DataLoader worker an equal share of its rank's; with several ranks every rank yields
    the same number of batches per epoch or segment (see ``lakeckpt_tables.plan``). Batches
    are dicts: numeric columns as tensors (zero-copy where Arrow allows), list columns as 2-D
    tensors or :class:`~lakeckpt_tables.reader.convert.Ragged`, strings as lists. Iterating
    and resuming: the module's docstring.

    Args:
        source: a :class:`~lakeckpt_tables.DeltaSource` or :class:`~lakeckpt_tables.IcebergSource`.
        columns, batch_size, shuffle, seed, version, epochs, rank, world_size, drop_last,
            shuffle_window, transform, follow, poll_interval, max_idle, until_version,
            on_change, min_segment_rows, refresh, output, nulls, decimals, filter, unit_rows,
            read_ahead, pack_tokens, seq_len, eos_id, tokenizer, token_cache, deletes,
            deletes_key, exclusions: the fields of
            :class:`~lakeckpt_tables.reader.options.ReaderOptions`, each documented there.

    Raises:
        TypeError, ValueError: an option or a source of the wrong kind, named.
        PackingError: packing options that cannot give fixed-length token sequences.
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
        on_change: Literal["fail", "skip", "stop"] = "fail",
        min_segment_rows: int | None = None,
        refresh: Literal["epoch"] | None = None,
        output: Literal["torch", "arrow"] = "torch",
        nulls: Literal["refuse", "fill", "mask"] = "refuse",
        decimals: Literal["refuse", "float64"] = "refuse",
        filter: Any = None, unit_rows: int = DEFAULT_UNIT_ROWS,
        read_ahead: int = DEFAULT_DEPTH,
        pack_tokens: str | None = None,
        seq_len: int | None = None, eos_id: int | None = None,
        tokenizer: Any = None, token_cache: str | None = None,  # a text column's (packing)
        deletes: Literal["pin", "honor"] = "pin", deletes_key: str | None = None,
        exclusions: Any = None,
    ) -> None:
        super().__init__()
        rank, world_size = rank_and_world(rank, world_size)
        # every option, and every combination, refused with its reason before any I/O
        options = ReaderOptions(
            min_segment_rows=min_segment_rows, shuffle_window=shuffle_window, batch_size=batch_size,
            poll_interval=poll_interval, until_version=until_version, pack_tokens=pack_tokens,
            token_cache=token_cache, deletes_key=deletes_key, world_size=world_size, epochs=epochs,
            read_ahead=read_ahead, exclusions=exclusions, drop_last=drop_last, transform=transform,
            on_change=on_change, unit_rows=unit_rows, tokenizer=tokenizer, max_idle=max_idle,
            decimals=decimals, columns=columns, shuffle=shuffle, version=version, refresh=refresh,
            seq_len=seq_len, deletes=deletes, follow=follow, output=output, filter=filter,
            eos_id=eos_id, nulls=nulls, seed=seed, rank=rank)
        self._use(ReaderConfig.resolve(source, options))
        self._epoch: int | None = None  # refresh="epoch": the epoch set_epoch pinned last
        self._resume: ReaderState | None = None
        self._resume_own = False  # the state was handed to this DataLoader worker by torchdata
        self._cursor: Cursor | None = None

    # the options (ReaderOptions) and the resolved values (ReaderConfig), read-only
    batch_size, epochs, seed, rank, world_size = (_Fixed[int]() for _ in range(5))
    shuffle_window, unit_rows, read_ahead = (_Fixed[int]() for _ in range(3))
    shuffle, drop_last = (_Fixed[bool]() for _ in range(2))
    output, nulls, decimals = (_Fixed[str]() for _ in range(3))
    transform, filter, refresh = (_Fixed[Any]() for _ in range(3))
    source, snapshot = _Fixed[Source](resolved=True), _Fixed[Snapshot](resolved=True)
    options = _Fixed[ReaderOptions](resolved=True)
    follow = _Fixed[FollowPolicy | None](resolved=True)

    def _use(self, config: ReaderConfig, rounds: RoundSequence | None = None) -> None:
        """Read as ``config`` says from now on (its ``rounds`` when already listed)."""
        old: ReaderConfig | None = getattr(self, "_config", None)
        self._config = config
        self._rounds = rounds if rounds is not None else config.rounds()
        if old is None or old.snapshot is not config.snapshot:
            self._reader = SliceReader(config.snapshot, config.columns,
                                       config.options.read_ahead)

    @property
    def columns(self) -> list[str]:
        return list(self._config.columns)

    @property
    def rounds(self) -> RoundSequence:
        """The rounds this reader passes through (epochs, or follow segments)."""
        return self._rounds

    @property
    def shuffler(self) -> str:
        """How windows are permuted (NOTE [ keyed permutation ] in ``plan/shuffle.py``)."""
        return self._config.shuffler

    @shuffler.setter
    def shuffler(self, value: str) -> None:  # a replay of a run that named an older one
        self._use(self._config.with_shuffler(value), self._rounds)

    @property
    def config(self) -> dict[str, Any]:
        """What defines the rows: a state loads only into a reader with the same."""
        return dict(self._config.identity)

    @property
    def policy(self) -> dict[str, Any]:
        """Options that may change on resume (``ReaderConfig.policy``)."""
        return self._config.policy

    @property
    def follows(self) -> bool:
        """Whether this reader follows its table (rounds are follow segments)."""
        return self._config.follow is not None

    @property
    def planner(self) -> RoundPlanner:
        """The plans of this reader's rounds, and what a reader state means against them."""
        return self._config.planner(self._rounds)

    # ----------------------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """This reader's position (torchdata ``Stateful``): JSON-clean, small, never pickled.

        In a DataLoader worker it holds that worker's slice only; merge the workers' states
        with :func:`~lakeckpt_tables.reader.state.merge_states` for a whole-reader state.
        """
        if self._cursor is None and get_worker_info() is not None:
            self._cursor = self._start_cursor()
        cursor = self._cursor
        if cursor is None:
            return (self._resume or self._config.empty_state()).to_dict()
        return self._config.state_at(cursor).to_dict()

    def load_state_dict(self, state_dict: dict[str, Any] | ReaderState) -> None:
        """Resume from a dataset state, merged states (``merge_states()``'s ``ReaderState``
        or its ``to_dict()``), or a ``StatefulDataLoader`` state.

        Raises:
            StateMismatchError: the state is of another table, version, run configuration or
                format version, or corrupt; the message says what differs. Nothing changes.
        """
        in_main = get_worker_info() is None
        try:
            state = parse_state(state_dict)
            config, rounds = self._config.to_load(state, self._rounds, may_repin=in_main)
        except (TypeError, ValueError, KeyError, IndexError, AttributeError,
                OverflowError) as exc:  # whatever shape a damaged state takes: named
            raise StateMismatchError(f"{self.snapshot.describe()}: reader state is corrupt: "
                                     f"{exc!r}") from exc
        self._use(config, rounds)
        self._resume = state if state.plan is not None else None
        self._resume_own, self._cursor = not in_main, None
        if self._resume_own and self._resume is not None:
            cursor = self._start_cursor()
            if self.planner.pass_finished(cursor):
                refuse_finished_pass(self.snapshot.describe(),
                                     cursor.slice_index % cursor.shape[1], self.rank)

    @property
    def resume_epoch(self) -> int:
        """The earliest round a loaded state stands in (0 without one): with
        ``refresh="epoch"``, the epoch to call :meth:`set_epoch` with first after a restore."""
        return 0 if self._resume is None else self._resume.earliest_round

    def set_epoch(self, epoch: int) -> None:
        """``refresh="epoch"``: pin the version epoch ``epoch`` reads (collective: NOTE
        [ re-pinned epochs ] in ``reader/rounds.py``).

        Raises:
            ValueError: the dataset was not built with ``refresh="epoch"``.
        """
        if self.refresh is None:
            raise ValueError("set_epoch pins a version per epoch; build the LakeDataset with "
                             "refresh='epoch' for that")
        known = self._resume.rounds.get(epoch) if self._resume is not None else None
        self._rounds.pin_epoch(epoch, known, rank=self.rank)
        self._epoch = epoch

    # ------------------------------------------------- plans (plan.accounting.Planner)

    def reshape(self, state: ReaderState, shape: PlanShape) -> ReaderState:
        """``state`` as a reader of ``shape`` starts from it (:meth:`RoundPlanner.reshape`)."""
        return self.planner.reshape(state, shape)

    def round_plan(self, index: int, shape: PlanShape, layouts: Mapping[int, tuple[Piece, ...]],
                   known: Mapping[int, Round]) -> tuple[EpochPlan, RoundUnits]:
        """Round ``index``'s plan for ``shape`` and its units (:meth:`RoundPlanner.round_plan`)."""
        return self.planner.round_plan(index, shape, layouts, known)

    def round_at(self, index: int, shape: PlanShape, layouts: Mapping[int, tuple[Piece, ...]],
                 known: Mapping[int, Round]) -> Round | None:
        """Round ``index`` as a reader of ``shape`` forms it (:meth:`RoundPlanner.round_at`)."""
        return self.planner.round_at(index, shape, layouts, known)

    # -------------------------------------------------------------------------- reading

    def _start_cursor(self) -> Cursor:
        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        return start_cursor(self.planner, self._resume,
                            (self.world_size, workers, self.batch_size), worker,
                            own=self._resume_own, epoch=self._epoch)

    def __iter__(self) -> Iterator[Batch]:
        if self._config.packing is not None:  # token sequences (reader/packing/planner.py)
            yield from sequences(self.planner, self._reader.cache.get,  # type: ignore[arg-type]
                                 self.transform, self._begin())
            return
        transform, converted = self.transform, CutConverter(self.output, self.nulls)
        for cut in self._tables(cuts=True):
            batch = converted(*cut)
            yield transform(batch) if transform is not None else batch

    def _begin(self) -> Cursor:
        """Start a pass: the cursor, and a later pass in this process starts afresh
        (persistent workers: in this worker)."""
        cursor = self._cursor = self._start_cursor()
        if get_worker_info() is None or self._resume_own:
            self._resume = None
        return cursor

    def _tables(self, read_ahead: int | None = None, *, cuts: bool = False) -> Iterator[Any]:
        """The batches as Arrow tables (``cuts``: as ``loop.Cut``), the cursor at each one's end
        (``reader/handoff.py`` converts them); ``read_ahead`` overrides the option."""
        if self._config.packing is not None:
            raise PackingError("a packing LakeDataset yields token sequences, not Arrow "
                               "tables: iterate it, or a StatefulDataLoader over it")
        cursor = self._begin()
        depth = self.read_ahead if read_ahead is None else read_ahead
        return reading(self, cursor, self._reader.cuts if cuts else self._reader.tables, depth)


def cycling(dataset: LakeDataset) -> LakeDataset:
    """A copy of ``dataset`` that never ends: after its last epoch it reads the next ones (each
    with its own permutation, accounted as that epoch). What a Mixture with
    ``on_exhausted="cycle"`` reads, so that a source's next pass is its next epochs (NOTE
    [ cycling sources ] in ``lakeckpt_tables/mixture/dataset.py``); its states name
    ``"cycle"`` and load only into a cycling reader.

    Raises:
        ValueError: a ``follow=True`` or ``refresh="epoch"`` dataset.
    """
    if dataset.options.deletes == "honor":
        raise ValueError(f"{dataset.snapshot.describe()}: deletes='honor' re-plans a pinned "
                         "pass at checkpoints; a cycling source cannot take it yet")
    other = copy.copy(dataset)
    other._use(dataset._config.cycling())
    return other
