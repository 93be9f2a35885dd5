"""The reader state schema, defined once: what a position is, and how it is checked and encoded.

A reader state is JSON-clean and never pickled. Its size grows with ranks x workers (one
``[epoch, rows delivered]`` pair per slice), never with the data.

Schema (``format`` = :data:`STATE_FORMAT`)::

    {
      "format":  "lakeckpt.reader/2",
      "table":   {"format": "delta", "location": "...", "table_id": "..."},
      "version": 12,                      # pinned table version / snapshot id
      "config":  {"seed": 0, "shuffle": true, "shuffle_window": 4, "drop_last": false,
                  "epochs": 1, "columns": ["id", "x"]},   # what defines the rows: identity
      "policy":  {"on_change": "fail", "until_version": null, ...},  # may change on resume
      "plan":    {"world_size": 2, "workers": 2, "batch_size": 64} | null,
      "layouts": {"<epoch>": {"pieces": 4096, "shufflers": ["balanced"], "columns": "..."}},
      "rounds":  {"<round>": [index, segment, epoch, base, to, skipped]},  # follow mode only
      "slices":  [[epoch, rows delivered] | null, ...]   # one per (rank, worker)
      "eos_inside": [count | null, ...]   # packed readers only: one per slice (below)
      "deletes_seen": 14                  # deletes="honor" only: last commit observed
    }

``config`` is what defines the rows (table options, seed, epochs, shuffle...): a state loads
only into a reader with the same. ``policy`` holds the options that do not define rows (follow
mode's ``on_change``, ``until_version``, ``max_idle``, ``poll_interval``): they may change on
resume, and the change is recorded in the ledger as a ``policy_change`` event. Format 1 (with a
``segment`` field that was always 0) is refused by name.

``eos_inside`` (a packing reader's, optional: a state without it counts 0) is, per slice, how
many times the ``eos_id`` occurred inside the documents whose tokens that slice delivered,
cumulative over the run (NOTE [ eos counted in the ledger ] in ``checkpoint/eos_count.py``):
a slice's count moves with its position, so it is exact across resumes; an elastic re-plan
carries the old slices' sum onto slice 0.

``layouts`` holds only rounds re-planned by an elastic resume, as integer columns
(NOTE [ compact layouts ] in ``lakeckpt_tables.plan.layout_codec``); a layout written as a
list of pieces (``[[[a, b], ...], seed, lo, hi(, shuffler)]``, states written before) loads
too, so the format stays ``lakeckpt.reader/2``.

A state captured in one DataLoader worker knows only its own slice (others are null); states
are merged with :func:`merge_states`. ``plan`` may differ on load (another world size, worker
count or batch size) only when the state is complete: then the rows not yet delivered are
re-planned.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from lakeckpt_tables.errors import StateMismatchError
from lakeckpt_tables.plan import Piece, decode_layout, encode_layout
from lakeckpt_tables.plan.rounds import Round
from lakeckpt_tables.types import TableIdentity

__all__ = [
    "STATE_FORMAT",
    "ReaderState",
    "decode_state",
    "encode_state",
    "merge_states",
]

STATE_FORMAT = "lakeckpt.reader/2"
_OLD_FORMATS = ("lakeckpt.reader/1",)
_ENCODED_PREFIX = "lkr1:"

KEY_FORMAT = "format"
KEY_TABLE = "table"
KEY_VERSION = "version"
KEY_CONFIG = "config"
KEY_PLAN = "plan"
KEY_LAYOUTS = "layouts"
KEY_ROUNDS = "rounds"  # optional: descriptors of the follow segments slices stand in
KEY_POLICY = "policy"  # optional: options that may change on resume
KEY_SLICES = "slices"
KEY_EOS_INSIDE = "eos_inside"  # optional: a packing reader's per-slice eos counts
KEY_DELETES_SEEN = "deletes_seen"  # optional: deletes="honor", the last commit observed
KEY_EXCLUSIONS_SEEN = "exclusions_seen"  # optional: the exclusion list's version applied
_KEYS = (KEY_FORMAT, KEY_TABLE, KEY_VERSION, KEY_CONFIG, KEY_PLAN, KEY_LAYOUTS, KEY_SLICES)

PlanShape = tuple[int, int, int]  # (world_size, workers, batch_size)
SlicePos = tuple[int, int]


@dataclass(frozen=True)
class ReaderState:
    """A parsed, validated reader state (see the module docstring for the JSON form)."""

    table: TableIdentity
    version: int
    config: Mapping[str, Any]
    plan: PlanShape | None
    layouts: Mapping[int, tuple[Piece, ...]]
    slices: tuple[SlicePos | None, ...]
    rounds: Mapping[int, Round] = field(default_factory=dict)
    policy: Mapping[str, Any] = field(default_factory=dict)
    eos_inside: tuple[int | None, ...] = ()
    """Per slice, the eos ids found inside the documents it delivered (packing readers;
    empty otherwise or in a state written before the count)."""
    deletes_seen: int | None = None
    """``deletes="honor"``: the last table commit whose deletions the layouts have taken out
    (NOTE [ deletions honored ] in ``reader/deletions.py``); None: none since the pin."""
    exclusions_seen: int | None = None
    """``exclusions=``: the version of the exclusion list whose keys the layouts have taken
    out (NOTE [ exclusion lists ] in ``reader/deletions.py``); None: not read yet."""

    @property
    def complete(self) -> bool:
        return self.plan is not None and all(s is not None for s in self.slices)

    @property
    def earliest_round(self) -> int:
        """The earliest round a slice stands in (0 when none has a position)."""
        return min((s[0] for s in self.slices if s is not None), default=0)

    def positions(self) -> list[SlicePos]:
        """Every slice's position; only for a complete state."""
        return [s for s in self.slices if s is not None]

    def eos_at(self, g: int) -> int:
        """Slice ``g``'s eos count (0 when the state holds none)."""
        return (self.eos_inside[g] or 0) if g < len(self.eos_inside) else 0

    @property
    def eos_total(self) -> int:
        """The eos ids found inside delivered documents, over every slice the state holds."""
        return sum(n for n in self.eos_inside if n is not None)

    def with_slice(self, g: int, pos: SlicePos) -> ReaderState:
        slices = list(self.slices)
        slices[g] = pos
        return replace(self, slices=tuple(slices))

    def to_dict(self) -> dict[str, Any]:
        return {
            KEY_FORMAT: STATE_FORMAT,
            KEY_TABLE: self.table.to_json(),
            KEY_VERSION: self.version,
            KEY_CONFIG: dict(self.config),
            KEY_POLICY: dict(self.policy),
            KEY_PLAN: None if self.plan is None else dict(
                zip(("world_size", "workers", "batch_size"), self.plan, strict=True)),
            KEY_LAYOUTS: {str(e): encode_layout(ps) for e, ps in self.layouts.items()},
            KEY_SLICES: [None if s is None else list(s) for s in self.slices],
            **({KEY_ROUNDS: {str(r): d.to_json() for r, d in sorted(self.rounds.items())}}
               if self.rounds else {}),
            **({KEY_EOS_INSIDE: list(self.eos_inside)} if self.eos_inside else {}),
            **({KEY_DELETES_SEEN: self.deletes_seen} if self.deletes_seen is not None else {}),
            **({KEY_EXCLUSIONS_SEEN: self.exclusions_seen}
               if self.exclusions_seen is not None else {}),
        }

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> ReaderState:
        """Parse and validate.

        Raises:
            StateMismatchError: not a reader state, another format version, or corrupt.
        """
        if not isinstance(state, Mapping):
            raise StateMismatchError(f"reader state must be a dict, got {type(state).__name__}")
        found = state.get(KEY_FORMAT)
        if found in _OLD_FORMATS:
            raise StateMismatchError(
                f"reader state format {found!r} was written by an older lakeckpt-tables; this "
                f"one reads {STATE_FORMAT!r} only. Finish the run with the version that "
                "started it, or start a new run")
        if found != STATE_FORMAT:
            raise StateMismatchError(
                f"reader state format is {found!r}, this lakeckpt-tables reads {STATE_FORMAT!r}"
            )
        missing = [k for k in _KEYS if k not in state]
        if missing:
            raise StateMismatchError(f"reader state is corrupt: missing keys {missing}")
        unknown = sorted(map(str, set(state) - {*_KEYS, KEY_ROUNDS, KEY_POLICY,
                                                KEY_EOS_INSIDE, KEY_DELETES_SEEN,
                                                KEY_EXCLUSIONS_SEEN}))
        if unknown:
            raise StateMismatchError(f"reader state is corrupt: unknown keys {unknown}")
        try:
            return cls._parse(state)
        except (TypeError, ValueError, KeyError, IndexError, AttributeError,
                OverflowError) as exc:
            raise StateMismatchError(f"reader state is corrupt: {exc!r}") from exc

    @classmethod
    def _parse(cls, state: Mapping[str, Any]) -> ReaderState:
        t = state[KEY_TABLE]
        plan = state[KEY_PLAN]
        _exact_keys("table", t, ("format", "location", "table_id"))
        if plan is not None:
            _exact_keys("plan", plan, ("world_size", "workers", "batch_size"))
        shape = None if plan is None else (_positive(plan["world_size"]),
                                           _positive(plan["workers"]),
                                           _positive(plan["batch_size"]))
        slices = _slice_positions(state[KEY_SLICES])
        if shape is not None and len(slices) != shape[0] * shape[1]:
            raise ValueError(f"{len(slices)} slices for {shape[0]} ranks x {shape[1]} workers")
        if shape is None and (slices or state[KEY_LAYOUTS] or state.get(KEY_ROUNDS)):
            raise ValueError("a state without a plan (nothing read yet) holds no positions")
        layouts = {int(e): decode_layout(ps) for e, ps in state[KEY_LAYOUTS].items()}
        rounds = {int(r): Round.from_json(d) for r, d in state.get(KEY_ROUNDS, {}).items()}
        eos = tuple(None if n is None else _natural(n) for n in state.get(KEY_EOS_INSIDE, ()))
        if eos and len(eos) != len(slices):
            raise ValueError(f"{len(eos)} eos counts for {len(slices)} slices")
        return cls(
            table=TableIdentity(_table_format(t["format"]), _text(t["location"]),
                                _text(t["table_id"])),
            version=_int(state[KEY_VERSION]),
            config=dict(state[KEY_CONFIG]),
            policy=dict(state.get(KEY_POLICY) or {}),
            plan=shape,
            layouts=layouts,
            slices=slices,
            rounds=rounds,
            eos_inside=eos,
            deletes_seen=(None if state.get(KEY_DELETES_SEEN) is None
                          else _int(state[KEY_DELETES_SEEN])),
            exclusions_seen=(None if state.get(KEY_EXCLUSIONS_SEEN) is None
                             else _int(state[KEY_EXCLUSIONS_SEEN])),
        )


