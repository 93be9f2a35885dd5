"""Row filters decided when the snapshot is pinned, so the plan still counts every row.

NOTE [ row filters ]
Lockstep batch counts and exact resume need each unit's row count when the plan is made, so a
filter (a ``pyarrow.compute`` expression over the table's logical columns) is evaluated up
front, in the main process, into per-file row selections carried like deletion vectors:
- a file whose partition values decide the filter (it uses only partition columns) is kept
  or dropped whole without being read;
- otherwise the filter's columns (only those) of every row group are read once, in parallel,
  and the rows it rejects join the file's deletes.
Cost: one read of the filter's columns over the snapshot at construction (partition-only
filters cost nothing). The filter's text is part of the reader's configuration: a state taken
under another filter is refused. Follow mode and ``refresh="epoch"`` pin versions later, in
workers, and take no filter.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from lakeckpt_tables.errors import FilterError
from lakeckpt_tables.sources._deletes import Deletes
from lakeckpt_tables.sources.base import DataFile, RowGroupReader, Snapshot, units_from_files
from lakeckpt_tables.types import Unit

__all__ = ["filter_columns", "filtered"]

_THREADS = 8
_MISSING_FIELD = re.compile(r"No match for FieldRef\.Name\((.*?)\) in ")


def filter_columns(schema: pa.Schema, expression: pc.Expression, where: str) -> list[str]:
    """The columns ``expression`` reads (found by binding it to ever larger empty tables).

    Raises:
        FilterError: it names a column the table lacks, or does not evaluate to booleans.
    """
    used: list[str] = []
    for _ in range(len(schema) + 1):
        empty = pa.table({c: pa.array([], schema.field(c).type) for c in used})
        try:
            empty.filter(expression)
            return used
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            match = _MISSING_FIELD.search(str(exc))
            name = match.group(1) if match else None
            if name is None or name in used:
                raise FilterError(f"{where}: filter {expression} cannot be evaluated: "
                                  f"{type(exc).__name__}: {exc}") from exc
            if name not in schema.names:
                raise FilterError(f"{where}: filter {expression} names column {name!r}, which "
                                  f"the table lacks; its columns are {schema.names}") from exc
            used.append(name)
    raise FilterError(f"{where}: filter {expression} cannot be evaluated")


def filtered(snapshot: Snapshot, expression: pc.Expression) -> Snapshot:
    """``snapshot`` with only the rows ``expression`` keeps (NOTE [ row filters ]).

    Raises:
        FilterError: the filter cannot be evaluated on this table.
        PinnedFileMissingError, SourceFileChangedError, DataFileError: reading a file failed.
    """
    where = snapshot.describe()
    columns = filter_columns(snapshot.schema, expression, where)
    by_file: dict[str, list[Unit]] = defaultdict(list)
    for unit in snapshot.units:
        by_file[unit.path].append(unit)
    reader = snapshot.row_reader()

    def decide(units: list[Unit]) -> DataFile | None:
        data_file: DataFile = units[0].file
        constant = _decided_by_partition(data_file, columns, snapshot.schema, expression)
        if constant is not None:
            return data_file if constant else None
        rejected = []
        start = 0
        for unit in _all_row_groups(units, reader):
            table = reader._logical(reader._handle(unit.path, data_file, keep=False), unit,
                                    data_file, columns)
            keep = _evaluate(table, expression, where)
            rejected.append(np.flatnonzero(~keep) + start)
            start += table.num_rows
        deleted = [data_file.deletes.positions()] if data_file.deletes is not None else []
        deletes = Deletes.from_positions(np.concatenate(deleted + rejected))
        return dataclasses.replace(data_file, deletes=deletes, row_group_rows=None)

    with ThreadPoolExecutor(max_workers=max(1, min(_THREADS, len(by_file)))) as pool:
        kept = [f for f in pool.map(decide, by_file.values()) if f is not None]
    units, in_files = units_from_files(snapshot.identity, snapshot.version, kept,
                                       kind="files" if snapshot.whole_files else "row_groups")
    return dataclasses.replace(snapshot, units=units, file_columns={
        f.path: snapshot.file_columns[f.path] if f.path in snapshot.file_columns
        else in_files[f.path] for f in kept})


def _all_row_groups(units: list[Unit], reader: RowGroupReader) -> list[Unit]:
    """Every row group of the file in order (units list only those with live rows; a whole
    file's are in its footer, NOTE [ lazy footers ])."""
    data_file: DataFile = units[0].file
    sizes = data_file.row_group_rows
    if sizes is None:
        sizes = reader._handle(units[0].path, data_file, keep=False).row_group_rows
    return [Unit(units[0].path, i, n, data_file) for i, n in enumerate(sizes)]


def _evaluate(table: pa.Table, expression: pc.Expression, where: str) -> Any:
    try:
        mask = pads.dataset(table).to_table(columns={"keep": expression}).column("keep")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise FilterError(f"{where}: filter {expression} cannot be evaluated: "
                          f"{type(exc).__name__}: {exc}") from exc
    return mask.fill_null(False).to_numpy(zero_copy_only=False).astype(bool)


def _decided_by_partition(data_file: DataFile, columns: list[str], schema: pa.Schema,
                          expression: pc.Expression) -> bool | None:
    values = dict(data_file.partition)
    if not columns or any(c not in values for c in columns):
        return None
    one = pa.table({c: pa.array([values[c]], schema.field(c).type) for c in columns})
    return bool(one.filter(expression).num_rows)
