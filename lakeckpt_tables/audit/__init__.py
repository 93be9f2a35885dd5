"""Progress and audits over the ledger: DuckDB views, exact rows per checkpoint, verification.

- :func:`connect`: a DuckDB connection with the views ``checkpoints``, ``consumption``,
  ``progress``, ``runs``, ``events``, ``recoveries`` and ``follow_lag`` (SQL in
  ``catalog/*.sql``).
- :func:`rows`: the exact (file, row group, row) a checkpoint trained on, recomputed from the
  pure plan and the reader states the ledger holds.
- :func:`verify`: exactly-once, proved from the ledger's consumption records.
"""

from __future__ import annotations

from typing import Any

__all__ = ["connect", "rows", "verify"]


def __getattr__(name: str) -> Any:
    # duckdb, torch (through the reader) and pyiceberg are imported only by what needs them
    if name == "connect":
        from lakeckpt_tables.audit.views import connect

        return connect
    if name == "rows":
        from lakeckpt_tables.audit.replay import rows

        return rows
    if name == "verify":
        from lakeckpt_tables.audit.exactly_once import verify

        return verify
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
