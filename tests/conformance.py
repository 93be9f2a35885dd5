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
    """deltalake's own readings of ``version``: the kernel scan (which applies column mapping)
    and ``to_pyarrow_table`` (which fails on some INT96); at least one, or raises."""
    from deltalake import DeltaTable

    dt = DeltaTable(path, version=version)
    out, error = [], None
    for read in (lambda: pa.table(dt.scan()), dt.to_pyarrow_table):
        try:
            out.append(read())
        except Exception as exc:
            error = exc
    if not out and error is not None:
        raise error
    return out


def compare(ours: pa.Table, reference: pa.Table) -> str:
    """"" when both hold the same rows of the same columns; what differs otherwise."""
    if sorted(ours.column_names) != sorted(reference.column_names):
        return f"columns differ: ours {ours.column_names}, reference {reference.column_names}"
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
