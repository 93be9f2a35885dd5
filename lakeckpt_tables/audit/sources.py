"""The source table a ledger's checkpoints name, opened again for an audit.

A checkpoint names its source by format, location and table id. A Delta table opens from its
location; an Iceberg table lives in a catalog under an identifier the ledger does not keep,
so it is found by location (or table id) among the catalog's tables.
"""

from __future__ import annotations

from typing import Any

from lakeckpt_tables.errors import SourceNotFoundError

__all__ = ["open_source"]


def open_source(fmt: str, location: str, *, catalog: Any = None,
                table_id: str | None = None,
                storage_options: dict[str, str] | None = None) -> Any:
    """A :class:`~lakeckpt_tables.DeltaSource` or :class:`~lakeckpt_tables.IcebergSource`.

    Args:
        fmt: ``"delta"`` or ``"iceberg"``.
        location: the table's root URI, as the ledger recorded it.
        catalog: where to look for an Iceberg table; the default catalog when None.
        table_id: the Iceberg table uuid, matched when the location differs (a moved table).
        storage_options: deltalake storage options of a Delta source.

    Raises:
        SourceNotFoundError: no such table (for Iceberg: none in the catalog at that location).
    """
    if fmt == "delta":
        from lakeckpt_tables.sources.delta import DeltaSource

        return DeltaSource(location, storage_options=storage_options)
    if fmt != "iceberg":
        raise SourceNotFoundError(f"source format {fmt!r} of {location} is not known")
    from lakeckpt_tables.sources.base import local_path_or_uri
    from lakeckpt_tables.sources.iceberg import IcebergSource, default_catalog

    if catalog is None:
        catalog = default_catalog()
    for namespace in catalog.list_namespaces():
        for identifier in catalog.list_tables(namespace):
            table = catalog.load_table(identifier)
            if (local_path_or_uri(table.metadata.location) == location
                    or str(table.metadata.table_uuid) == table_id):
                return IcebergSource(".".join(identifier), catalog=catalog)
    raise SourceNotFoundError(
        f"no Iceberg table at {location} in catalog {catalog.name!r}: pass the catalog "
        "holding the run's source table (catalog=...)")
