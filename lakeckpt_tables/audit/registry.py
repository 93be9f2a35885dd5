"""The run registry, read side: the runs registered in a catalog, across roots.

The entries' shape is :mod:`lakeckpt_tables.ledger.registry` (re-exported here); the checkpoint
side writes them (:mod:`lakeckpt_tables.checkpoint.registration`).
"""

from __future__ import annotations

from typing import Any

from lakeckpt_tables.ledger.registry import (
    NAMESPACE,
    P_LEDGER,
    P_RUN,
    PROPERTIES,
    Status,
    load_catalog,
    namespace_of,
)

__all__ = [
    "NAMESPACE",
    "PROPERTIES",
    "Status",
    "load_catalog",
    "namespace_of",
    "registered_ledgers",
    "registered_runs",
]


def registered_runs(catalog: Any = None) -> list[dict[str, str]]:
    """Every run registered in ``catalog``, as property dicts, by run id."""
    from pyiceberg.exceptions import NoSuchNamespaceError

    catalog = load_catalog(catalog)
    try:
        children = catalog.list_namespaces(NAMESPACE)
    except NoSuchNamespaceError:
        return []
    runs = []
    for namespace in children:
        props = dict(catalog.load_namespace_properties(namespace))
        if P_RUN in props:
            runs.append({k: props.get(k, "") for k in PROPERTIES})
    return sorted(runs, key=lambda r: (r[P_RUN], r[P_LEDGER]))


def registered_ledgers(catalog: Any = None) -> list[str]:
    """The distinct ledgers of the runs registered in ``catalog``."""
    return sorted({r[P_LEDGER] for r in registered_runs(catalog) if r[P_LEDGER]})
