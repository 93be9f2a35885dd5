"""Weights that change while a run goes on: a :class:`WeightSchedule` of phases, each constant
or annealed linearly, by draw or by step. Plain data (JSON), no torch.

NOTE [ weight schedules ]
A schedule is a list of *phases*, each starting at a draw (or step) ``at``, the first at 0.
A phase holds ``weights`` until the next phase starts; a phase with ``to`` and ``until``
moves linearly from ``weights`` (at ``at``) to ``to`` (at ``until``) and holds ``to`` after
it. So piecewise-constant weights are phases without ``to``, and an anneal is one phase with
``to``. Weights are normalized per phase, and a source may have weight 0 in a phase (it is
not drawn there), as long as some source has more.

``by="step"`` counts optimizer steps: step ``s`` is draws ``[s * k, (s + 1) * k)`` with
``k = batches_per_step`` (gradient accumulation: a draw is one batch of every rank). Skipped
batches (``skip_batches``) are draws too: a schedule by step after a skip of ``n`` batches is
``n`` draws early, which a skip of whole steps keeps at ``n / k`` steps.

Draw ``i``'s weights are a pure function of ``i`` (float64 arithmetic, the same on every
machine), so every rank and DataLoader worker computes them alone, like the schedule itself
(NOTE [ mixture schedule ] in ``plan/schedule.py``). The schedule is part of a mixture state's
configuration; a resume into other weights or another schedule takes effect from the first
draw not delivered (NOTE [ recipe changes ] in ``checkpoint/recipe.py``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from lakeckpt_tables.errors import MixtureError

__all__ = ["WeightSchedule", "as_schedule", "weights_config"]

By = Literal["draw", "step"]
_BY = ("draw", "step")
_SCHEDULE_KEYS = {"by", "batches_per_step", "phases"}


class WeightSchedule:
    """Mixture weights as a function of the draw or step (NOTE [ weight schedules ]).

    Args:
        phases: each ``{"at": int, "weights": {name: w}}``, optionally with ``"to": {name:
            w}`` and ``"until": int`` (a linear anneal from ``weights`` at ``at`` to ``to``
            at ``until``); ``at`` strictly increasing from 0.
        by: ``"draw"`` (a batch of the mixture) or ``"step"`` (``batches_per_step`` draws).
        batches_per_step: draws per step when ``by="step"``.

    Raises:
        MixtureError: phases that do not name the same sources, weights that are not finite
            and non-negative with a positive sum, ``at``/``until`` out of order.
    """

    def __init__(self, phases: Sequence[Mapping[str, Any]], *, by: By = "draw",
                 batches_per_step: int = 1) -> None:
        if by not in _BY:
            raise MixtureError(f"WeightSchedule(by={by!r}): pass 'draw' or 'step'")
        if not _positive_int(batches_per_step):
            raise MixtureError(f"WeightSchedule(batches_per_step={batches_per_step!r}): pass "
                               "a positive int")
        if not phases:
            raise MixtureError("a WeightSchedule needs at least one phase (at 0)")
        self.by, self.batches_per_step = by, batches_per_step
        self.phases = [_phase(p, i) for i, p in enumerate(phases)]
        self.names = sorted(self.phases[0]["weights"])
        for i, p in enumerate(self.phases):
            for key in ("weights", "to"):
                if key in p and sorted(p[key]) != self.names:
                    raise MixtureError(f"phase {i} of the weight schedule names sources "
                                       f"{sorted(p[key])} in {key!r}, phase 0 {self.names}; "
                                       "give every source a weight in every phase")
        ats = [p["at"] for p in self.phases]
        if ats[0] != 0 or any(b <= a for a, b in itertools.pairwise(ats)):
            raise MixtureError(f"weight schedule phases start at {ats}: the first at 0, each "
                               "later than the one before")
        for i, p in enumerate(self.phases):
            end = ats[i + 1] if i + 1 < len(ats) else None
            if "until" in p and end is not None and p["until"] > end:
                raise MixtureError(f"phase {i}'s anneal ends at {p['until']}, after phase "
                                   f"{i + 1} starts at {end}")

    # ------------------------------------------------------------------ constructors

    @classmethod
    def piecewise(cls, points: Mapping[int, Mapping[str, float]], *, by: By = "draw",
                  batches_per_step: int = 1) -> WeightSchedule:
        """Constant weights from each point on: ``{0: w0, 8000: w1}``."""
        return cls([{"at": at, "weights": w} for at, w in sorted(points.items())], by=by,
                   batches_per_step=batches_per_step)

    @classmethod
    def anneal(cls, start: Mapping[str, float], end: Mapping[str, float], *, first: int,
               last: int, by: By = "draw", batches_per_step: int = 1) -> WeightSchedule:
        """``start`` until ``first``, then linearly to ``end`` at ``last``, then ``end``."""
        phases: list[dict[str, Any]] = [{"at": 0, "weights": dict(start)}] if first else []
        phases.append({"at": first, "weights": dict(start), "to": dict(end), "until": last})
        return cls(phases, by=by, batches_per_step=batches_per_step)

    @classmethod
    def from_json(cls, value: Any) -> WeightSchedule:
        """The schedule of :meth:`to_json` (or a mixture state's ``weights``).

        Raises:
            MixtureError: not a schedule.
        """
        if not isinstance(value, Mapping) or set(value) != _SCHEDULE_KEYS:
            raise MixtureError(f"not a weight schedule: {value!r}")
        return cls(value["phases"], by=value["by"], batches_per_step=value["batches_per_step"])

    # ------------------------------------------------------------------------ values

    def to_json(self) -> dict[str, Any]:
        """Plain data, weights normalized per phase: what a mixture state records."""
        phases = []
        for p in self.phases:
            out: dict[str, Any] = {"at": p["at"], "weights": _normalized(p["weights"])}
            if "to" in p:
                out.update(to=_normalized(p["to"]), until=p["until"])
            phases.append(out)
        return {"by": self.by, "batches_per_step": self.batches_per_step, "phases": phases}

    @property
    def constant(self) -> dict[str, float] | None:
        """The weights (normalized) when they never change, else None."""
        if len(self.phases) == 1 and "to" not in self.phases[0]:
            return _normalized(self.phases[0]["weights"])
        return None

    def step_of(self, draw: int) -> int:
        """The step (or draw, by draw) of ``draw``."""
        return draw // self.batches_per_step if self.by == "step" else draw

    def weights(self, draws: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Each draw's normalized weights (draws x sources, sources by name)."""
        at = np.asarray(draws, dtype=np.int64)
        if self.by == "step":
            at = at // self.batches_per_step
        out = np.empty((len(at), len(self.names)), dtype=np.float64)
        starts = np.array([p["at"] for p in self.phases], dtype=np.int64)
        phase = np.searchsorted(starts, at, side="right") - 1
        for i, p in enumerate(self.phases):
            mine = phase == i
            if not mine.any():
                continue
            a = _vector(p["weights"], self.names)
            if "to" not in p:
                out[mine] = a
                continue
            b = _vector(p["to"], self.names)
            frac = np.clip((at[mine] - p["at"]) / (p["until"] - p["at"]), 0.0, 1.0)
            out[mine] = a + (b - a) * frac[:, None]
        return out

    def in_force(self, draw: int) -> dict[str, float]:
        """The weights of ``draw``, by source name (rounded for reading)."""
        row = self.weights(np.array([draw]))[0]
        return {n: round(float(w), 6) for n, w in zip(self.names, row, strict=True)}


def weights_config(schedule: WeightSchedule) -> Any:
    """What a mixture state records of its weights: the normalized weights when constant (as
    before schedules existed, so older states load), else the schedule's JSON."""
    constant = schedule.constant
    return constant if constant is not None else schedule.to_json()


def as_schedule(weights: Any, names: Sequence[str]) -> WeightSchedule:
    """``weights`` (a dict of numbers, a :class:`WeightSchedule` or its JSON) as a schedule.

    Raises:
        MixtureError: weights not naming exactly ``names``, or not a schedule.
    """
    if isinstance(weights, WeightSchedule):
        schedule = weights
    elif isinstance(weights, Mapping) and set(weights) == _SCHEDULE_KEYS \
            and not all(_number(w) for w in weights.values()):
        schedule = WeightSchedule.from_json(weights)
    elif isinstance(weights, Mapping):
        if set(weights) != set(names):
            raise MixtureError(
                f"weights name {sorted(weights)} but the sources are {sorted(names)}; give "
                "one weight per source")
        bad = {k: w for k, w in weights.items() if not _number(w) or w <= 0}
        if bad:
            raise MixtureError(f"weights must be positive finite numbers; got {bad}")
        schedule = WeightSchedule([{"at": 0, "weights": dict(weights)}])
    else:
        raise MixtureError(f"weights={weights!r}: pass {{name: weight}} or a WeightSchedule")
    if schedule.names != sorted(names):
        raise MixtureError(f"the weight schedule names {schedule.names} but the sources are "
                           f"{sorted(names)}; give every source a weight in every phase")
    return schedule


def _phase(value: Any, i: int) -> dict[str, Any]:
    """One phase, checked; ``i`` names it in errors."""
    if not isinstance(value, Mapping) or not {"at", "weights"} <= set(value) or \
            set(value) - {"at", "weights", "to", "until"} or ("to" in value) != ("until" in value):
        raise MixtureError(f"phase {i} of the weight schedule is {value!r}: give 'at' and "
                           "'weights', and for an anneal both 'to' and 'until'")
    at = value["at"]
    if not _natural(at):
        raise MixtureError(f"phase {i} starts at {at!r}: pass a draw or step >= 0")
    out: dict[str, Any] = {"at": at, "weights": _checked(value["weights"], i, "weights")}
    if "to" in value:
        until = value["until"]
        if not _natural(until) or until <= at:
            raise MixtureError(f"phase {i}'s anneal runs from {at} until {until!r}: pass an "
                               "'until' after 'at'")
        out.update(to=_checked(value["to"], i, "to"), until=until)
    return out


def _checked(weights: Any, i: int, key: str) -> dict[str, float]:
    if not isinstance(weights, Mapping) or not weights:
        raise MixtureError(f"phase {i}'s {key!r} is {weights!r}: pass {{name: weight}}")
    bad = {k: w for k, w in weights.items() if not _number(w) or w < 0}
    if bad or not any(w > 0 for w in weights.values()):
        raise MixtureError(f"phase {i}'s {key!r} must be finite weights >= 0, some positive; "
                           f"got {dict(weights)}")
    return {str(k): float(w) for k, w in weights.items()}


def _normalized(weights: Mapping[str, float]) -> dict[str, float]:
    names = sorted(weights)
    total = sum(float(weights[n]) for n in names)  # in name order, as states always summed
    return {n: float(weights[n]) / total for n in names}


def _vector(weights: Mapping[str, float], names: list[str]) -> np.ndarray[Any, Any]:
    v: np.ndarray[Any, Any] = np.array([weights[n] for n in names], dtype=np.float64)
    v /= v.sum()
    return v


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _natural(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _positive_int(value: Any) -> bool:
    return _natural(value) and value > 0