def _slice_positions(values: Any) -> tuple[SlicePos | None, ...]:
    """Every slice's position; only the held ones are checked one by one (a rank's state
    holds its own few of ranks x workers slices, so its Nones are skipped in C)."""
    if not isinstance(values, list | tuple):
        raise ValueError(f"slices must be a list, got {type(values).__name__}")
    slices: list[SlicePos | None] = [None] * len(values)
    for g in _held(values):
        slices[g] = _slice_position(values[g])
    return tuple(slices)


def _held(slices: Sequence[Any], lo: int = 0, hi: int | None = None) -> list[int]:
    """The indexes of the slices in ``[lo, hi)`` that are not None: halves holding none are
    skipped whole (``count`` runs in C), so a state holding a few slices costs a few
    microseconds, not a Python step per slice."""
    hi = len(slices) if hi is None else hi
    if hi - lo <= 32:
        return [g for g in range(lo, hi) if slices[g] is not None]
    if slices[lo:hi].count(None) == hi - lo:
        return []
    mid = (lo + hi) // 2
    return _held(slices, lo, mid) + _held(slices, mid, hi)


def _slice_position(value: Any) -> SlicePos:
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise ValueError(f"a slice position is [round, rows delivered], got {value!r}")
    return _natural(value[0]), _natural(value[1])


