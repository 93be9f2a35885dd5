"""Table sources: resolve a Delta or Iceberg table to a pinned snapshot of units."""

from lakeckpt_tables.sources.base import Snapshot, Source
from lakeckpt_tables.sources.changes import ExclusionList
from lakeckpt_tables.sources.delta import DeltaSource
from lakeckpt_tables.sources.iceberg import IcebergSource, default_catalog

__all__ = ["DeltaSource", "ExclusionList", "IcebergSource", "Snapshot", "Source",
           "default_catalog"]
