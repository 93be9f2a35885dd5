"""The ledger: a sidecar table where a checkpoint exists once, and only once, it is committed.

One flat table (:mod:`lakeckpt_tables.ledger.schema`) holds checkpoint, consumption and event
rows, so that a checkpoint and everything its ranks consumed land in one atomic commit: the
commit point of the checkpoint two-phase commit. Two backends implement the same
:class:`Ledger` contract: :class:`DeltaLedger` (the default, next to the checkpoints) and
:class:`IcebergLedger` (in a catalog, where audits can find it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lakeckpt_tables.errors import LedgerError
from lakeckpt_tables.io import Storage
from lakeckpt_tables.ledger.base import Ledger
from lakeckpt_tables.ledger.delta import DeltaLedger
from lakeckpt_tables.ledger.records import (
    CheckpointRecord,
    ConsumptionRecord,
    FileDigest,
    LedgerEvent,
    SourceVersion,
)
from lakeckpt_tables.ledger.schema import LEDGER_FORMAT_VERSION, LEDGER_SCHEMA
from lakeckpt_tables.ledger.spec import LedgerSpec

if TYPE_CHECKING:
    from lakeckpt_tables.ledger.iceberg import IcebergLedger

__all__ = [
    "DEFAULT_LEDGER_DIR",
    "LEDGER_FORMAT_VERSION",
    "LEDGER_SCHEMA",
    "CheckpointRecord",
    "ConsumptionRecord",
    "DeltaLedger",
    "FileDigest",
    "IcebergLedger",
    "Ledger",
    "LedgerEvent",
    "LedgerSpec",
    "SourceVersion",
    "open_ledger",
]

DEFAULT_LEDGER_DIR = "_ledger"
"""Directory of the default Delta ledger, under the checkpoint root."""


def open_ledger(spec: str | Ledger | None, *, root: str | None = None,
                storage: Storage | None = None,
                storage_options: Mapping[str, str] | None = None) -> Ledger:
    """Open (creating if needed) the ledger a run is configured with.

    Args:
        spec: None for the default Delta ledger under the root; ``"delta:<uri>"``;
            ``"iceberg:<namespace.table>"`` in the default catalog; or a ready ledger,
            returned as is.
        root: the checkpoint root, where the default ledger lives (when ``storage`` is not
            given).
        storage: the checkpoint root's store: the default ledger lives under it, and a
            ``delta:`` ledger in the same kind of store takes its storage options (one seam).
        storage_options: the options of ``root`` when no ``storage`` is given.

    Returns:
        The ledger.

    Raises:
        LedgerError: the spec is not one of the forms above, or the table is not a ledger of
            this format version.
        StorageError: the store failed (named with the URI and the kind).
    """
    if storage is None:
        if root is None:
            raise ValueError("open_ledger needs the checkpoint root or its storage")
        storage = Storage(root, storage_options)
    if spec is None:
        return DeltaLedger(storage.child(DEFAULT_LEDGER_DIR))
    if not isinstance(spec, str):
        return spec
    kind, _, target = spec.partition(":")
    if kind == "delta" and target:
        return DeltaLedger(storage.elsewhere(target))
    if kind == "iceberg" and target:
        from lakeckpt_tables.ledger.iceberg import IcebergLedger
        from lakeckpt_tables.sources.iceberg import default_catalog

        catalog = default_catalog()
        # the root's options configure the ledger's store when its warehouse is in the same
        # kind of store (NOTE [ iceberg ledger store ])
        warehouse = catalog.properties.get("warehouse")
        return IcebergLedger(target, catalog=catalog,
                             storage=None if warehouse is None else storage.elsewhere(warehouse))
    raise LedgerError(
        f"ledger spec {spec!r} is not understood: use 'delta:<uri>', "
        "'iceberg:<namespace.table>', or leave it unset for the Delta ledger under the "
        "checkpoint root"
    )


def __getattr__(name: str) -> Any:
    # pyiceberg and SQLAlchemy cost a second or more to import: only Iceberg ledger users pay.
    if name == "IcebergLedger":
        from lakeckpt_tables.ledger.iceberg import IcebergLedger

        return IcebergLedger
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