def _exact_keys(name: str, value: Any, keys: tuple[str, ...]) -> None:
    if not isinstance(value, Mapping) or set(value) != set(keys):
        raise ValueError(f"{name} must be a dict with keys {list(keys)}, got {value!r}")


def _table_format(value: Any) -> Literal["delta", "iceberg"]:
    if value == "delta" or value == "iceberg":
        return "delta" if value == "delta" else "iceberg"
    raise ValueError(f"table format must be 'delta' or 'iceberg', got {value!r}")


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"expected an int, got {value!r}")
    return value


def _natural(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"expected a non-negative int, got {value!r}")
    return value


def _positive(value: Any) -> int:
    if _natural(value) == 0:
        raise ValueError("expected a positive int, got 0")
    return int(value)


def merge_states(states: Iterable[Mapping[str, Any] | ReaderState]) -> ReaderState:
    """Merge the per-worker (and per-rank) states of one reader into one.

    In one pass (rank 0 merges ranks x workers states of ranks x workers slices each at
    every save): the states' shared fields are compared with the first planned state's, and
    only the slices each state holds are visited.

    Raises:
        StateMismatchError: the states belong to different tables, configurations or plans,
            or two of them claim the same slice.
    """
    parsed = [s if isinstance(s, ReaderState) else ReaderState.from_dict(s) for s in states]
    if not parsed:
        raise StateMismatchError("no reader states to merge")
    planned = [p for p in parsed if p.plan is not None]
    if not planned:  # nothing read yet anywhere: the last state stands for all
        return parsed[-1]
    first = planned[0]
    slices = list(first.slices)
    rounds = dict(first.rounds)
    for other in planned[1:]:
        for name in ("table", "version", "config", "policy", "plan", "layouts",
                     "deletes_seen", "exclusions_seen"):
            if getattr(first, name) != getattr(other, name):
                raise StateMismatchError(
                    f"cannot merge reader states with different {name}: "
                    f"{getattr(first, name)!r} vs {getattr(other, name)!r}"
                )
        for r, descriptor in other.rounds.items():
            if rounds.setdefault(r, descriptor) != descriptor:
                raise StateMismatchError(f"two reader states disagree on follow segment {r}: "
                                         f"{rounds[r]} vs {descriptor}")
        for g in _held(other.slices):
            pos = other.slices[g]
            if slices[g] is not None and slices[g] != pos:
                raise StateMismatchError(f"two reader states disagree on slice {g}: "
                                         f"{slices[g]} vs {pos}")
            slices[g] = pos
    return replace(first, slices=tuple(slices), rounds=rounds,
                   eos_inside=_merged_eos(planned))


