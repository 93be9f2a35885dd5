"""The reader: LakeDataset and its state."""

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
