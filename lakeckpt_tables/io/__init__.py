"""The I/O layer: one store per URI and storage options, through which every byte goes.

:class:`Storage` reads ranges, opens Parquet files for coalesced row group reads, lists, puts
atomically, deletes and checks existence, on local disks, S3 (pyarrow's native client) and
other fsspec stores; :mod:`lakeckpt_tables.io.checkpoint_storage` builds checkpoint files on it.
"""

from __future__ import annotations

from lakeckpt_tables.io.options import OPTIONS_ENV, parse_storage_options, s3_settings
from lakeckpt_tables.io.storage import Storage, iceberg_storage, storage_from_cli

__all__ = ["OPTIONS_ENV", "Storage", "iceberg_storage", "parse_storage_options", "s3_settings",
           "storage_from_cli"]
