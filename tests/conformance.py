"""Read a table through lakeckpt-tables' sources and through the format's own reader, and
compare every row of every column as a multiset (imported by the conformance tests and by
``scripts/conformance_real_tables.py``)."""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from lakeckpt_tables.errors import LakeckptError
from lakeckpt_tables.sources.base import Snapshot


def read_all(snapshot: Snapshot, columns: Sequence[str] | None = None) -> pa.Table:
    """Every live row of ``snapshot`` through its RowGroupReader, in canonical unit order."""
    names = list(columns if columns is not None else snapshot.schema.names)
    reader = snapshot.row_reader()
    parts = [reader.read(u, names) for u in snapshot.units]
    if not parts:
        return pa.table({n: pa.array([], snapshot.schema.field(n).type) for n in names})
    return pa.concat_tables(parts)


def _key(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, dict):
        return tuple(sorted((k, _key(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_key(v) for v in value)
    return value


def rows_multiset(table: pa.Table, columns: Sequence[str]) -> collections.Counter[Any]:
    cols = [table.column(c).to_pylist() for c in columns]
    return collections.Counter(repr(tuple(_key(v) for v in row)) for row in zip(*cols,
                                                                                   strict=True))


KNOWN_REFERENCE_DEFECTS = {
    "table_with_edge_timestamps": "deltalake reads Spark's INT96 as nanoseconds and wraps "
    "9999-12-31 to 1816 (scan) or fails (to_pyarrow_table); tested with explicit values",
}
"""Tables the reference reads wrongly: counted apart, each checked by a test of its own."""


def delta_references(path: str, version: int) -> list[pa.Table]:
    """deltalake's reading of ``version`` by its kernel ``scan()``, the Delta reference: it
    applies column mapping and deletion vectors (``to_pyarrow_table()`` reads column-mapped
    files as nulls, so it is no reference). One table, in a list; raises when deltalake
    cannot read the version."""
    from deltalake import DeltaTable

    return [pa.table(DeltaTable(path, version=version).scan())]


def _family(kind: pa.DataType) -> str:
    """A type up to its Arrow encoding (string / large_string / string_view are one)."""
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(
            kind):
        return "string"
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_binary_view(
            kind):
        return "binary"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_list_view(kind):
        return f"list<{_family(kind.value_type)}>"
    return str(kind)


def compare(ours: pa.Table, reference: pa.Table, *, types: bool = False) -> str:
    """"" when both hold the same rows of the same columns (and, with ``types``, of the same
    types up to their Arrow encoding); what differs otherwise."""
    if sorted(ours.column_names) != sorted(reference.column_names):
        return f"columns differ: ours {ours.column_names}, reference {reference.column_names}"
    if types:
        differ = [(f.name, str(f.type), str(reference.schema.field(f.name).type))
                  for f in ours.schema
                  if _family(f.type) != _family(reference.schema.field(f.name).type)]
        if differ:
            return f"types differ (column, ours, reference): {differ}"
    columns = sorted(reference.column_names)
    a, b = rows_multiset(ours, columns), rows_multiset(reference, columns)
    if a == b:
        return ""
    extra, missing = a - b, b - a
    return (f"{ours.num_rows} rows vs {reference.num_rows}; {sum(extra.values())} extra "
            f"(e.g. {list(extra)[:2]}), {sum(missing.values())} missing "
            f"(e.g. {list(missing)[:2]})")


def classify_delta(path: str, version: int) -> tuple[str, str]:
    """One of "right", "refused" (named error; deltalake reads it), "both-refuse" (named
    error; deltalake fails too), "reference-fails" (we read it, deltalake does not),
    "reference-defect" (see KNOWN_REFERENCE_DEFECTS), "wrong", "unwrapped"; and a detail."""
    from lakeckpt_tables.sources.delta import DeltaSource

    try:
        references = delta_references(path, version)
        reference_error: BaseException | None = None
    except BaseException as exc:
        references, reference_error = [], exc
    try:
        ours = read_all(DeltaSource(path).snapshot(version))
    except LakeckptError as exc:
        kind = "both-refuse" if reference_error is not None else "refused"
        return kind, f"{type(exc).__name__}: {exc}"
    except BaseException as exc:
        return "unwrapped", f"{type(exc).__name__}: {exc}"
    if reference_error is not None:
        return "reference-fails", f"deltalake: {type(reference_error).__name__}: {reference_error}"
    problems = [compare(ours, reference) for reference in references]
    if all(problems):
        for name, why in KNOWN_REFERENCE_DEFECTS.items():
            if path.rstrip("/").endswith(name):
                return "reference-defect", why
        return "wrong", problems[0]
    return "right", f"{ours.num_rows} rows"
