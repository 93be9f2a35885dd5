"""A chunk's columns in one shared-memory storage (NOTE [ chunked hand-off ] in
``reader/handoff.py``): a worker copies its converted batches, column by column, end to end
into one allocation that crosses to the main process as a file descriptor; the main process
cuts each batch back out as views.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lakeckpt_tables.reader.convert import Ragged

__all__ = ["Column", "pack", "populate"]


@dataclass
class _Dense:
    """A tensor column: its batches end to end along the first dimension."""

    data: torch.Tensor

    def cut(self, j: int, lo: int, hi: int) -> torch.Tensor:
        return self.data[lo:hi]

    def pin_memory(self) -> _Dense:
        return _Dense(self.data.pin_memory())


@dataclass
class _Lists:
    """A list column: values end to end, each batch's own offsets end to end, and per batch
    (first value, end of values, first offset, width): a width >= 0 is a 2-D batch."""

    values: torch.Tensor
    offsets: torch.Tensor
    spans: list[tuple[int, int, int, int]]

    def cut(self, j: int, lo: int, hi: int) -> torch.Tensor | Ragged:
        first, end, at, width = self.spans[j]
        if width >= 0:
            return self.values[first:end].view(hi - lo, width)
        return Ragged(self.values[first:end], self.offsets[at:at + hi - lo + 1])

    def pin_memory(self) -> _Lists:
        return _Lists(self.values.pin_memory(), self.offsets.pin_memory(), self.spans)


@dataclass
class _Objects:
    """Strings or bytes: one Python list (pickled by value)."""

    items: list[Any]

    def cut(self, j: int, lo: int, hi: int) -> list[Any]:
        return self.items[lo:hi]

    def pin_memory(self) -> _Objects:
        return self


@dataclass
class _Each:
    """Anything of no common shape: each batch's own value, handed over as it is."""

    values: list[Any]

    def cut(self, j: int, lo: int, hi: int) -> Any:
        return self.values[j]

    def pin_memory(self) -> _Each:
        from torch.utils.data._utils.pin_memory import pin_memory

        return _Each([pin_memory(v) for v in self.values])  # type: ignore[no-untyped-call]


Column = _Dense | _Lists | _Objects | _Each


_ALIGN = 64
"""Byte alignment of each tensor in a chunk's storage (a multiple of every element size)."""


class _Arena:
    """The tensors of one chunk, each a run of batches end to end, in one shared-memory
    storage: a single copy of each value, one allocation, and one file descriptor per hand-off
    (torch pickles a shared storage as a descriptor, once however many tensors view it;
    ``Tensor.share_memory_`` would copy again)."""

    def __init__(self) -> None:
        self._runs: list[Sequence[torch.Tensor]] = []
        self._built: list[torch.Tensor] = []

    def add(self, parts: Sequence[torch.Tensor]) -> int:
        """Reserve a tensor of ``parts`` end to end (same dtype and trailing shape)."""
        self._runs.append(parts)
        return len(self._runs) - 1

    def __getitem__(self, index: int) -> torch.Tensor:
        return self._built[index]

    def build(self) -> None:
        """Allocate the storage and copy every run into it."""
        layout: list[tuple[int, torch.Size, torch.dtype]] = []
        size = 0
        for parts in self._runs:
            first = parts[0]
            shape = torch.Size((sum(int(p.shape[0]) for p in parts), *first.shape[1:]))
            size = -(-size // _ALIGN) * _ALIGN
            layout.append((size, shape, first.dtype))
            size += shape.numel() * first.element_size()
        storage: torch.UntypedStorage = torch.UntypedStorage._new_shared(  # type: ignore[no-untyped-call]
            size)
        populate(storage.data_ptr(), size)
        for (at, shape, dtype), parts in zip(layout, self._runs, strict=True):
            out = torch.empty(0, dtype=dtype)
            out.set_(storage, at // out.element_size(), shape, _strides(shape))
            # numpy copies on this thread; torch.cat would fan out to intra-op threads, which
            # cost ten times the copy on a loaded machine (a DataLoader worker has one thread,
            # not every caller does)
            np.concatenate([p.numpy() for p in parts], out=out.numpy())
            self._built.append(out)


_MADV_POPULATE_WRITE = 23


@functools.cache
def _madvise() -> Any:
    """libc's ``madvise`` on Linux, None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def populate(address: int, size: int) -> None:
    """Map a fresh shared storage's pages in one call rather than one fault per page as the
    copy first writes them (a quarter of the copy's time: 40 ms instead of 53-60 ms for
    117 MB). Linux 5.14 or later; elsewhere, or refused, the copy faults them in as before."""
    madvise = _madvise()
    if madvise is not None and size:
        madvise(address, size, _MADV_POPULATE_WRITE)


def _strides(shape: torch.Size) -> tuple[int, ...]:
    """Row-major strides of ``shape``."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def pack(batches: list[dict[str, Any]]) -> dict[str, Column]:
    """The converted batches of a chunk, column by column."""
    arena = _Arena()
    columns = {name: _pack_column([b[name] for b in batches], arena) for name in batches[0]}
    arena.build()
    return {name: make() for name, make in columns.items()}


def _pack_column(parts: list[Any], arena: _Arena) -> Callable[[], Column]:
    """How to build the column once ``arena`` holds its tensors."""
    first = parts[0]
    if isinstance(first, torch.Tensor) and all(
            isinstance(p, torch.Tensor) and p.dtype == first.dtype
            and p.shape[1:] == first.shape[1:] for p in parts):
        data = arena.add(parts)
        return lambda: _Dense(arena[data])
    if all(_is_list_batch(p) for p in parts):
        values = [p.values if isinstance(p, Ragged) else p.reshape(-1) for p in parts]
        if all(v.dtype == values[0].dtype for v in values):
            return _lists(parts, values, arena)
    if all(isinstance(p, list) for p in parts):
        items = list(itertools.chain.from_iterable(parts))
        return lambda: _Objects(items)
    return lambda: _Each(parts)


def _is_list_batch(part: Any) -> bool:
    return (isinstance(part, Ragged) and part.values.dim() == 1) or (
        isinstance(part, torch.Tensor) and part.dim() == 2)


def _lists(parts: list[Any], values: list[torch.Tensor],
           arena: _Arena) -> Callable[[], _Lists]:
    spans: list[tuple[int, int, int, int]] = []
    offsets: list[torch.Tensor] = []
    first = at = 0
    for part, flat in zip(parts, values, strict=True):
        end = first + int(flat.shape[0])
        if isinstance(part, Ragged):
            spans.append((first, end, at, -1))
            offsets.append(part.offsets)
            at += int(part.offsets.shape[0])
        else:
            spans.append((first, end, 0, int(part.shape[1])))
        first = end
    flat_values = arena.add(values)
    packed = arena.add(offsets) if offsets else -1

    def make() -> _Lists:
        own = arena[packed] if packed >= 0 else torch.zeros(0, dtype=torch.int64)
        return _Lists(arena[flat_values], own, spans)
    return make
