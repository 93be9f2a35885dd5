"""The run registry's shape: runs registered in a pyiceberg SQL catalog, across roots.

Each run is one namespace ``lakeckpt_runs.<run>-<ledger digest>`` of the catalog (the embedded
SQLite catalog by default, PostgreSQL in a deployment); its properties (:data:`PROPERTIES`) say
what the run is: run id, experiment, config hash, ledger, source table and version, status and
the ``best`` and ``latest`` checkpoints. Namespace properties are rows in the catalog's
database: registering writes no file, and works the same for Delta and Iceberg ledgers.

It sits beside the ledger it indexes: :mod:`lakeckpt_tables.checkpoint.registration` writes the
entries, :mod:`lakeckpt_tables.audit.registry` reads them; both take the shape from here.
"""


from __future__ import annotations

import hashlib
import re
from typing import Any, Literal

from lakeckpt_tables.errors import LedgerError

__all__ = ["NAMESPACE", "PROPERTIES", "Status", "load_catalog", "namespace_of"]

NAMESPACE = "lakeckpt_runs"
"""Parent namespace of the registered runs."""

Status = Literal["running", "finished", "failed"]

P_RUN = "run_id"
P_EXPERIMENT = "experiment"
P_CONFIG = "config_hash"
P_LEDGER = "ledger"
P_ROOT = "root"
P_TABLE = "table_uri"
P_TABLE_FORMAT = "table_format"
P_VERSION = "table_version"
P_STATUS = "status"
P_LATEST = "latest"
P_LATEST_STEP = "latest_step"
P_BEST = "best"
P_BEST_STEP = "best_step"
P_PARENT = "parent"
"""``<run>@<step>``: the run and step a branched run started from (empty otherwise)."""
P_UPDATED = "updated_at"
PROPERTIES = (P_RUN, P_EXPERIMENT, P_CONFIG, P_LEDGER, P_ROOT, P_TABLE_FORMAT, P_TABLE,
              P_VERSION, P_STATUS, P_LATEST, P_LATEST_STEP, P_BEST, P_BEST_STEP, P_PARENT,
              P_UPDATED)
"""The properties of a registered run, in display order."""


def load_catalog(catalog: Any = None) -> Any:
    """A pyiceberg catalog: given, by name, by SQLAlchemy URI, or the default one.

    Args:
        catalog: None or ``"lakeckpt"`` for the default embedded catalog; a catalog name
            pyiceberg knows (``~/.pyiceberg.yaml``, ``PYICEBERG_CATALOG__<NAME>__*``); a
            ``sqlite:///`` or ``postgresql+psycopg://`` URI for a SQL catalog there; or a
            catalog object, returned as is.

    Raises:
        LedgerError: the catalog cannot be loaded.
    """
    if catalog is not None and not isinstance(catalog, str):
        return catalog
    from lakeckpt_tables.sources.iceberg import DEFAULT_CATALOG_NAME, default_catalog

    try:
        if catalog is None or catalog == DEFAULT_CATALOG_NAME:
            return default_catalog()  # its configuration may change: not cached
        if "://" in catalog:
            from pyiceberg.catalog.sql import SqlCatalog

            return SqlCatalog(DEFAULT_CATALOG_NAME, uri=catalog)
        from pyiceberg.catalog import load_catalog as pyiceberg_load

        return pyiceberg_load(catalog)
    except Exception as e:  # pyiceberg raises ValueError, SQLAlchemy errors, OSError...
        raise LedgerError(f"catalog {catalog!r} cannot be loaded: {e}") from e


def namespace_of(run_id: str, ledger: str) -> tuple[str, str]:
    """The namespace of a run's entry; ``ledger`` is the ledger's spec text."""
    # a run id may hold dots (namespace separators): keep it readable, make it unique per ledger
    digest = hashlib.sha256(ledger.encode()).hexdigest()[:8]
    return NAMESPACE, f"{re.sub(r'[^A-Za-z0-9_-]', '_', run_id)}-{digest}"
