"""Which columns a reader reads: the ones named, checked against a snapshot's schema and
against every one of its data files (a column added later is missing from older files)."""

from __future__ import annotations

from collections.abc import Sequence

from lakeckpt_tables.errors import UnknownColumnError, UnsupportedTableError
from lakeckpt_tables.sources.base import Snapshot

__all__ = ["resolve_columns"]


def resolve_columns(snapshot: Snapshot, columns: Sequence[str] | None) -> tuple[str, ...]:
    """``columns`` (all when None) as the snapshot has them.

    Raises:
        UnknownColumnError: a column the schema lacks.
        UnsupportedTableError: a data file that lacks one.
    """
    names = list(snapshot.schema.names)
    wanted = names if columns is None else list(columns)
    unknown = [c for c in wanted if c not in names]
    if unknown:
        raise UnknownColumnError(
            f"{snapshot.describe()} has no column(s) {unknown}; its columns are {names}")
    for path, present in snapshot.file_columns.items():
        lacking = [c for c in wanted if c not in present]
        if lacking:
            raise UnsupportedTableError(
                f"{snapshot.describe()}: data file {path} lacks column(s) {lacking} (added or "
                "renamed after the file was written); select other columns or rewrite the file")
    return tuple(wanted)
