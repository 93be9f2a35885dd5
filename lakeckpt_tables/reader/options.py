"""``ReaderOptions``: every option of a ``LakeDataset``, validated once, frozen, without I/O.

Every option, and every bad combination, is refused here with the name the user wrote
(``LakeDataset(batch_size=0)`` says ``batch_size``, never an internal class) and the reason,
before any table is touched; the dataset then only reads what this value says. Related options
form small frozen values of their own: :meth:`ReaderOptions.follow_policy` (follow mode).
``lakeckpt_tables.reader.config`` resolves the options against the table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any, Literal

import pyarrow.compute as pc

from lakeckpt_tables.plan import DEFAULT_SHUFFLE_WINDOW
from lakeckpt_tables.reader.readahead import DEFAULT_DEPTH
from lakeckpt_tables.reader.rounds import DEFAULT_UNIT_ROWS, FollowPolicy
from lakeckpt_tables.sources.changes import ExclusionList

__all__ = ["Packing", "ReaderOptions"]

OUTPUTS = ("torch", "arrow")
NULL_POLICIES = ("refuse", "fill", "mask")
DECIMAL_POLICIES = ("refuse", "float64")
ON_CHANGE = ("fail", "skip", "stop")


@dataclass(frozen=True)
class Packing:
    """How a packing reader packs (NOTE [ packing ] in ``reader/packing/stream.py``)."""

    column: str
    seq_len: int
    eos_id: int
    text: Any = field(default=None, compare=False)
    """A text column's tokenizer (``packing/tokenize.py``: ``TextTokens``); None: a token
    column."""
    cache: str | None = field(default=None, compare=False)
    """Where a text column's token counts are kept (NOTE [ text tokenized on the fly ])."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"column": self.column, "seq_len": self.seq_len,
                               "eos_id": self.eos_id}
        if self.text is not None:  # a state resumes only with the same tokenizer
            out["tokenizer"] = self.text.identity
        return out


