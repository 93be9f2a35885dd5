"""Schema evolution by property test: hypothesis draws a sequence of operations on a table
(pyiceberg: append, add, drop, rename, swap names, re-add a dropped name, promote a type, delete
rows, overwrite; delta-rs: append, merge-append, delete, overwrite, and with column mapping
rename, swap, drop, add and re-add committed to the log), then every version is read by the
library (latest and ``version=``; the readers, and ``LakeDataset`` in ``output="arrow"`` and
``"torch"``) and compared as a multiset of rows with the format's own reader: pyiceberg's
``scan().to_arrow()`` / ``scan(snapshot_id=S)``, deltalake's kernel ``scan()`` (which applies
column mapping; ``to_pyarrow_table()`` does not).

CI draws a few examples with a fixed seed (the ``ci`` profile in ``conftest.py``); run many
more, new ones each time, with::

    HYPOTHESIS_PROFILE=explore .venv/bin/python -m pytest -p no:cacheprovider -q \\
        tests/test_tables_evolution.py
"""

from __future__ import annotations

import decimal
import itertools
import json
import math
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from conformance import compare, read_all
from conftest import sql_catalog
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from lakeckpt_tables import DeltaSource, IcebergSource, LakeDataset
from lakeckpt_tables.errors import EmptySourceError

_CI = os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci"


def _settings(ci_examples: int) -> settings:
    """``ci_examples`` examples in CI (an Iceberg one costs ~2 s, a Delta one ~0.1 s); the
    explore profile's count otherwise."""
    return settings(
        max_examples=ci_examples if _CI else settings.default.max_examples, deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        # CI reports the failing example as drawn (its operations are in the assertion
        # message): shrinking examples of seconds each would outlast the time limit
        phases=[Phase.explicit, Phase.generate] if _CI else list(Phase))


_OPS = st.lists(st.tuples(st.sampled_from(
    ["append", "append", "add", "drop", "rename", "swap", "readd", "promote", "delete",
     "overwrite"]), st.integers(0, 1_000)), min_size=3, max_size=9)


def _value(kind: pa.DataType, row: int, salt: int) -> Any:
    """A deterministic value of ``kind`` for row ``row`` (every fifth one null)."""
    if (row + salt) % 5 == 0:
        return None
    if pa.types.is_integer(kind):
        return row * 10 + salt % 10
    if pa.types.is_floating(kind):
        return row + salt / 8
    if pa.types.is_decimal(kind):
        return decimal.Decimal(row * 100 + salt % 100) / 100
    return f"v{row}-{salt}"


