"""Arrow values as the table's logical types: constants, nulls, casts with a column's name.

NOTE [ one timestamp unit ]: every timestamp is cast to microseconds (naive stays naive,
tz-aware stays tz-aware), dates stay days; the torch conversion turns both into integers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["PhysicalNames", "conform", "constant", "parquet_field_id", "parse_partition_value"]

PhysicalNames = Mapping[str, Any]
"""Logical field name -> (physical name, PhysicalNames of its children) for column mapping,
or, in mode ``id``, (physical name, children, field id): a struct's fields are then matched by
Parquet field id where the file has them (NOTE [ column mapping id ] in ``sources/delta.py``).
A list's children are its element's; a map's are ``{"key": (...), "value": (...)}``."""

_PARQUET_FIELD_ID = b"PARQUET:field_id"


def parquet_field_id(field: pa.Field) -> int | None:
    """The Parquet field id pyarrow read into ``field``'s metadata; None when it has none."""
    raw = (field.metadata or {}).get(_PARQUET_FIELD_ID)
    if raw is None or not raw.strip().lstrip(b"-").isdigit():
        return None
    return int(raw)


def constant(value: Any, kind: pa.DataType, rows: int) -> pa.Array:
    """``rows`` copies of ``value`` (a partition value) as type ``kind``; nulls when None."""
    if value is None:
        return pa.nulls(rows, kind)
    return pa.repeat(pa.scalar(value, kind), rows)


def conform(array: pa.Array | pa.ChunkedArray, field: pa.Field,
            names: PhysicalNames | None = None) -> pa.Array | pa.ChunkedArray:
    """``array`` as read from a file, as ``field``'s type; nested physical names (column
    mapping) renamed to the logical ones, timestamps in microseconds.

    Raises:
        pyarrow.ArrowException: the values cannot be cast (callers name file and column).
    """
    if isinstance(array, pa.ChunkedArray):
        return pa.chunked_array([conform(c, field, names) for c in array.chunks], field.type)
    kind = field.type
    if names and pa.types.is_struct(kind):
        return _struct(array, kind, names)
    if names and (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
        values = conform(array.flatten(), kind.value_field, names)
        cls = pa.LargeListArray if pa.types.is_large_list(kind) else pa.ListArray
        return cls.from_arrays(_offsets(array), values, type=kind, mask=array.is_null())
    if names and pa.types.is_map(kind):
        keys = conform(array.keys, kind.key_field, names.get("key", (None, None))[1])
        items = conform(array.items, kind.item_field, names.get("value", (None, None))[1])
        return pa.MapArray.from_arrays(_offsets(array), keys, items, type=kind,
                                       mask=array.is_null())
    if array.type == kind:
        return array
    if pa.types.is_timestamp(kind) and pa.types.is_timestamp(array.type):
        return pc.cast(array, kind, safe=False)  # ns -> us truncates, as the formats' readers do
    return pc.cast(array, kind)


def _offsets(array: pa.Array) -> pa.Array:
    offsets = array.offsets
    return pc.subtract(offsets, offsets[0]) if len(offsets) and offsets[0].as_py() else offsets


def _struct(array: pa.Array, kind: pa.StructType, names: PhysicalNames) -> pa.Array:
    flat = array.flatten()
    present = {array.type.field(i).name: c for i, c in enumerate(flat)}
    by_id = {fid: c for i, c in enumerate(flat)
             if (fid := parquet_field_id(array.type.field(i))) is not None}
    children = []
    for i in range(kind.num_fields):
        child = kind.field(i)
        physical, nested, *field_id = names.get(child.name, (child.name, None))
        # mode id: by field id when the file has ids, by physical name otherwise (as at the
        # top level: a file without ids is read as deltalake reads it)
        found = (by_id.get(field_id[0], present.get(physical)) if field_id and by_id
                 else present.get(physical))
        if found is not None:
            children.append(conform(found, child, nested))
        else:
            children.append(pa.nulls(len(array), child.type))
    return pa.StructArray.from_arrays(children, fields=list(kind), mask=array.is_null())


def parse_partition_value(text: str | None, kind: pa.DataType) -> Any:
    """A Delta ``partitionValues`` string as a Python value of ``kind`` (None for null)."""
    if text is None or (text == "" and not pa.types.is_string(kind)
                        and not pa.types.is_large_string(kind)):
        return None
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or kind == pa.string_view():
        return text
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return text.encode()
    if pa.types.is_boolean(kind):
        return text.strip().lower() == "true"
    if pa.types.is_timestamp(kind):
        cleaned = text.strip().replace("T", " ").rstrip("Z")
        naive = pc.cast(pa.array([cleaned]), pa.timestamp("us"))
        return pc.cast(naive, kind)[0].as_py()
    return pc.cast(pa.array([text]), kind)[0].as_py()
