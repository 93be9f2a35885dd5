"""What the ledger stores, as Python values, and their conversion to and from ledger rows.

The conversions are the only place that knows how a record maps onto :data:`LEDGER_SCHEMA`,
so both backends write and read byte-identical rows.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict, cast

import pyarrow as pa
import pyarrow.compute as pc

from lakeckpt_tables.errors import LedgerError
from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.plan.accounting import Consumed
from lakeckpt_tables.types import TableFormat, TableIdentity

__all__ = [
    "CheckpointRecord",
    "ConsumptionRecord",
    "DamagedRecord",
    "FileDigest",
    "LedgerEvent",
    "checkpoints_from_arrow",
    "commit_rows",
    "event_rows",
    "intact_rows",
    "row_checksum",
]

_FORMATS: tuple[TableFormat, ...] = ("delta", "iceberg")


class FileDigest(TypedDict):
    """Checksum of one file a checkpoint wrote, as kept in the manifest."""

    sha256: str
    bytes: int


@dataclass(frozen=True)
class CheckpointRecord:
    """One committed (or about to be committed) checkpoint of a run.

    Attributes:
        run_id: the training run.
        checkpoint_id: unique id of this checkpoint; a retry of the same commit reuses it, which
            is how the ledger tells a retry from a conflicting second checkpoint.
        step: training step, strictly increasing within a run.
        parent_id: checkpoint this run resumed from, or None.
        model_location: where the model/optimizer state was written.
        manifest: checksums of the files written, keyed by path relative to model_location.
        reader_state: encoded reader state, opaque to the ledger.
        source: identity of the source table, or None if the run reads no table.
        source_version: Delta version or Iceberg snapshot id pinned at the checkpoint.
        world_size: number of ranks that prepared the checkpoint.
        tags: free-form labels.
        config_hash: hash of the run configuration.
        wall_time_s: training wall time up to the checkpoint.
        committed_at: set by the ledger when the commit lands; ignored on input.
    """

    run_id: str
    checkpoint_id: str
    step: int
    parent_id: str | None
    model_location: str
    manifest: dict[str, FileDigest]
    reader_state: str
    source: TableIdentity | None
    source_version: int | None
    world_size: int
    tags: tuple[str, ...]
    config_hash: str
    wall_time_s: float
    committed_at: datetime | None = None

    def __post_init__(self) -> None:
        if not self.run_id or not self.checkpoint_id:
            raise ValueError(
                f"a checkpoint needs a run id and a checkpoint id, got run {self.run_id!r} "
                f"and checkpoint {self.checkpoint_id!r}"
            )
        if self.step < 0:
            raise ValueError(f"run {self.run_id!r}: checkpoint step must be >= 0, got {self.step}")
        if self.world_size < 1:
            raise ValueError(
                f"run {self.run_id!r} step {self.step}: world size must be >= 1, "
                f"got {self.world_size}"
            )


@dataclass(frozen=True)
class ConsumptionRecord(Consumed):
    """Rows one (rank, worker) consumed since the previous checkpoint, within one row group:
    the plan's :class:`~lakeckpt_tables.plan.accounting.Consumed` (its fields, in its order),
    with what only the ledger knows.

    Attributes:
        source_key: the Mixture source the rows were read from, None for a one-table run.
        tokens: tokens a packed reader delivered in this record's stream span of the row
            group, eos included (:data:`~lakeckpt_tables.ledger.schema.TOKENS`); None for a
            reader of rows.
    """

    source_key: str | None = None
    tokens: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.row_start <= self.row_end or not 0 <= self.rows <= self.span \
                or (self.tokens is not None and self.tokens < 0):
            raise ValueError(
                f"rank {self.rank} worker {self.worker}: {self.rows} rows consumed of range "
                f"[{self.row_start}, {self.row_end}) of {self.file} row group {self.row_group} "
                f"{'' if self.tokens is None else f'with {self.tokens} tokens '}is not possible"
            )

    @property
    def span(self) -> int:
        """Number of rows in the range, consumed or not."""
        return self.row_end - self.row_start


@dataclass(frozen=True)
class LedgerEvent:
    """Something worth keeping next to the checkpoints: segment formed, commit skipped...

    Attributes:
        event: short name of the event.
        detail: JSON-serialisable details.
    """

    event: str
    detail: dict[str, Any]


@dataclass(frozen=True)
class DamagedRecord:
    """A ledger row whose checksum does not match its fields: not trusted, not used.

    Attributes:
        record: the kind the row claims to be (``checkpoint``, ``consumption``, ``event``).
        run_id: the run it claims to belong to.
        checkpoint_id: the checkpoint it claims to belong to.
        step: the step it claims.
    """

    record: str
    run_id: str
    checkpoint_id: str
    step: int


def commit_rows(
    checkpoint: CheckpointRecord,
    consumption: Sequence[ConsumptionRecord],
    events: Sequence[LedgerEvent],
    *,
    owner: str | None = None,
) -> pa.Table:
    """Rows of one checkpoint commit: the checkpoint, its consumption and its events.

    Raises:
        ValueError: the checkpoint's ``committed_at`` is not set yet.
    """
    if checkpoint.committed_at is None:
        raise ValueError(
            f"run {checkpoint.run_id!r} step {checkpoint.step}: committed_at must be set "
            "before the checkpoint's rows are built"
        )
    common = {
        s.RUN_ID: checkpoint.run_id,
        s.CHECKPOINT_ID: checkpoint.checkpoint_id,
        s.STEP: checkpoint.step,
        s.COMMITTED_AT: checkpoint.committed_at,
        s.OWNER: owner,
    }
    rows = [{**common, **_checkpoint_fields(checkpoint)}]
    rows += [{**common, **_consumption_fields(c)} for c in consumption]
    rows += [{**common, **_event_fields(e)} for e in events]
    return _sealed(rows)


def event_rows(
    run_id: str,
    events: Sequence[LedgerEvent],
    committed_at: datetime,
    *,
    owner: str | None = None,
) -> pa.Table:
    """Rows of events recorded outside any checkpoint (checkpoint id ``""``, step -1)."""
    common = {s.RUN_ID: run_id, s.CHECKPOINT_ID: "", s.STEP: -1, s.COMMITTED_AT: committed_at,
              s.OWNER: owner}
    rows = [{**common, **_event_fields(e)} for e in events]
    return _sealed(rows)


def checkpoints_from_arrow(table: pa.Table) -> list[CheckpointRecord]:
    """Checkpoint records held in ledger rows, ordered by (run, step); other rows are ignored.

    Rows are taken as they are: check them with :func:`intact_rows` first.
    """
    rows = table.filter(pc.field(s.RECORD) == s.RECORD_CHECKPOINT)
    rows = rows.sort_by([(s.RUN_ID, "ascending"), (s.STEP, "ascending")])
    return [_checkpoint_from_row(row) for row in rows.to_pylist()]


def row_checksum(row: Mapping[str, Any]) -> str:
    """SHA-256 (hex) over every field of a ledger row but the checksum itself.

    The fields are hashed as canonical JSON in schema order, with ``committed_at`` as integer
    microseconds, so the value is the same whichever backend wrote or read the row. A column
    added later (:data:`~lakeckpt_tables.ledger.schema.ADDED_COLUMNS`) counts only when not
    null, so rows written before it existed keep their checksums.
    """
    values = [_canonical(row.get(name)) for name in s.LEDGER_SCHEMA.names
              if name != s.CHECKSUM and (name not in s.ADDED_COLUMNS or row.get(name) is not None)]
    text = json.dumps(values, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def intact_rows(table: pa.Table) -> tuple[pa.Table, list[DamagedRecord]]:
    """Split ledger rows into those whose checksum matches and the damaged rest.

    Returns:
        The intact rows (same schema), and one :class:`DamagedRecord` per damaged row.
    """
    keep: list[bool] = []
    damaged: list[DamagedRecord] = []
    for row in table.to_pylist():
        ok = row.get(s.CHECKSUM) == row_checksum(row)
        keep.append(ok)
        if not ok:
            damaged.append(DamagedRecord(
                record=str(row.get(s.RECORD)), run_id=str(row.get(s.RUN_ID)),
                checkpoint_id=str(row.get(s.CHECKPOINT_ID)), step=int(row.get(s.STEP) or -1)))
    if not damaged:
        return table, []
    return table.filter(pa.array(keep, pa.bool_())), damaged


def _sealed(rows: list[dict[str, object]]) -> pa.Table:
    """Rows in the ledger schema, each with its checksum."""
    table = pa.Table.from_pylist(rows, schema=s.LEDGER_SCHEMA)
    # checksummed after the round trip through Arrow, so that the value is over exactly what
    # a reader will see (timestamps truncated to microseconds, int32 columns...)
    sums = [row_checksum(row) for row in table.to_pylist()]
    return table.set_column(table.schema.get_field_index(s.CHECKSUM),
                            s.LEDGER_SCHEMA.field(s.CHECKSUM), pa.array(sums, pa.string()))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _canonical(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return (value - _EPOCH) // timedelta(microseconds=1)
    if isinstance(value, float):
        return repr(value)
    return value


def _checkpoint_fields(c: CheckpointRecord) -> dict[str, object]:
    source = c.source
    return {
        s.RECORD: s.RECORD_CHECKPOINT,
        s.PARENT_ID: c.parent_id,
        s.MODEL_LOCATION: c.model_location,
        s.MANIFEST: json.dumps(c.manifest, sort_keys=True),
        s.READER_STATE: c.reader_state,
        s.SOURCE_FORMAT: source.format if source else None,
        s.SOURCE_LOCATION: source.location if source else None,
        s.SOURCE_TABLE_ID: source.table_id if source else None,
        s.SOURCE_VERSION: c.source_version,
        s.WORLD_SIZE: c.world_size,
        s.TAGS: list(c.tags),
        s.CONFIG_HASH: c.config_hash,
        s.WALL_TIME_S: c.wall_time_s,
    }


def _consumption_fields(c: ConsumptionRecord) -> dict[str, object]:
    return {
        s.RECORD: s.RECORD_CONSUMPTION,
        s.RANK: c.rank,
        s.WORKER: c.worker,
        s.SEGMENT: c.segment,
        s.EPOCH: c.epoch,
        s.FILE: c.file,
        s.ROW_GROUP: c.row_group,
        s.ROW_START: c.row_start,
        s.ROW_END: c.row_end,
        s.ROWS: c.rows,
        s.SOURCE_KEY: c.source_key,
        s.TOKENS: c.tokens,
    }


def _event_fields(e: LedgerEvent) -> dict[str, object]:
    return {s.RECORD: s.RECORD_EVENT, s.EVENT: e.event, s.DETAIL: json.dumps(e.detail)}


def _checkpoint_from_row(row: Mapping[str, Any]) -> CheckpointRecord:
    return CheckpointRecord(
        run_id=row[s.RUN_ID],
        checkpoint_id=row[s.CHECKPOINT_ID],
        step=row[s.STEP],
        parent_id=row[s.PARENT_ID],
        model_location=row[s.MODEL_LOCATION],
        manifest=json.loads(row[s.MANIFEST]),
        reader_state=row[s.READER_STATE],
        source=_source_from_row(row),
        source_version=row[s.SOURCE_VERSION],
        world_size=row[s.WORLD_SIZE],
        tags=tuple(row[s.TAGS] or ()),
        config_hash=row[s.CONFIG_HASH],
        wall_time_s=row[s.WALL_TIME_S],
        committed_at=row[s.COMMITTED_AT],
    )


def _source_from_row(row: Mapping[str, Any]) -> TableIdentity | None:
    fmt = row[s.SOURCE_FORMAT]
    if fmt is None:
        return None
    if fmt not in _FORMATS:
        raise LedgerError(f"ledger row of run {row[s.RUN_ID]!r}: unknown source format {fmt!r}")
    return TableIdentity(
        format=cast(TableFormat, fmt),
        location=row[s.SOURCE_LOCATION],
        table_id=row[s.SOURCE_TABLE_ID],
    )
