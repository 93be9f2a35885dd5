"""The one state dict a checkpoint holds, built the same way for save and for load.

torch.distributed.checkpoint saves a state dict and loads *into* one of the same shape, so a
save and a restore must build it identically: :func:`build_state` is that one builder, and
:func:`apply_state` hands what was loaded back to the objects. :func:`check_fits` compares the
built dict with a checkpoint's metadata before anything is loaded or claimed, so that a model of
the wrong shape is a named error that changes nothing.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from lakeckpt_tables.errors import CheckpointError, CheckpointRestoreError

__all__ = [
    "EXTRA",
    "LR_SCHEDULER",
    "MODEL",
    "OPTIMIZER",
    "Parts",
    "apply_state",
    "build_state",
    "check_fits",
    "rank_key",
    "rng_state",
    "set_rng_state",
]

MODEL = "model"
OPTIMIZER = "optimizer"
LR_SCHEDULER = "lr_scheduler"
EXTRA = "extra"
_SHOWN = 8  # keys listed per kind in an error


def rank_key(rank: int) -> str:
    """The key of a rank's own values (RNG, reader state): DCP keeps ONE copy of a non-tensor
    value saved under the same key on every rank."""
    return f"rank{rank}"


@dataclass(frozen=True)
class Parts:
    """What the user hands to ``save``/``restore``; any of them may be None."""

    model: torch.nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    lr_scheduler: Any = None
    extra: Mapping[str, Any] | None = None


def build_state(parts: Parts, rank: int, *, reader: str | None, run_id: str) -> dict[str, Any]:
    """The state dict of ``parts``; ``reader`` is this rank's encoded reader state on save,
    ``""`` on load, None for a rank the checkpoint has no values of (a grown world)."""
    state: dict[str, Any] = {}
    if reader is not None:
        state[rank_key(rank)] = {"rng": rng_state(), "reader": reader}
    if parts.model is not None:
        state[MODEL] = get_model_state_dict(parts.model)
    if parts.optimizer is not None:
        _check_optimizer(parts.model, parts.optimizer, run_id)
        state[OPTIMIZER] = get_optimizer_state_dict(parts.model, parts.optimizer)
    if parts.lr_scheduler is not None:
        state[LR_SCHEDULER] = parts.lr_scheduler.state_dict()
    if parts.extra is not None:
        state[EXTRA] = dict(parts.extra)
    return state


def apply_state(parts: Parts, state: Mapping[str, Any], rank: int) -> None:
    """Hand a loaded state dict back to ``parts`` (``extra`` is updated in place)."""
    if parts.model is not None:
        set_model_state_dict(parts.model, state[MODEL])
    if parts.optimizer is not None:
        set_optimizer_state_dict(parts.model, parts.optimizer, state[OPTIMIZER])
    if parts.lr_scheduler is not None:
        parts.lr_scheduler.load_state_dict(state[LR_SCHEDULER])
    if parts.extra is not None:
        parts.extra.update(state[EXTRA])  # type: ignore[attr-defined]
    if rank_key(rank) in state:
        set_rng_state(state[rank_key(rank)]["rng"])


def check_fits(state: Mapping[str, Any], metadata: Metadata, *, run_id: str, step: int) -> None:
    """Refuse state whose keys or shapes differ from the checkpoint's, before anything loads.

    Strict like ``load_state_dict`` for the model and optimizer: keys the checkpoint lacks,
    keys it has that the objects lack (a partial load would silently leave them untrained) and
    tensors of another shape; for the scheduler and ``extra``, keys the checkpoint lacks.

    Raises:
        CheckpointRestoreError: listing missing and unexpected keys and shape mismatches.
    """
    parts = (MODEL, OPTIMIZER, LR_SCHEDULER, EXTRA)
    ours, _ = flatten_state_dict({k: state[k] for k in parts if k in state})
    saved = {k: v for k, v in metadata.state_dict_metadata.items()
             if k.split(".", 1)[0] in parts and k.split(".", 1)[0] in state}
    missing = sorted(set(ours) - set(saved))
    # a scheduler or ``extra`` may hold fewer keys than were saved; weights may not
    unexpected = sorted(k for k in set(saved) - set(ours)
                        if k.split(".", 1)[0] in (MODEL, OPTIMIZER))
    shapes = []
    for key in sorted(set(ours) & set(saved)):
        value, meta = ours[key], saved[key]
        if isinstance(value, torch.Tensor) and isinstance(meta, TensorStorageMetadata) \
                and tuple(value.shape) != tuple(meta.size):
            shapes.append(f"{key}: checkpoint {tuple(meta.size)}, here {tuple(value.shape)}")
    if not (missing or unexpected or shapes):
        return
    detail = []
    for name, keys in (("missing from the checkpoint", missing),
                       ("in the checkpoint but not here", unexpected),
                       ("of another shape", shapes)):
        if keys:
            more = f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else ""
            detail.append(f"{len(keys)} {name}: {', '.join(keys[:_SHOWN])}{more}")
    raise CheckpointRestoreError(
        f"run {run_id}: checkpoint step {step} does not fit the state given "
        f"({'; '.join(detail)}). Nothing was loaded and the run is unchanged: build the model, "
        "optimizer and scheduler the run was trained with (and pass only what was saved), or "
        "start a new run id")


def _check_optimizer(model: torch.nn.Module | None, optimizer: torch.optim.Optimizer,
                     run_id: str) -> None:
    """Refuse an optimizer over parameters the model does not hold, before anything is written.

    torch.distributed.checkpoint keys optimizer state by the model's parameter names; state of
    a parameter outside the model has no name and would fail deep inside torch (``KeyError``).
    """
    if model is None:
        raise CheckpointError(f"run {run_id}: saving or restoring an optimizer needs the model "
                              "whose parameters it updates (model=...)")
    owned = {id(p) for p in model.parameters()}
    foreign = [tuple(p.shape) for group in optimizer.param_groups for p in group["params"]
               if id(p) not in owned]
    if foreign:
        raise CheckpointError(
            f"run {run_id}: the optimizer updates {len(foreign)} parameter(s) that are not "
            f"parameters of the model given (shapes {foreign[:5]}); their state could not be "
            "named in the checkpoint. Pass a model that holds every parameter the optimizer "
            "updates (e.g. an nn.ModuleDict of all trained modules), or one optimizer per model")


def rng_state() -> dict[str, Any]:
    """This process's Python, NumPy and torch RNG states, as a checkpoint keeps them."""
    return {"python": random.getstate(), "numpy": np.random.get_state(),
            "torch": torch.get_rng_state()}


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Set this process's RNGs to a state :func:`rng_state` took."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
