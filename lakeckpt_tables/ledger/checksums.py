"""The row checksum of the ledger: one row in Python, or a whole table column by column.

A row's checksum is the SHA-256 (hex) of its canonical text: the JSON array (compact,
``ensure_ascii``) of its fields in schema order but the checksum itself, ``committed_at`` as
integer microseconds, floats as their ``repr`` string, and a column of
:data:`~lakeckpt_tables.ledger.schema.ADDED_COLUMNS` only when not null. :func:`row_checksum`
builds that text from one Python row; :func:`table_checksums` builds the same bytes for every
row of an Arrow table with one rendering per column (constant and repeated values rendered
once, the rest in Arrow), leaving only a join and a hash per row: a commit of 262,000 rows and
``verify`` of a long ledger do not build a Python value per field.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakeckpt_tables.ledger import schema as s

__all__ = ["row_checksum", "table_checksums"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# what json.dumps(ensure_ascii=True) leaves as it is: printable ASCII but '"' and '\'
_NEEDS_ESCAPE = r'[^\x20-\x21\x23-\x5b\x5d-\x7e]'


def row_checksum(row: Mapping[str, Any]) -> str:
    """SHA-256 (hex) over every field of a ledger row but the checksum itself (the module's
    canonical text), the same whichever backend wrote or read the row."""
    values = [_canonical(row.get(name)) for name in s.LEDGER_SCHEMA.names
              if name != s.CHECKSUM and (name not in s.ADDED_COLUMNS or row.get(name) is not None)]
    text = json.dumps(values, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def table_checksums(table: pa.Table) -> list[str]:
    """:func:`row_checksum` of every row of ``table``, byte for byte, computed by column.

    A column the table lacks counts as null (as ``row.get`` does); a table whose columns do
    not cast to the ledger's types is checksummed row by row.
    """
    if table.num_rows == 0:
        return []
    try:
        texts = _texts(table)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return [row_checksum(row) for row in table.to_pylist()]
    sha256 = hashlib.sha256
    return [sha256(text).hexdigest() for text in texts.to_pylist()]


def _texts(table: pa.Table) -> pa.Array:
    """Each row's canonical text (binary), from one rendering per column."""
    n = table.num_rows
    parts: list[pa.Array | str] = []
    for name in s.LEDGER_SCHEMA.names:
        if name == s.CHECKSUM:
            continue
        added = name in s.ADDED_COLUMNS
        if name not in table.column_names:
            if not added:
                parts.append("null")
            continue
        column = table.column(name)
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        rendered = _rendered(column.cast(s.LEDGER_SCHEMA.field(name).type), added)
        if rendered is not None:
            parts.append(rendered)
    # runs of constant parts become one literal; the rest is joined by Arrow, row by row
    merged: list[pa.Array | str] = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] = f"{merged[-1]},{part}"
        else:
            merged.append(part)
    if all(isinstance(part, str) for part in merged):
        return pa.array([f"[{','.join(map(str, merged))}]".encode()] * n, pa.binary())
    columns = [pa.scalar(part) if isinstance(part, str) else part for part in merged]
    joined = pc.binary_join_element_wise(*columns, ",", null_handling="skip")
    text = pc.binary_join_element_wise("[", joined, "]", "")
    return text.cast(pa.binary())


def _rendered(array: pa.Array, added: bool) -> pa.Array | str | None:
    """The canonical JSON of every value of ``array``: a literal when all are equal (None for
    an added column that is all null: it is left out), else a string array, null where an
    added column is null (the join skips it)."""
    nulls = array.null_count
    if nulls == len(array):
        return None if added else "null"
    kind = array.type
    if pa.types.is_timestamp(kind):
        array = array.cast(pa.int64())
        kind = array.type
    if pa.types.is_integer(kind):
        values = array.cast(pa.string())
    elif pa.types.is_string(kind):
        values = _json_strings(array)
    else:  # floats, lists: in checkpoint rows only (few), rendered in Python
        values = _in_python(array)
    if nulls and not added:
        values = values.fill_null("null")
    if values.null_count == 0:
        first = values[0].as_py()
        if pc.all(pc.equal(values, first)).as_py():
            return str(first)
    return values


def _json_strings(array: pa.Array) -> pa.Array:
    """``json.dumps`` of each string: quoted by Arrow; those needing an escape (quote,
    backslash, control or non-ASCII characters) by Python."""
    quoted = pc.binary_join_element_wise('"', array, '"', "")
    escape = pc.fill_null(pc.match_substring_regex(array, _NEEDS_ESCAPE), False)
    if not pc.any(escape).as_py():
        return quoted
    where = np.flatnonzero(escape.to_numpy(zero_copy_only=False))
    escaped = [json.dumps(v, ensure_ascii=True) for v in array.take(pa.array(where)).to_pylist()]
    return pc.replace_with_mask(quoted, escape, pa.array(escaped, pa.string()))


def _in_python(array: pa.Array) -> pa.Array:
    """The canonical JSON of each value that is not null, by Python; nulls stay null."""
    valid = array.is_valid()
    rendered = [json.dumps(_canonical(v), separators=(",", ":"), ensure_ascii=True)
                for v in array.filter(valid).to_pylist()]
    return pc.replace_with_mask(pa.nulls(len(array), pa.string()), valid,
                                pa.array(rendered, pa.string()))


def _canonical(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return (value - _EPOCH) // timedelta(microseconds=1)
    if isinstance(value, float):
        return repr(value)
    return value
