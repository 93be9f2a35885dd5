"""lakeckpt-tables: train PyTorch from Delta and Iceberg tables and resume exactly.

Public names load lazily, so ``lakeckpt_tables.plan`` (pure, numpy only) imports without
torch, and a Delta user never pays for pyiceberg.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakeckpt_tables.lazy import lazy_names

if TYPE_CHECKING:
    from lakeckpt_tables.errors import LakeckptError
    from lakeckpt_tables.mixture import Mixture
    from lakeckpt_tables.reader import LakeDataset, Ragged, merge_states
    from lakeckpt_tables.reader.handoff import ChunkedLoader
    from lakeckpt_tables.sources import (
        DeltaSource,
        ExclusionList,
        IcebergSource,
        default_catalog,
    )

__all__ = [
    "ChunkedLoader",
    "DeltaSource",
    "ExclusionList",
    "IcebergSource",
    "LakeDataset",
    "LakeckptError",
    "Mixture",
    "Ragged",
    "default_catalog",
    "merge_states",
]
__version__ = "0.1.0"

_HOMES = {
    "DeltaSource": "lakeckpt_tables.sources",
    "IcebergSource": "lakeckpt_tables.sources",
    "ExclusionList": "lakeckpt_tables.sources",
    "default_catalog": "lakeckpt_tables.sources",
    "LakeDataset": "lakeckpt_tables.reader",
    "Ragged": "lakeckpt_tables.reader",
    "merge_states": "lakeckpt_tables.reader",
    "ChunkedLoader": "lakeckpt_tables.reader.handoff",
    "LakeckptError": "lakeckpt_tables.errors",
    "Mixture": "lakeckpt_tables.mixture",
}


__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__)
