"""Where a ledger lives, as a value: what the run registry records and ``open_ledger`` reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["LedgerSpec"]


@dataclass(frozen=True)
class LedgerSpec:
    """A ledger's address.

    Attributes:
        kind: the backend.
        location: the Delta table's URI, or the Iceberg table's ``namespace.table``.
        catalog: the name of the catalog holding an Iceberg ledger (never its URI or
            properties, which may hold credentials); None for Delta.
    """

    kind: Literal["delta", "iceberg"]
    location: str
    catalog: str | None = None

    def __str__(self) -> str:
        """The spec text :func:`~lakeckpt_tables.ledger.open_ledger` takes."""
        return f"{self.kind}:{self.location}"
