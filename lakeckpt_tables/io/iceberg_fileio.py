"""pyiceberg's fsspec FileIO with the GCS client the library uses (NOTE [ backing ]).

pyiceberg's own fsspec FileIO imports ``gcsfs.GCSFileSystem``, which is, unless
``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` was set before gcsfs was first imported, the class
that asks Google's storage control API whether each bucket is hierarchical: against an
emulator or a private endpoint every bucket waited 60 s. This FileIO builds gcsfs's core
``GCSFileSystem`` from the same ``gcs.*`` properties instead; every other store is pyiceberg's.
Name it in a catalog's properties: ``py-io-impl: lakeckpt_tables.io.iceberg_fileio.FileIO``
(the Iceberg ledger on gs:// and on Azure is given it: on Azure, pyiceberg's default FileIO is
pyarrow's C++ client, which aborts the process on an answer it cannot parse).
"""

from __future__ import annotations

import json
from typing import Any

from pyiceberg.io.fsspec import FsspecFileIO
from pyiceberg.typedef import Properties

__all__ = ["FileIO"]

IMPL = "lakeckpt_tables.io.iceberg_fileio.FileIO"
"""The ``py-io-impl`` property naming :class:`FileIO`."""


class FileIO(FsspecFileIO):
    """pyiceberg's fsspec FileIO; ``gs://`` through gcsfs's core ``GCSFileSystem``."""

    def __init__(self, properties: Properties) -> None:
        super().__init__(properties)
        self._scheme_to_fs["gs"] = self._scheme_to_fs["gcs"] = _gcs


def _gcs(properties: Properties) -> Any:
    """gcsfs's core filesystem with the arguments pyiceberg's ``_gs`` gives its class."""
    from gcsfs.core import GCSFileSystem

    def flag(name: str) -> bool:
        return str(properties.get(name, "false")).lower() == "true"

    return GCSFileSystem(
        project=properties.get("gcs.project-id", ""),  # None: gcsfs warns at every start
        access=properties.get("gcs.access", "full_control"),
        token=properties.get("gcs.oauth2.token"),
        consistency=properties.get("gcs.consistency", "none"),
        cache_timeout=properties.get("gcs.cache-timeout"),
        requester_pays=flag("gcs.requester-pays"),
        session_kwargs=json.loads(properties.get("gcs.session-kwargs", "{}")),
        endpoint_url=properties.get("gcs.service.host"),
        default_location=properties.get("gcs.default-bucket-location"),
        version_aware=flag("gcs.version-aware"))
