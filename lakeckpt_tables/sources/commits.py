"""One commit of a source, classified for follow mode: what it did to the rows.

NOTE [ commit kinds ]
- ``append``: adds rows and removes none (Delta adds with ``dataChange=true`` and no removes
  with it; Iceberg ``append``). Its added files are the next segment's data.
- ``rearrange``: changes no rows (Delta ``dataChange=false`` everywhere, e.g. OPTIMIZE;
  Iceberg ``replace``; metadata-only commits). Skipped: reading its files would repeat rows.
- ``change``: removes or rewrites rows (DELETE, UPDATE, MERGE, overwrite). A follower cannot
  un-train rows, so the policy decides: ``on_change="fail"`` (default) or ``"skip"`` (the
  commit's added rows are not read, like Spark's ``skipChangeCommits``).
- ``schema``: changes the type of a selected column or drops it. Always fails.

Commits are read without deltalake (its runtime is not fork-safe; DataLoader workers follow
tables): a Delta commit is the JSON file ``_delta_log/<version>.json``, read through the
table's :class:`~lakeckpt_tables.io.Storage` (the source's storage options).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import unquote

from lakeckpt_tables.io import Storage
from lakeckpt_tables.sources.datafile import DataFile

__all__ = ["Commit", "CommitKind", "column_change", "read_delta_commit"]

CommitKind = Literal["append", "rearrange", "change", "schema"]


@dataclass(frozen=True)
class Commit:
    """One commit after the pinned version.

    Attributes:
        version: Delta version or Iceberg snapshot id.
        kind: see NOTE [ commit kinds ].
        operation: the operation the writer recorded (WRITE, OPTIMIZE, DELETE, append...).
        files: files with rows added (appends only; empty otherwise).
        detail: why the commit is not an append, for errors and the ledger.
    """

    version: int
    kind: CommitKind
    operation: str
    files: tuple[DataFile, ...] = field(default=())
    detail: str = ""

    @property
    def rows(self) -> int:
        return sum(f.rows or 0 for f in self.files)


AddFile = Callable[[str, Mapping[str, Any]], DataFile]
"""Turns a Delta ``add`` action into a DataFile carrying the facts its reader needs."""


def read_delta_commit(root: str, version: int, columns: list[str],
                      types: dict[str, str], storage: Storage | None = None, *,
                      add_file: AddFile | None = None,
                      partition_columns: Sequence[str] = ()) -> Commit | None:
    """Delta commit ``version`` of the table at ``root``; None when it is not committed yet.

    Args:
        root: table root (local path or URI).
        version: commit version.
        columns: the columns the reader reads (schema changes to others are harmless).
        types: their Delta type strings at the pinned version, to detect type changes.
        storage: the table's store (rooted anywhere); the environment's when None.

    Raises:
        StorageError: the store failed (not: the commit is absent).
        add_file: builds appended files (partition values...); plain DataFiles when None.
        partition_columns: the pinned partition columns (another set is a schema change).
    """
    store = storage if storage is not None else Storage(root)
    try:
        text = store.read_bytes(f"{root}/_delta_log/{version:020d}.json").decode()
    except FileNotFoundError:
        return None
    actions = [json.loads(line) for line in text.splitlines() if line.strip()]
    return _classify(root, version, actions, columns, types, add_file or _data_file,
                     partition_columns)


def _classify(root: str, version: int, actions: list[dict[str, Any]], columns: list[str],
              types: dict[str, str], add_file: AddFile,
              partition_columns: Sequence[str]) -> Commit:
    info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    operation = str(info.get("operation", "UNKNOWN"))
    schema_problem = _schema_problem(actions, columns, types, partition_columns)
    if schema_problem:
        return Commit(version, "schema", operation, detail=schema_problem)
    adds = [a["add"] for a in actions if "add" in a and a["add"].get("dataChange", True)]
    removes = [a["remove"] for a in actions
               if "remove" in a and a["remove"].get("dataChange", True)]
    if removes:
        return Commit(version, "change", operation,
                      detail=f"{operation} removed {len(removes)} file(s) with changed rows")
    if not adds:
        return Commit(version, "rearrange", operation,
                      detail=f"{operation} changed no rows (dataChange=false)")
    if any(a.get("deletionVector") for a in adds):
        return Commit(version, "change", operation, detail="adds files with deletion vectors")
    return Commit(version, "append", operation, tuple(add_file(root, a) for a in adds))


def _data_file(root: str, add: Mapping[str, Any]) -> DataFile:
    rel = add["path"]
    path = rel if "://" in rel else f"{root}/{unquote(rel)}"
    stats = json.loads(add["stats"]) if add.get("stats") else {}
    rows = stats.get("numRecords")
    return DataFile(path, add.get("size"), None if rows is None else int(rows))


def _schema_problem(actions: list[dict[str, Any]], columns: list[str],
                    types: dict[str, str], partition_columns: Sequence[str] = ()) -> str:
    meta = next((a["metaData"] for a in actions if "metaData" in a), None)
    if meta is None:
        return ""
    if sorted(meta.get("partitionColumns") or []) != sorted(partition_columns):
        return (f"the partition columns changed from {sorted(partition_columns)} to "
                f"{meta.get('partitionColumns') or []}")
    fields = {f["name"]: json.dumps(f["type"]) for f in json.loads(meta["schemaString"])["fields"]}
    return column_change(columns, types, fields)


def column_change(columns: Sequence[str], before: Mapping[str, str],
                  now: Mapping[str, str]) -> str:
    """How a commit broke a selected column (dropped, renamed, retyped); "" if it did not."""
    for name in columns:
        if name not in now:
            return f"column {name!r} was dropped or renamed"
        if name in before and now[name] != before[name]:
            return f"column {name!r} changed type from {before[name]} to {now[name]}"
    return ""