def _batch(schema: pa.Schema, lo: int, hi: int) -> pa.Table:
    """Rows ``[lo, hi)`` of ``schema`` (``id`` the row id, the rest derived from it)."""
    columns = []
    for i, field in enumerate(schema):
        if field.name == "id":
            columns.append(pa.array(range(lo, hi), field.type))
        else:
            columns.append(pa.array([_value(field.type, r, i * 7 + len(field.name))
                                     for r in range(lo, hi)], field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _torch_rows(batches: list[dict[str, Any]], columns: list[str]) -> pa.Table:
    """Tensor batches (``nulls="mask"``) back to rows, for comparing with the reference."""
    out: dict[str, list[Any]] = {c: [] for c in columns}
    for batch in batches:
        for c in columns:
            values = batch[c]
            values = values.tolist() if hasattr(values, "tolist") else list(values)
            mask = batch.get(f"{c}__is_null")
            nulls = mask.tolist() if mask is not None else [False] * len(values)
            out[c].extend(None if n or (isinstance(v, float) and math.isnan(v)) else v
                          for v, n in zip(values, nulls, strict=True))
    return pa.table(out)


def _check_datasets(source: Any, version: int | None, reference: pa.Table) -> None:
    """``LakeDataset`` in both outputs reads ``reference``'s rows."""
    try:
        arrow = LakeDataset(source, version=version, output="arrow", batch_size=7,
                            shuffle=False)
    except EmptySourceError:
        assert reference.num_rows == 0
        return
    got = pa.Table.from_batches(list(arrow)) if reference.num_rows else reference
    assert not compare(got, reference, types=True), compare(got, reference, types=True)
    torch_columns = [f.name for f in reference.schema if not pa.types.is_decimal(f.type)]
    dataset = LakeDataset(source, version=version, columns=torch_columns, batch_size=7,
                          shuffle=False, nulls="mask")
    got = _torch_rows(list(dataset), torch_columns)
    expected = reference.select(torch_columns)
    for name in torch_columns:  # torch has no decimals; ints, floats, strings compare as is
        if pa.types.is_integer(expected.schema.field(name).type):
            expected = expected.set_column(expected.schema.get_field_index(name), name,
                                           expected.column(name).cast(pa.int64()))
    assert not compare(got, expected), compare(got, expected)


# ---------------------------------------------------------------------------------- Iceberg


class _IcebergModel:
    """Applies drawn operations to a pyiceberg table, remembering names that were dropped."""

    def __init__(self, root: Path) -> None:
        from pyiceberg.types import DecimalType, FloatType, IntegerType, StringType

        self.catalog = sql_catalog(root)
        self.catalog.create_namespace("ns")
        self.catalog.create_table("ns.t", schema=pa.schema([
            pa.field("id", pa.int64()), pa.field("a", pa.int32()), pa.field("s", pa.string())]))
        self.types = [IntegerType(), FloatType(), StringType(), DecimalType(9, 2)]
        self.next_row = 0
        self.dropped: list[str] = []
        self.names = itertools.count()  # new names never collide with a live or dropped one

    @property
    def table(self) -> Any:
        return self.catalog.load_table("ns.t")

    def others(self) -> list[str]:
        return [f.name for f in self.table.schema().fields if f.name != "id"]

    def apply(self, op: str, n: int) -> None:
        from pyiceberg.expressions import EqualTo, LessThan
        from pyiceberg.types import DecimalType, DoubleType, FloatType, IntegerType, LongType

        table, others = self.table, self.others()
        if op == "append":
            rows = 1 + n % 9
            table.append(_batch(table.schema().as_arrow(), self.next_row, self.next_row + rows))
            self.next_row += rows
        elif op == "overwrite":
            rows = 1 + n % 5
            table.overwrite(_batch(table.schema().as_arrow(), self.next_row,
                                   self.next_row + rows))
            self.next_row += rows
        elif op == "delete" and self.next_row:
            cut = n % self.next_row
            table.delete(LessThan("id", cut) if n % 2 else EqualTo("id", cut))
        elif op == "add":
            with table.update_schema() as update:
                update.add_column(f"c{next(self.names)}", self.types[n % len(self.types)])
        elif op == "drop" and others:
            name = others[n % len(others)]
            with table.update_schema() as update:
                update.delete_column(name)
            self.dropped.append(name)
        elif op == "readd" and self.dropped:
            name = self.dropped.pop(n % len(self.dropped))
            if name not in others:
                with table.update_schema() as update:
                    update.add_column(name, self.types[n % len(self.types)])
        elif op == "rename" and others:
            old = others[n % len(others)]
            with table.update_schema() as update:
                update.rename_column(old, f"r{next(self.names)}")
        elif op == "swap" and len(others) >= 2:
            a, b = others[n % len(others)], others[(n + 1) % len(others)]
            for old, new in ((a, "__swap"), (b, a), ("__swap", b)):
                with self.table.update_schema() as update:
                    update.rename_column(old, new)
        elif op == "promote":
            wider = {IntegerType(): LongType(), FloatType(): DoubleType()}
            for field in table.schema().fields:
                kind = field.field_type
                if kind in wider or (isinstance(kind, DecimalType) and kind.precision < 18):
                    new = wider.get(kind) or DecimalType(kind.precision + 3, kind.scale)
                    with table.update_schema() as update:
                        update.update_column(field.name, new)
                    return


@pytest.mark.timeout(120 if _CI else 3600)
@_settings(6)
@given(ops=_OPS)
def test_iceberg_every_snapshot_and_latest_read_as_pyiceberg_reads_them(
        ops: list[tuple[str, int]]) -> None:
    with tempfile.TemporaryDirectory() as root:
        model = _IcebergModel(Path(root))
        model.apply("append", 4)
        for op, n in ops:
            model.apply(op, n)
        table = model.table
        source = IcebergSource("ns.t", catalog=model.catalog)
        for snap in table.metadata.snapshots:
            reference = table.scan(snapshot_id=snap.snapshot_id).to_arrow()
            ours = read_all(source.snapshot(snap.snapshot_id))
            assert not compare(ours, reference, types=True), (
                snap.snapshot_id, ops, compare(ours, reference, types=True))
        reference = table.scan().to_arrow()
        ours = read_all(source.snapshot())
        assert not compare(ours, reference, types=True), (ops, compare(ours, reference,
                                                                       types=True))
        _check_datasets(source, None, reference)
        first = table.metadata.snapshots[0].snapshot_id
        _check_datasets(source, first, table.scan(snapshot_id=first).to_arrow())


# ------------------------------------------------------------------------------------ Delta


class _DeltaModel:
    """Applies drawn operations to a delta-rs table; with column mapping, schema changes are
    metadata commits written to the log as Spark writes them (delta-rs writes none)."""

    def __init__(self, root: Path, mode: str) -> None:
        from deltalake import write_deltalake

        self.path, self.mode = str(root / "t"), mode
        self.next_row = 0
        self.dropped: list[str] = []
        self.names = itertools.count()  # new names never collide with a live or dropped one
        config = {"delta.columnMapping.mode": mode} if mode != "none" else None
        schema = pa.schema([pa.field("id", pa.int64()), pa.field("a", pa.int32()),
                            pa.field("s", pa.string())])
        write_deltalake(self.path, _batch(schema, 0, 4), configuration=config)
        self.next_row = 4

    def schema(self) -> pa.Schema:
        from deltalake import DeltaTable

        arrow = pa.schema(DeltaTable(self.path).schema().to_arrow())
        return pa.schema([pa.field(f.name, pa.string() if pa.types.is_string_view(f.type)
                                   or pa.types.is_large_string(f.type) else f.type)
                          for f in arrow])

    def others(self) -> list[str]:
        return [n for n in self.schema().names if n != "id"]

    def _commit_schema(self, fields: list[dict[str, Any]], operation: str) -> None:
        """A metaData commit with ``fields`` as the schema (column mapping kept in step)."""
        from deltalake import DeltaTable

        dt = DeltaTable(self.path)
        meta = dt.metadata()
        config = dict(meta.configuration)
        ids = [f["metadata"]["delta.columnMapping.id"] for f in fields]
        config["delta.columnMapping.maxColumnId"] = str(max(
            [*ids, int(config.get("delta.columnMapping.maxColumnId", 0))]))
        action = {"id": meta.id, "format": {"provider": "parquet", "options": {}},
                  "schemaString": json.dumps({"type": "struct", "fields": fields}),
                  "partitionColumns": list(meta.partition_columns), "configuration": config,
                  "createdTime": meta.created_time}
        log = Path(self.path) / "_delta_log" / f"{dt.version() + 1:020d}.json"
        log.write_text(json.dumps({"commitInfo": {"timestamp": int(time.time() * 1000),
                                                  "operation": operation}}) + "\n"
                       + json.dumps({"metaData": action}) + "\n")

    def _fields(self) -> list[dict[str, Any]]:
        from deltalake import DeltaTable

        fields: list[dict[str, Any]] = json.loads(DeltaTable(self.path).schema().to_json())[
            "fields"]
        return fields

    def _new_field(self, name: str, n: int) -> dict[str, Any]:
        from deltalake import DeltaTable

        config = DeltaTable(self.path).metadata().configuration
        top = max([int(config.get("delta.columnMapping.maxColumnId", 0)),
                   *(f["metadata"]["delta.columnMapping.id"] for f in self._fields())])
        return {"name": name, "type": ["integer", "double", "string"][n % 3], "nullable": True,
                "metadata": {"delta.columnMapping.id": top + 1,
                             "delta.columnMapping.physicalName": f"col-{uuid.uuid4()}"}}

    def apply(self, op: str, n: int) -> None:
        from deltalake import DeltaTable, write_deltalake

        others, mapped = self.others(), self.mode != "none"
        if op in ("append", "overwrite") or (op == "add" and not mapped):
            rows = 1 + n % 7
            schema = self.schema()
            if op == "add":  # delta-rs adds a column by a merge append
                schema = schema.append(pa.field(f"c{next(self.names)}",
                                                [pa.int32(), pa.float64(), pa.string()][n % 3]))
            data = _batch(schema, self.next_row, self.next_row + rows)
            write_deltalake(self.path, data, mode="overwrite" if op == "overwrite" else "append",
                            schema_mode="merge" if op == "add" else None)
            self.next_row += rows
        elif op == "delete" and self.next_row:
            cut = n % self.next_row
            DeltaTable(self.path).delete(f"id < {cut}" if n % 2 else f"id = {cut}")
        elif not mapped:
            return  # delta-rs cannot rename, drop or retype; nothing to do
        elif op == "add":
            self._commit_schema([*self._fields(), self._new_field(f"c{next(self.names)}", n)],
                                "ADD COLUMNS")
        elif op == "drop" and others:
            name = others[n % len(others)]
            self._commit_schema([f for f in self._fields() if f["name"] != name], "DROP COLUMNS")
            self.dropped.append(name)
        elif op == "readd" and self.dropped:
            name = self.dropped.pop(n % len(self.dropped))
            if name not in others:  # a new field under an old name: null in older files
                self._commit_schema([*self._fields(), self._new_field(name, n)], "ADD COLUMNS")
        elif op in ("rename", "swap") and others:
            a = others[n % len(others)]
            b = others[(n + 1) % len(others)] if op == "swap" else f"r{next(self.names)}"
            names = {a: b, b: a}
            fields = [{**f, "name": names.get(f["name"], f["name"])} for f in self._fields()]
            self._commit_schema(fields, "RENAME COLUMN")


@pytest.mark.timeout(120 if _CI else 3600)
@_settings(15)
@given(mode=st.sampled_from(["none", "name", "id"]), ops=_OPS)
def test_delta_every_version_and_latest_read_as_the_kernel_reads_them(
        mode: str, ops: list[tuple[str, int]]) -> None:
    from deltalake import DeltaTable

    with tempfile.TemporaryDirectory() as root:
        model = _DeltaModel(Path(root), mode)
        for op, n in ops:
            model.apply(op, n)
        source = DeltaSource(model.path)
        latest = DeltaTable(model.path).version()
        for version in range(latest + 1):
            reference = pa.table(DeltaTable(model.path, version=version).scan())
            ours = read_all(source.snapshot(version))
            assert not compare(ours, reference, types=True), (
                version, mode, ops, compare(ours, reference, types=True))
        reference = pa.table(DeltaTable(model.path).scan())
        _check_datasets(source, None, reference)
        _check_datasets(source, 0, pa.table(DeltaTable(model.path, version=0).scan()))
