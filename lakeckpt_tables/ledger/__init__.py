"""The ledger: a sidecar table where a checkpoint exists once, and only once, it is committed.

One flat table (:mod:`lakeckpt_tables.ledger.schema`) holds checkpoint, consumption and event
rows, so that a checkpoint and everything its ranks consumed land in one atomic commit: the
commit point of the checkpoint two-phase commit. Two backends implement the same
:class:`Ledger` contract: :class:`DeltaLedger` (the default, next to the checkpoints) and
:class:`IcebergLedger` (in a catalog, where audits can find it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lakeckpt_tables.errors import LedgerError
from lakeckpt_tables.ledger.base import Ledger
from lakeckpt_tables.ledger.delta import DeltaLedger
from lakeckpt_tables.ledger.records import (
    CheckpointRecord,
    ConsumptionRecord,
    FileDigest,
    LedgerEvent,
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
    "open_ledger",
]

DEFAULT_LEDGER_DIR = "_ledger"
"""Directory of the default Delta ledger, under the checkpoint root."""


def open_ledger(spec: str | Ledger | None, *, root: str,
                storage_options: dict[str, str] | None = None) -> Ledger:
    """Open (creating if needed) the ledger a run is configured with.

    Args:
        spec: None for the default Delta ledger under ``root``; ``"delta:<uri>"``;
            ``"iceberg:<namespace.table>"`` in the default catalog; or a ready ledger,
            returned as is.
        root: the checkpoint root, where the default ledger lives.
        storage_options: delta-rs storage options of Delta ledgers (the root's, by default).

    Returns:
        The ledger.

    Raises:
        LedgerError: the spec is not one of the forms above, or the table is not a ledger of
            this format version.
    """
    if spec is None:
        return DeltaLedger(f"{root.rstrip('/')}/{DEFAULT_LEDGER_DIR}",
                           storage_options=storage_options)
    if not isinstance(spec, str):
        return spec
    kind, _, target = spec.partition(":")
    if kind == "delta" and target:
        return DeltaLedger(target, storage_options=storage_options)
    if kind == "iceberg" and target:
        from lakeckpt_tables.ledger.iceberg import IcebergLedger
        from lakeckpt_tables.sources.iceberg import default_catalog

        return IcebergLedger(target, catalog=default_catalog())
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
