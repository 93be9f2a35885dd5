"""The column-wise checksum of a ledger table is byte for byte the row checksum, which is
pinned: a ledger written before keeps verifying."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.ledger.checksums import row_checksum, table_checksums

_INT_RANGES = {pa.int32(): (-(2**31), 2**31 - 1), pa.int64(): (-(2**63), 2**63 - 1)}
_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12) | \
    st.sampled_from(["", "s3://b/p/part-0.parquet", 'q"uote', "back\\slash", "\x7f\n\t",
                     "del\x7f", "~ !#[]", "é☃𝄞"])


def _values(field: pa.Field) -> st.SearchStrategy[object]:
    kind = field.type
    if kind in _INT_RANGES:
        lo, hi = _INT_RANGES[kind]
        value: st.SearchStrategy[object] = st.integers(lo, hi) | st.integers(-3, 3)
    elif pa.types.is_timestamp(kind):
        value = st.datetimes(datetime(1900, 1, 1), datetime(2200, 1, 1),
                             timezones=st.just(UTC))
    elif pa.types.is_floating(kind):
        value = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.1, 1e300])
    elif pa.types.is_list(kind):
        value = st.lists(st.none() | _text, max_size=3)
    else:
        value = _text
    return value if not field.nullable else st.none() | value


_FIELDS = [f for f in s.LEDGER_SCHEMA if f.name != s.CHECKSUM]
# a few rows drawn from a few distinct values per column: constant, repeated and distinct
_rows = st.lists(st.fixed_dictionaries({f.name: _values(f) for f in _FIELDS}),
                 min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(rows=_rows, repeat=st.integers(1, 3), old_schema=st.booleans())
def test_table_checksums_are_the_row_checksums(rows: list[dict[str, object]], repeat: int,
                                               old_schema: bool) -> None:
    table = pa.Table.from_pylist(rows * repeat, schema=s.LEDGER_SCHEMA)
    if old_schema:  # a ledger from before the added columns
        table = table.drop_columns(list(s.ADDED_COLUMNS))
    assert table_checksums(table) == [row_checksum(r) for r in table.to_pylist()]


def test_row_checksum_is_pinned() -> None:
    at = datetime(2026, 11, 25, 20, 0, 0, 123456, tzinfo=UTC)
    consumption = {s.RECORD: s.RECORD_CONSUMPTION, s.RUN_ID: "run", s.CHECKPOINT_ID: "c1",
                   s.STEP: 10, s.COMMITTED_AT: at, s.OWNER: "7", s.RANK: 3, s.WORKER: 1,
                   s.SEGMENT: 0, s.EPOCH: 2, s.FILE: "s3://b/é.parquet", s.ROW_GROUP: 4,
                   s.ROW_START: 0, s.ROW_END: 4096, s.ROWS: 17}
    checkpoint = {s.RECORD: s.RECORD_CHECKPOINT, s.RUN_ID: "run", s.CHECKPOINT_ID: "c1",
                  s.STEP: 10, s.COMMITTED_AT: at, s.TAGS: ["best", "ü"], s.WALL_TIME_S: 0.1,
                  s.WORLD_SIZE: 2, s.MANIFEST: '{"a": 1}'}
    table = pa.Table.from_pylist([consumption, {**consumption, s.TOKENS: 99}, checkpoint],
                                 schema=s.LEDGER_SCHEMA)
    expected = ["f481e6a16fc019c418cf16f1692bdd106f8c58285bc0f44d5294615f2b10b310",
                "d90711bb9354fd99133af87ca0fd6b6eff54c11d634e179e8b97cded1572aa4e",
                "dce43259800c51b7578b622185f2967498d2d35fb0ee82afd39d5f6266ab2973"]
    assert [row_checksum(r) for r in table.to_pylist()] == expected
    assert table_checksums(table) == expected


@pytest.mark.parametrize("kind", [pa.large_string(), pa.string()])
def test_table_checksums_take_other_string_types(kind: pa.DataType) -> None:
    table = pa.table({s.RECORD: pa.array(["event", "event"], kind),
                      s.RUN_ID: pa.array(["r", "é"], kind), s.STEP: [-1, -1]})
    assert table_checksums(table) == [row_checksum(r) for r in table.to_pylist()]
