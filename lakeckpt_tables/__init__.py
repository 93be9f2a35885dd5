"""lakeckpt-tables: train PyTorch from Delta and Iceberg tables and resume exactly.

The plan (``lakeckpt_tables.plan``) imports without torch; this top-level module imports the
reader and therefore torch.
"""

from lakeckpt_tables.errors import LakeckptError
from lakeckpt_tables.reader import LakeDataset, Ragged, merge_states
from lakeckpt_tables.sources import DeltaSource, IcebergSource, default_catalog

__all__ = [
    "DeltaSource",
    "IcebergSource",
    "LakeDataset",
    "LakeckptError",
    "Ragged",
    "default_catalog",
    "merge_states",
]
__version__ = "0.1.0"