@dataclass(frozen=True, kw_only=True)
class ReaderOptions:
    """The options of a :class:`~lakeckpt_tables.reader.dataset.LakeDataset`, each documented
    here (its keywords), with the rank and world size resolved.

    Raises:
        ValueError: an option out of range or not a number where one is needed, or a
            combination that cannot work; the message names it and says why.
        TypeError: ``columns``, ``transform`` or ``filter`` of the wrong kind, or a flag
            that is not a bool.
    """

    columns: Sequence[str] | None = None
    """Columns to read; all when None."""
    batch_size: int = 1024
    """Rows per batch."""
    shuffle: bool = True
    """Permute units per epoch and rows within each shuffle window."""
    seed: int = 0
    """Base seed of every permutation."""
    version: int | None = None
    """Table version (Delta) or snapshot id (Iceberg) to pin; the latest when None (a loaded
    reader state then pins its own)."""
    epochs: int = 1
    """Epochs per iteration."""
    rank: int = 0
    """This process's rank (``LakeDataset``: from torch.distributed when initialized, else 0)."""
    world_size: int = 1
    """Number of ranks (``LakeDataset``: from torch.distributed when initialized, else 1)."""
    drop_last: bool = False
    """Deliver full batches only (per worker); the rest is reported undelivered."""
    shuffle_window: int = DEFAULT_SHUFFLE_WINDOW
    """Plan units read and shuffled together (NOTE [ bounded units ] in ``reader/rounds.py``)."""
    transform: Callable[[Any], Any] | None = None
    """Called on every batch dict in the worker, before it is yielded."""
    follow: bool = False
    """After the pinned snapshot, go on with the rows appended to the table, segment by
    segment, without epochs (``lakeckpt_tables.reader.rounds``)."""
    poll_interval: float = 1.0
    """Follow mode: seconds between looks at the table while waiting."""
    max_idle: float | None = None
    """Follow mode: end the pass after this many seconds without a new commit (one rank
    only); None waits until ``until_version`` or for ever."""
    until_version: int | None = None
    """Follow mode: the last version (Delta) or snapshot id (Iceberg) to read."""
    on_change: Literal["fail", "skip", "stop"] = "fail"
    """Follow mode: commits that delete or rewrite rows raise
    :class:`~lakeckpt_tables.errors.SourceChangedError` (``"fail"``), are skipped (``"skip"``),
    or end the pass cleanly at the last row before them (``"stop"``: the loop ends, a final
    save records everything read; resume with ``"skip"`` to go on past them)."""
    min_segment_rows: int | None = None
    """Follow mode: appended rows a segment waits for; default ``world_size * batch_size``.
    At least ranks x workers."""
    refresh: Literal["epoch"] | None = None
    """``"epoch"``: every epoch reads the table's latest version, pinned for it by
    ``LakeDataset.set_epoch`` (call it before iterating each epoch); one pass is one epoch."""
    output: Literal["torch", "arrow"] = "torch"
    """``"torch"`` (tensors) or ``"arrow"`` (``pyarrow.RecordBatch``: every type, nulls kept;
    same state, resume and exactly-once)."""
    nulls: Literal["refuse", "fill", "mask"] = "refuse"
    """Torch output: ``"refuse"`` at construction, ``"fill"`` or ``"mask"`` (NOTE [ null
    policy ] in :mod:`lakeckpt_tables.sources.nulls`)."""
    decimals: Literal["refuse", "float64"] = "refuse"
    """Torch output: ``"refuse"`` decimal columns or give ``"float64"`` tensors."""
    filter: Any = None
    """A ``pyarrow.compute`` expression over the table's columns: only the rows it keeps are
    read; decided at construction (NOTE [ row filters ] in
    :mod:`lakeckpt_tables.sources.filters`) and part of the run configuration."""
    unit_rows: int = DEFAULT_UNIT_ROWS
    """Rows of a plan unit at most: row groups are planned as row ranges of this size, so
    shuffle mixes and work divides at any row-group size."""
    pack_tokens: str | None = None
    """Pack this token column (a list of integers per row, one document per row) into
    sequences of ``seq_len`` tokens (``reader/packing/planner.py``); ``batch_size`` then counts
    sequences."""
    seq_len: int | None = None
    """Packing: tokens per sequence (>= 2)."""
    eos_id: int | None = None
    """Packing: the token appended after every document."""
    tokenizer: Any = None
    """Packing a string column: the ``tokenizers.Tokenizer`` that tokenizes its documents as
    they are read (NOTE [ text tokenized on the fly ] in ``reader/packing/tokenize.py``)."""
    token_cache: str | None = None
    """Packing a string column: the directory keeping its token counts per snapshot and
    tokenizer (default ``$LAKECKPT_HOME/token-counts``)."""
    deletes: Literal["pin", "honor"] = "pin"
    """Rows the table deletes after the pin: ``"pin"`` reads the pinned version as it was;
    ``"honor"`` takes rows deleted since out of what is not delivered yet, at each
    checkpoint of a ``CheckpointManager`` (NOTE [ deletions honored ] in
    ``reader/deletions.py``). A pinned pass of a reader iterated in the training process
    only (``num_workers=0``)."""
    deletes_key: str | None = None
    """``deletes="honor"``: a column unique per row, naming rows a copy-on-write commit
    rewrote into other files; without it such a rewrite of a pinned file is refused."""
    exclusions: Any = None
    """``deletes="honor"``: an :class:`~lakeckpt_tables.sources.changes.ExclusionList`, a table
    of keys whose rows are not delivered: read when the pass starts and again at each
    checkpoint (NOTE [ exclusion lists ] in ``reader/deletions.py``)."""
    read_ahead: int = DEFAULT_DEPTH
    """Windows decoded ahead on background threads while the loop trains (NOTE [ read-ahead ]
    in ``reader/readahead.py``); 0 reads in the iterating thread. Changes no row and no
    position: not part of the state."""

    def __post_init__(self) -> None:
        self._check_each()
        self._check_packing()
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world_size {self.world_size}")
        if self.filter is not None and (self.follow or self.refresh is not None):
            raise ValueError("filter= is decided when the snapshot is pinned; follow=True "
                             "and refresh='epoch' pin versions later and take no filter")
        if self.refresh is not None and (self.follow or self.epochs != 1):
            raise ValueError("refresh='epoch' reads one epoch per pass (call set_epoch(e) "
                             "before each); it takes neither follow=True nor epochs")
        if self.deletes == "honor":
            other = [name for name, on in (
                ("follow=True", self.follow), ("refresh='epoch'", self.refresh is not None),
                ("pack_tokens", self.pack_tokens is not None),
                ("filter", self.filter is not None)) if on]
            if other:
                raise ValueError(f"deletes='honor' re-plans a pinned pass of rows; it does not "
                                 f"combine with {', '.join(other)} yet")
        elif self.deletes_key is not None or self.exclusions is not None:
            raise ValueError("deletes_key and exclusions are for deletes='honor'; pass that too")
        if self.follow:
            if self.epochs != 1:
                raise ValueError("follow mode has no epochs: leave epochs=1")
            if self.max_idle is not None and self.world_size > 1:
                raise ValueError(
                    "max_idle ends a pass when no commit came for a while, which each rank "
                    "would notice at a different step; with several ranks use until_version, "
                    "or stop all ranks together from the training loop")

    def _check_each(self) -> None:
        """Every option on its own, by its public name."""
        columns = self.columns
        if isinstance(columns, str) or not (columns is None or (
                isinstance(columns, Sequence) and all(isinstance(c, str) for c in columns))):
            what = "a string" if isinstance(columns, str) else type(columns).__name__
            raise TypeError(f"columns must be a list of names (or None for all columns), not "
                            f"{what}: {columns!r}")
        if self.columns is not None:
            object.__setattr__(self, "columns", tuple(self.columns))  # frozen: a copy of it
        for name in ("batch_size", "epochs", "shuffle_window", "unit_rows"):
            _whole(name, getattr(self, name), least=1)
        _whole("read_ahead", self.read_ahead, least=0)
        _whole("min_segment_rows", self.min_segment_rows, least=1, optional=True)
        for name in ("seed", "rank", "world_size"):  # rank and world size: in range below
            _whole(name, getattr(self, name))
        for name in ("version", "until_version"):
            _whole(name, getattr(self, name), optional=True)
        for name in ("shuffle", "drop_last", "follow"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        _seconds("poll_interval", self.poll_interval, zero=False)
        if self.max_idle is not None:
            _seconds("max_idle", self.max_idle, zero=True)
        for name, allowed in (("output", OUTPUTS), ("nulls", NULL_POLICIES),
                              ("decimals", DECIMAL_POLICIES), ("refresh", (None, "epoch")),
                              ("on_change", ON_CHANGE), ("deletes", ("pin", "honor"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.exclusions is not None and not isinstance(self.exclusions, ExclusionList):
            raise TypeError("exclusions must be an ExclusionList(source, column), got "
                            f"{self.exclusions!r}")
        if self.deletes_key is not None and not isinstance(self.deletes_key, str):
            raise TypeError(f"deletes_key must be a column name, got {self.deletes_key!r}")
        if self.transform is not None and not callable(self.transform):
            raise TypeError(f"transform must be a function of a batch, got {self.transform!r}")
        if self.filter is not None and not isinstance(self.filter, pc.Expression):
            raise TypeError("filter must be a pyarrow.compute expression, e.g. "
                            f"pc.field('x') > 1, got {self.filter!r}")

    def _check_packing(self) -> None:
        from lakeckpt_tables.errors import PackingError
        from lakeckpt_tables.reader.packing.stream import check_packing

        if self.pack_tokens is None:
            if self.seq_len is not None or self.eos_id is not None \
                    or self.tokenizer is not None or self.token_cache is not None:
                raise PackingError("seq_len, eos_id, tokenizer and token_cache are packing "
                                   "options: pass pack_tokens=COLUMN (the token or text "
                                   "column) with them")
            return
        if self.tokenizer is not None:
            from lakeckpt_tables.reader.packing.tokenize import TextTokens

            object.__setattr__(self, "_text", TextTokens(self.tokenizer))  # hashed once
        if not isinstance(self.pack_tokens, str):
            raise PackingError(f"pack_tokens={self.pack_tokens!r}: name the token column")
        if self.seq_len is None or self.eos_id is None:
            raise PackingError("pack_tokens needs seq_len= (tokens per sequence) and eos_id= "
                               "(the end-of-document token)")
        check_packing(self.seq_len, self.eos_id)
        unsupported = [name for name, bad in (
            ("follow", self.follow), ("refresh", self.refresh is not None),
            ("output", self.output != "torch"),
            ("columns", self.columns is not None and list(self.columns) != [self.pack_tokens]))
            if bad]
        if unsupported:
            raise PackingError(f"pack_tokens={self.pack_tokens!r} reads a pinned snapshot's "
                               f"token column into torch sequences; drop {unsupported} (not "
                               "supported with packing)")

    def packing(self) -> Packing | None:
        """What packing does; None without ``pack_tokens``."""
        if self.pack_tokens is None:
            return None
        assert self.seq_len is not None and self.eos_id is not None
        text = getattr(self, "_text", None)
        if text is None:
            return Packing(self.pack_tokens, self.seq_len, self.eos_id)
        from lakeckpt_tables.reader.packing.tokenize import default_cache

        return Packing(self.pack_tokens, self.seq_len, self.eos_id, text,
                       self.token_cache or default_cache())

    def deletes_policy(self) -> dict[str, Any]:
        """What the reader state's ``policy`` records of ``deletes`` (nothing for ``"pin"``)."""
        if self.deletes == "pin":
            return {}
        listed = None if self.exclusions is None else self.exclusions.describe()
        return {"deletes": self.deletes, "deletes_key": self.deletes_key, "exclusions": listed}

    def follow_policy(self) -> FollowPolicy | None:
        """How the reader follows its table; None without ``follow=True``."""
        if not self.follow:
            return None
        rows = self.min_segment_rows
        return FollowPolicy(
            min_segment_rows=self.world_size * self.batch_size if rows is None else rows,
            poll_interval=self.poll_interval, max_idle=self.max_idle,
            until_version=self.until_version, on_change=self.on_change)


def _whole(name: str, value: Any, *, least: int | None = None, optional: bool = False) -> None:
    """``value`` is an int (not a bool) of at least ``least``; or None when ``optional``."""
    if optional and value is None:
        return
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if not is_int or (least is not None and value < least):
        kind = {None: "an", 0: "a non-negative", 1: "a positive"}[least]
        raise ValueError(f"{name} must be {kind} int{' or None' if optional else ''}, "
                         f"got {value!r}")


def _seconds(name: str, value: Any, *, zero: bool) -> None:
    if not isinstance(value, Real) or isinstance(value, bool):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not zero):
        raise ValueError(f"{name} must be {'>= 0' if zero else '> 0'} seconds, got {value!r}")