def _merged_eos(states: Iterable[ReaderState]) -> tuple[int | None, ...]:
    """The eos counts of states of disjoint slices: each slice's from the state that holds
    its position (none when no state counts: a reader of rows)."""
    counting = [s for s in states if s.eos_inside]
    if not counting:
        return ()
    eos: list[int | None] = [None] * len(counting[0].slices)
    for state in counting:
        for g in _held(state.eos_inside):
            eos[g] = state.eos_inside[g]
    return tuple(eos)


def encode_state(state: Mapping[str, Any] | ReaderState) -> str:
    """Compact text form for the ledger: compressed JSON, base64."""
    data = state.to_dict() if isinstance(state, ReaderState) else dict(state)
    raw = json.dumps(data, separators=(",", ":"), sort_keys=True).encode()
    return _ENCODED_PREFIX + base64.b64encode(zlib.compress(raw, 9)).decode()


def decode_state(text: str) -> dict[str, Any]:
    """Inverse of :func:`encode_state`.

    Raises:
        StateMismatchError: not an encoded reader state, or damaged.
    """
    if not text.startswith(_ENCODED_PREFIX):
        raise StateMismatchError(f"not an encoded reader state (expected prefix "
                                 f"{_ENCODED_PREFIX!r}): {text[:20]!r}")
    try:
        value = json.loads(zlib.decompress(base64.b64decode(text[len(_ENCODED_PREFIX):])))
    except (ValueError, zlib.error) as exc:
        raise StateMismatchError(f"encoded reader state is damaged: {exc}") from exc
    if not isinstance(value, dict):
        raise StateMismatchError("encoded reader state does not hold a JSON object")
    return value
