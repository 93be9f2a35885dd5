"""The reader: LakeDataset and its state.

Names load on first use, so that reading a saved reader state (``reader.state``: what the
``lakeckpt`` audit and progress commands decode) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakeckpt_tables.reader.convert import Ragged
    from lakeckpt_tables.reader.dataset import LakeDataset
    from lakeckpt_tables.reader.loaders import (
        dataset_of,
        reader_state_of,
        restore_reader,
        states_from_loader,
    )
    from lakeckpt_tables.reader.state import (
        ReaderState,
        decode_state,
        encode_state,
        merge_states,
    )

__all__ = [
    "LakeDataset",
    "Ragged",
    "ReaderState",
    "dataset_of",
    "decode_state",
    "encode_state",
    "merge_states",
    "reader_state_of",
    "restore_reader",
    "states_from_loader",
]

_HOMES = {
    "LakeDataset": "lakeckpt_tables.reader.dataset",
    "Ragged": "lakeckpt_tables.reader.convert",
    "ReaderState": "lakeckpt_tables.reader.state",
    "decode_state": "lakeckpt_tables.reader.state",
    "encode_state": "lakeckpt_tables.reader.state",
    "merge_states": "lakeckpt_tables.reader.state",
    "dataset_of": "lakeckpt_tables.reader.loaders",
    "reader_state_of": "lakeckpt_tables.reader.loaders",
    "restore_reader": "lakeckpt_tables.reader.loaders",
    "states_from_loader": "lakeckpt_tables.reader.loaders",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
