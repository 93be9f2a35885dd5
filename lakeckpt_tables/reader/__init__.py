"""The reader: LakeDataset and its state.

Names load lazily, so that decoding a reader state (``lakeckpt progress``, ``verify``)
imports neither torch nor the dataset: a command answers in a fraction of torch's import time.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from lakeckpt_tables.lazy import lazy_names

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

# StatefulDataLoader.__init__ calls torch.set_vital, a no-op torch deprecated with a UserWarning
# that every run of a loader this library is used with printed. The call is torchdata's, so the
# filter names its module: a set_vital call of anyone else still warns. (docs/limits.md)
warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning,
                        module=r"torchdata\.stateful_dataloader\.stateful_dataloader\Z")

_HOMES = {
    "LakeDataset": "lakeckpt_tables.reader.dataset",
    "Ragged": "lakeckpt_tables.reader.convert",
    "ReaderState": "lakeckpt_tables.reader.state",
    "dataset_of": "lakeckpt_tables.reader.loaders",
    "decode_state": "lakeckpt_tables.reader.state",
    "encode_state": "lakeckpt_tables.reader.state",
    "merge_states": "lakeckpt_tables.reader.state",
    "reader_state_of": "lakeckpt_tables.reader.loaders",
    "restore_reader": "lakeckpt_tables.reader.loaders",
    "states_from_loader": "lakeckpt_tables.reader.loaders",
}
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


__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__)
