"""The null policy, decided when the reader is built, not hours into an epoch.

NOTE [ null policy ]
torch has no null for integers, booleans, timestamps, dates or decimals. Which columns of which
files hold nulls is known up front: from Parquet footer statistics (the column is read where a
file has none), from the table metadata for partition values, and from the schema for columns a
file lacks. ``nulls="refuse"`` (the default) refuses such a table at construction, naming table,
version, file, column and null count. ``"fill"`` delivers nulls as 0 (``False`` for booleans,
the epoch for timestamps and dates); ``"mask"`` fills likewise and adds a boolean column
``<column>__is_null`` per column that can hold nulls. Floats need no policy (null is NaN), nor
do strings and binaries (``None``), nor the Arrow output. Counts include rows deleted by deletion
vectors (a table is refused even if only its deleted rows hold nulls: fill or mask read it).
Appended files in follow mode are checked as their batches are converted.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import pyarrow as pa

from lakeckpt_tables.errors import NullValuesError
from lakeckpt_tables.sources.base import Snapshot, known_null_counts
from lakeckpt_tables.types import Unit

__all__ = ["MASK_SUFFIX", "NULL_POLICIES", "NullPolicy", "check_nulls", "needs_policy"]

NullPolicy = Literal["refuse", "fill", "mask"]
NULL_POLICIES: tuple[str, ...] = ("refuse", "fill", "mask")
MASK_SUFFIX = "__is_null"

_THREADS = 8


def needs_policy(kind: pa.DataType) -> bool:
    """Whether a null in a column of type ``kind`` has no tensor form."""
    return bool(pa.types.is_integer(kind) or pa.types.is_boolean(kind)
            or pa.types.is_timestamp(kind) or pa.types.is_date(kind)
            or pa.types.is_duration(kind) or pa.types.is_decimal(kind))


def check_nulls(snapshot: Snapshot, columns: Sequence[str], policy: str) -> None:
    """Refuse ``snapshot`` under ``policy="refuse"`` when a selected column that needs a policy
    holds nulls in some data file (NOTE [ null policy ]).

    Raises:
        ValueError: ``policy`` is not one of ``NULL_POLICIES``.
        NullValuesError: names table, version, file, column, type and null count.
    """
    if policy not in NULL_POLICIES:
        raise ValueError(f"nulls must be one of {NULL_POLICIES}, got {policy!r}")
    if policy != "refuse":
        return
    risky = [c for c in columns if needs_policy(snapshot.schema.field(c).type)]
    if not risky or not snapshot.units:
        return
    by_file: dict[str, list[Unit]] = defaultdict(list)
    for unit in snapshot.units:
        by_file[unit.path].append(unit)
    reader = snapshot.row_reader()
    found: dict[str, dict[str, int]] = {}
    unknown = []
    for path, units in by_file.items():
        counts = known_null_counts(units, risky)
        if counts is None:
            unknown.append(path)
        else:
            found[path] = counts
    if unknown:  # files whose metadata has no null counts: their footers say
        with ThreadPoolExecutor(max_workers=min(_THREADS, len(unknown))) as pool:
            read = pool.map(lambda p: reader.null_counts(by_file[p], risky), unknown)
            found.update(zip(unknown, read, strict=True))
    for path in by_file:
        for column, count in found[path].items():
            if count:
                kind = snapshot.schema.field(column).type
                raise NullValuesError(
                    f"{snapshot.describe()}: data file {path} holds {count} null(s) in "
                    f"column {column!r} ({kind}), which torch cannot hold. Pass "
                    f"nulls='fill' (nulls as 0), nulls='mask' (0 plus a boolean column "
                    f"{column + MASK_SUFFIX!r}), output='arrow', or leave the column out.")
