"""Opening a ledger to write (tag, gc, maintain): only one that exists; nothing is created."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lakeckpt_tables.audit.sources import ledger_options
from lakeckpt_tables.audit.target import read_ledger

__all__ = ["existing_ledger"]


def existing_ledger(target: str, catalog: Any,
                    storage_options: Mapping[str, str] | None = None) -> Any:
    """The ledger ``target`` names, which must exist (read commands' rules, then opened)."""
    from lakeckpt_tables.audit.registry import load_catalog
    from lakeckpt_tables.ledger import DeltaLedger

    catalog = load_catalog(catalog) if target.startswith("iceberg:") else catalog
    options = ledger_options(target, storage_options)
    found = read_ledger(target, catalog=catalog, storage_options=options)
    kind, _, rest = found.where.partition(":")
    if kind == "iceberg":
        from lakeckpt_tables.ledger.iceberg import IcebergLedger

        return IcebergLedger(rest, catalog=found.catalog)
    return DeltaLedger(rest, storage_options=options, create=False)
