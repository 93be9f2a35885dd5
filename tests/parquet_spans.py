"""The byte layout of a Parquet file, field by field: where a flipped bit lands.

A Parquet file is ``PAR1``, column chunks (pages: a Thrift page header, then the page body),
the footer (one Thrift struct: schema, row groups, key-value metadata), the footer's length
and ``PAR1``. Headers and footer use Thrift's compact protocol, walked here without a Thrift
library into spans: a field's header byte(s), a length, a value.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import pyarrow.parquet as pq


class Span(NamedTuple):
    start: int
    end: int
    key: str  # what the bytes are: a field path with list indices left out, and a role


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _struct(data: bytes, i: int, path: str, out: list[Span]) -> int:
    """Spans of the compact-protocol struct at ``data[i:]``; returns its end."""
    field = 0
    while True:
        start, header = i, data[i]
        i += 1
        if header == 0:
            out.append(Span(start, i, f"{path}.stop"))
            return i
        if header >> 4:
            field += header >> 4
        else:
            zigzag, i = _varint(data, i)
            field = (zigzag >> 1) ^ -(zigzag & 1)
        out.append(Span(start, i, f"{path}.{field}:header"))
        i = _value(data, i, header & 0x0F, f"{path}.{field}", out)


def _value(data: bytes, i: int, kind: int, path: str, out: list[Span]) -> int:
    start = i
    if kind in (1, 2):  # a bool lives in the field header
        return i
    if kind == 3:
        i += 1
    elif kind in (4, 5, 6):
        _, i = _varint(data, i)
    elif kind == 7:
        i += 8
    elif kind == 8:
        length, i = _varint(data, i)
        out.append(Span(start, i, f"{path}:length"))
        start, i = i, i + length
    elif kind in (9, 10):
        size, i = data[i] >> 4, i + 1
        if size == 15:
            size, i = _varint(data, i)
        out.append(Span(start, i, f"{path}:length"))
        for _ in range(size):
            i = _value(data, i, data[start] & 0x0F, f"{path}[]", out)
        return i
    elif kind == 12:
        return _struct(data, i, path, out)
    else:
        raise ValueError(f"Thrift compact type {kind} at byte {start}: not a Parquet header")
    out.append(Span(start, i, f"{path}:value"))
    return i


def spans(path: str) -> list[Span]:
    """Every byte of a Parquet file of one row group, as spans, in file order; but column
    chunks with the same bytes as an earlier one (a flip there does what it does in the
    first: page headers carry no offsets). Each page body is one span."""
    with open(path, "rb") as f:
        data = f.read()
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    out = [Span(0, 4, "magic")]
    group = pq.ParquetFile(path).metadata.row_group(0)
    seen: set[bytes] = set()
    for c in range(group.num_columns):
        column = group.column(c)
        i = column.dictionary_page_offset or column.data_page_offset
        end = i + column.total_compressed_size
        if data[i:end] in seen:
            continue
        seen.add(data[i:end])
        while i < end:
            header: list[Span] = []
            i = _struct(data, i, "page", header)
            (size,) = [s for s in header if s.key == "page.3:value"]  # compressed_page_size
            zigzag, _ = _varint(data, size.start)
            out += [*header, Span(i, i + (zigzag >> 1), f"page body of column {c}")]
            i += zigzag >> 1
    _struct(data, footer, "footer", out)
    return [*out, Span(len(data) - 8, len(data) - 4, "footer length"),
            Span(len(data) - 4, len(data), "magic")]


def sample(data: bytes, layout: list[Span], *, per_kind: int = 4, short: int = 2,
           long: int = 16, stride: int = 11) -> list[int]:
    """Offsets that hit every kind of span: all bytes of the first ``per_kind`` spans of each
    key, told apart by their bytes when they are at most ``short`` long (a type, an encoding,
    a repetition, a small size); of a span longer than ``long`` bytes, its first ``long``
    bytes and every ``stride``-th."""
    taken: Counter[tuple[str, bytes]] = Counter()
    offsets: set[int] = set()
    for span in layout:
        kind = (span.key, data[span.start:span.end] if span.end - span.start <= short else b"")
        if taken[kind] >= per_kind:
            continue
        taken[kind] += 1
        if span.end - span.start <= long:
            offsets.update(range(span.start, span.end))
        else:
            offsets.update(range(span.start, span.start + long))
            offsets.update(range(span.start, span.end, stride))
    return sorted(offsets)
