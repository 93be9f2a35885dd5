"""A small reader of Avro object container files: what an Iceberg manifest list and manifest are.

``lakeckpt progress`` on an Iceberg ledger must answer in about a second, and importing
pyiceberg's table model (pydantic, pyparsing, SQLAlchemy for a SQL catalog) costs about half of
that (issue 23). This reader decodes any container file generically from the schema in its
header (codecs ``null`` and ``deflate``); anything it does not know raises :class:`AvroError`
and the caller reads the table with pyiceberg instead.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable
from typing import Any

__all__ = ["AvroError", "read_container"]

_MAGIC = b"Obj\x01"

Decoder = Callable[[bytes, int], tuple[Any, int]]


class AvroError(ValueError):
    """Not an Avro container file this reader decodes (the caller falls back to pyiceberg)."""


def read_container(data: bytes) -> list[dict[str, Any]]:
    """The records of an Avro object container file, as dicts (unions as their branch's value).

    Raises:
        AvroError: not a container file, a codec or type this reader does not know, or
            truncated.
    """
    if data[:4] != _MAGIC:
        raise AvroError("not an Avro container file")
    try:
        meta, pos = _map(_bytes)(data, 4)
        sync, pos = data[pos:pos + 16], pos + 16
        decode = _compile(json.loads(meta["avro.schema"]), {})
        codec = meta.get("avro.codec", b"null")
        out = []
        while pos < len(data):
            count, pos = _long(data, pos)
            size, pos = _long(data, pos)
            block, pos = data[pos:pos + size], pos + size
            if len(block) != size or data[pos:pos + 16] != sync:
                raise AvroError("a block is truncated or its sync marker is wrong")
            pos += 16
            if codec == b"deflate":
                block = zlib.decompress(block, -15)
            elif codec != b"null":
                raise AvroError(f"codec {codec!r} is not read here")
            at = 0
            for _ in range(count):
                record, at = decode(block, at)
                out.append(record)
            if at != len(block):
                raise AvroError("a block holds more bytes than its records")
        return out
    except (KeyError, IndexError, TypeError, UnicodeDecodeError, zlib.error,
            json.JSONDecodeError, struct.error, RecursionError) as e:
        raise AvroError(f"cannot decode: {e!r}") from e


def _long(buf: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint (Avro int and long)."""
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def _bytes(buf: bytes, pos: int) -> tuple[bytes, int]:
    n, pos = _long(buf, pos)
    if n < 0 or pos + n > len(buf):
        raise AvroError("a byte string runs past its block")
    return buf[pos:pos + n], pos + n


def _string(buf: bytes, pos: int) -> tuple[str, int]:
    raw, pos = _bytes(buf, pos)
    return raw.decode(), pos


def _fixed(size: int, unpack: Callable[[bytes], tuple[Any, ...]] | None = None) -> Decoder:
    def decode(buf: bytes, pos: int) -> tuple[Any, int]:
        if pos + size > len(buf):
            raise AvroError("a fixed value runs past its block")
        raw = buf[pos:pos + size]
        return (raw if unpack is None else unpack(raw)[0]), pos + size
    return decode


_PRIMITIVES: dict[str, Decoder] = {
    "null": lambda buf, pos: (None, pos),
    "boolean": lambda buf, pos: (buf[pos] != 0, pos + 1),
    "int": _long, "long": _long,
    "float": _fixed(4, struct.Struct("<f").unpack),
    "double": _fixed(8, struct.Struct("<d").unpack),
    "bytes": _bytes, "string": _string,
}


def _blocks(item: Decoder, keyed: bool) -> Decoder:
    """An array (or, ``keyed``, a map): blocks of items until a block of count 0."""
    def decode(buf: bytes, pos: int) -> tuple[Any, int]:
        items: list[Any] = []
        while True:
            count, pos = _long(buf, pos)
            if count == 0:
                return (dict(items) if keyed else items), pos
            if count < 0:  # a block that says its size in bytes too
                count = -count
                _, pos = _long(buf, pos)
            for _ in range(count):
                if keyed:
                    key, pos = _string(buf, pos)
                    value, pos = item(buf, pos)
                    items.append((key, value))
                else:
                    value, pos = item(buf, pos)
                    items.append(value)
    return decode


def _map(values: Decoder) -> Decoder:
    return _blocks(values, keyed=True)


def _compile(schema: Any, named: dict[str, Decoder]) -> Decoder:
    """The decoder of a schema; ``named`` holds the named types defined so far."""
    if isinstance(schema, list):
        branches = [_compile(branch, named) for branch in schema]

        def union(buf: bytes, pos: int) -> tuple[Any, int]:
            index, pos = _long(buf, pos)
            if not 0 <= index < len(branches):
                raise AvroError(f"union branch {index} of {len(branches)}")
            return branches[index](buf, pos)
        return union
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema]
        if schema in named:
            return named[schema]
        raise AvroError(f"unknown type {schema!r}")
    kind = schema["type"]
    if kind == "record":
        fields: list[tuple[str, Decoder]] = []

        def record(buf: bytes, pos: int) -> tuple[Any, int]:
            out = {}
            for name, decode in fields:
                out[name], pos = decode(buf, pos)
            return out, pos
        _name(schema, record, named)  # before its fields: a field may refer to it
        fields.extend((f["name"], _compile(f["type"], named)) for f in schema["fields"])
        return record
    if kind == "array":
        return _blocks(_compile(schema["items"], named), keyed=False)
    if kind == "map":
        return _map(_compile(schema["values"], named))
    if kind == "fixed":
        return _name(schema, _fixed(int(schema["size"])), named)
    if kind == "enum":
        symbols = list(schema["symbols"])

        def enum(buf: bytes, pos: int) -> tuple[Any, int]:
            index, pos = _long(buf, pos)
            return symbols[index], pos
        return _name(schema, enum, named)
    return _compile(kind, named)  # {"type": "long", "logicalType": ...}: the type underneath


def _name(schema: dict[str, Any], decode: Decoder, named: dict[str, Decoder]) -> Decoder:
    name = schema.get("name")
    if name:
        named[name] = decode
        named[name.rsplit(".", 1)[-1]] = decode
        if schema.get("namespace"):
            named[f"{schema['namespace']}.{name}"] = decode
    return decode
