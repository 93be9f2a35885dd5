"""What the ledger stores, as Python values, and their conversion to and from ledger rows.

The conversions are the only place that knows how a record maps onto :data:`LEDGER_SCHEMA`,
so both backends write and read byte-identical rows.

NOTE [ consumption sealed where made ]
A save of a 256-rank x 8-worker job inside shuffled windows records ~262,000 consumption rows;
building and checksumming them at rank 0 took seconds. So each rank turns its own records into
ledger rows, checksums included (:class:`SealedConsumption`, ~1,000 rows at that scale), and
the gather moves Arrow tables of the columns that vary by row; rank 0 only concatenates them,
adds the columns the commit shares, the checkpoint row and the events (:func:`commit_rows`),
and makes the one commit.
A row's checksum covers ``committed_at``, so the ranks must know it before rank 0 commits: the
coordinator fixes it as phase 2 begins (``CheckpointManager`` broadcasts it, then each rank seals
and the gather follows) and the ledger commits with it rather than reading its clock again. The
alternative, a consumption checksum without ``committed_at``, would have been a second canonical
form: every reader (and every older library version) would have to accept either. This way the
rows, their checksums and the format are what they were, byte for byte; ``committed_at`` still
says when the commit was made, fixed a gather and a settle earlier (milliseconds to a second).
It is also what tells the ledger's settle step that a stored commit of the checkpoint is its
own first try (same ``committed_at``) rather than another coordinator's: one value per save,
shared by the retries of that save's commit and by no other commit, keeps that true.
The Iceberg ledger takes the same rows; rank 0 writes them for both backends.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any, TypedDict, cast

import pyarrow as pa
import pyarrow.compute as pc

from lakeckpt_tables.errors import LedgerError
from lakeckpt_tables.io.memory import COMMIT_POOL
from lakeckpt_tables.ledger import schema as s
from lakeckpt_tables.ledger.checksums import row_checksum, table_checksums
from lakeckpt_tables.plan.accounting import Consumed
from lakeckpt_tables.types import TableFormat, TableIdentity

__all__ = [
    "EXCLUDED_EVENT",
    "REPLANNED_EVENT",
    "SEALED_COLUMNS",
    "CheckpointRecord",
    "ConsumptionRecord",
    "DamagedRecord",
    "FileDigest",
    "LedgerEvent",
    "SealedConsumption",
    "SourceVersion",
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
class SourceVersion:
    """A table a Mixture's source reads and the version its reader state pins."""

    table: TableIdentity
    version: int


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
        committed_at: when the commit was made, set by the ledger (or by the coordinator just
            before, for sealed consumption: NOTE [ consumption sealed where made ]); ignored on
            input.
        sources: a Mixture's checkpoint: each source key's table and pinned version (None for
            a source not drawn yet); None for a run of one table (``source``).
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
    sources: Mapping[str, SourceVersion | None] | None = None

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


SEALED_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(ConsumptionRecord))
"""The ledger columns of a consumption record's own fields (the rest its commit shares)."""


EXCLUDED_EVENT = "excluded"
"""Event of rows the source table deleted after the pin, taken out of a pass at a checkpoint
(``deletes="honor"``: NOTE [ deletions honored ] in ``reader/deletions.py``): one per deleting
commit, with its ``version``, ``operation``, ``how`` (position, key), the ``rows`` it deleted
(``deleted``: [file, row group, first, end] live-row ranges) and, per epoch, the ranges taken
out (``excluded``; ``excluded_rows`` in all)."""

REPLANNED_EVENT = "replanned"
"""Event of a checkpoint whose reader state was re-planned to take rows out: ``from`` is the
(encoded) state before, up to which the checkpoint's rows were consumed (the audit replays to
it); the next checkpoint's rows start at the checkpoint's own state."""


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


@dataclass(frozen=True)
class SealedConsumption:
    """Consumption rows of one commit, built and checksummed by the rank that made them
    (NOTE [ consumption sealed where made ]): the columns that vary by row, with each row's
    checksum; the values every row of the commit shares are kept once.

    Attributes:
        run_id, checkpoint_id, step, committed_at, owner: the commit's, in every row.
        rows: the consumption columns (:data:`SEALED_COLUMNS`) and ``checksum``.
    """

    run_id: str
    checkpoint_id: str
    step: int
    committed_at: datetime
    owner: str | None
    rows: pa.Table

    @classmethod
    def of(cls, consumption: Sequence[ConsumptionRecord], *, run_id: str, checkpoint_id: str,
           step: int, committed_at: datetime, owner: str | None) -> SealedConsumption:
        """Seal ``consumption``: built a column at a time, checksummed by column."""
        sealed = cls(run_id, checkpoint_id, step, committed_at, owner, pa.table(
            {name: pa.array([getattr(c, name) for c in consumption],
                            s.LEDGER_SCHEMA.field(name).type) for name in SEALED_COLUMNS}))
        table = sealed.table()
        return replace(sealed, rows=table.select([*SEALED_COLUMNS, s.CHECKSUM]))

    @staticmethod
    def joined(parts: Sequence[SealedConsumption]) -> SealedConsumption:
        """Every rank's part as one.

        Raises:
            ValueError: no parts, or parts sealed for different commits.
        """
        if not parts:
            raise ValueError("no sealed consumption to join: every rank sends its part")
        first = parts[0]
        for part in parts:
            if part.common != first.common:
                raise ValueError(f"consumption sealed for different commits: {first.common} "
                                 f"and {part.common}; every rank seals with the values rank 0 "
                                 "broadcast")
        return replace(first, rows=pa.concat_tables([p.rows for p in parts]))

    def __len__(self) -> int:
        """The number of consumption rows."""
        return self.rows.num_rows

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled (every rank's part crosses the gather) with its rows as one Arrow IPC
        stream: rank 0 reads 256 of them in ~5 ms, against ~30 ms to unpickle 256 tables
        pickled by Arrow column by column."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self.rows.schema) as stream:
            stream.write_table(self.rows)
        return _unpickled, (self.run_id, self.checkpoint_id, self.step, self.committed_at,
                            self.owner, sink.getvalue().to_pybytes())

    @property
    def common(self) -> dict[str, object]:
        """The values every row shares, by column."""
        return {s.RUN_ID: self.run_id, s.CHECKPOINT_ID: self.checkpoint_id, s.STEP: self.step,
                s.COMMITTED_AT: self.committed_at, s.OWNER: self.owner}

    def table(self) -> pa.Table:
        """The rows in :data:`LEDGER_SCHEMA`; checksummed when not sealed yet."""
        n = self.rows.num_rows
        shared = {**self.common, s.RECORD: s.RECORD_CONSUMPTION}
        columns = [self.rows.column(f.name) if f.name in self.rows.column_names
                   else pa.nulls(n, f.type, memory_pool=COMMIT_POOL) if shared.get(f.name) is None
                   else pa.repeat(pa.scalar(shared[f.name], f.type), n, memory_pool=COMMIT_POOL)
                   for f in s.LEDGER_SCHEMA]
        table = pa.Table.from_arrays(columns, schema=s.LEDGER_SCHEMA)
        return table if s.CHECKSUM in self.rows.column_names else _with_checksums(table)


def _unpickled(run_id: str, checkpoint_id: str, step: int, committed_at: datetime,
               owner: str | None, stream: bytes) -> SealedConsumption:
    """A :class:`SealedConsumption` from its pickled form (its rows read without a copy)."""
    rows = pa.ipc.open_stream(pa.py_buffer(stream)).read_all()
    return SealedConsumption(run_id, checkpoint_id, step, committed_at, owner, rows)


def commit_rows(
    checkpoint: CheckpointRecord,
    consumption: Sequence[ConsumptionRecord] | SealedConsumption,
    events: Sequence[LedgerEvent],
    *,
    owner: str | None = None,
) -> pa.Table:
    """Rows of one checkpoint commit: the checkpoint, its events, then its consumption (the
    few rows first: NOTE [ few rows first ]).

    Raises:
        ValueError: the checkpoint's ``committed_at`` is not set yet, or sealed consumption
            rows belong to another commit.
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
    if isinstance(consumption, SealedConsumption):
        if consumption.common != common:
            raise ValueError(
                f"run {checkpoint.run_id!r} step {checkpoint.step}: consumption sealed for "
                f"another commit ({consumption.common}, not {common}); seal it with the "
                "commit's values")
        rows += [{**common, **_event_fields(e)} for e in events]
        return pa.concat_tables([_sealed(rows), consumption.table()])
    rows += [{**common, **_event_fields(e)} for e in events]
    rows += [{**common, **_consumption_fields(c)} for c in consumption]
    return _sealed(rows)


def few_rows_first(rows: pa.Table) -> list[pa.Table]:
    """The rows before the first consumption row, then the rest (empty parts left out).

    NOTE [ few rows first ]
    A commit's checkpoint and event rows come first (:func:`commit_rows`), and each backend
    keeps them apart from the consumption rows: the Delta ledger as a row group of their own,
    the Iceberg ledger as a data file of their own. Then the statistics of ``record`` (row
    groups', or the file bounds in the manifests) let a read of checkpoints or events skip
    every consumption row: retention's read of tags at every save decoded 65,536 consumption
    rows of each new Delta file, and every row of each new Iceberg file, to find a few events.
    """
    first = pc.index(rows[s.RECORD], s.RECORD_CONSUMPTION).as_py()
    if first <= 0:
        return [rows]
    return [rows.slice(0, first), rows.slice(first)]


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


def intact_rows(table: pa.Table) -> tuple[pa.Table, list[DamagedRecord]]:
    """Split ledger rows into those whose checksum matches and the damaged rest.

    Returns:
        The intact rows (same schema), and one :class:`DamagedRecord` per damaged row.
    """
    if table.num_rows == 0:
        return table, []
    sums = pa.array(table_checksums(table), pa.string())
    keep = pc.fill_null(pc.equal(table.column(s.CHECKSUM), sums), False) \
        if s.CHECKSUM in table.column_names else pa.array([False] * table.num_rows)
    if pc.all(keep).as_py():
        return table, []
    damaged = [DamagedRecord(
        record=str(row.get(s.RECORD)), run_id=str(row.get(s.RUN_ID)),
        checkpoint_id=str(row.get(s.CHECKPOINT_ID)), step=int(row.get(s.STEP) or -1))
        for row in table.filter(pc.invert(keep)).to_pylist()]
    return table.filter(keep), damaged


def _sealed(rows: list[dict[str, object]]) -> pa.Table:
    """Rows in the ledger schema, each with its checksum."""
    return _with_checksums(pa.Table.from_pylist(rows, schema=s.LEDGER_SCHEMA))


def _with_checksums(table: pa.Table) -> pa.Table:
    # checksummed in Arrow, so that the value is over exactly what a reader will see
    # (timestamps truncated to microseconds, int32 columns...)
    return table.set_column(table.schema.get_field_index(s.CHECKSUM),
                            s.LEDGER_SCHEMA.field(s.CHECKSUM),
                            pa.array(table_checksums(table), pa.string()))


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
        s.SOURCES: _sources_json(c.sources),
    }


def _sources_json(sources: Mapping[str, SourceVersion | None] | None) -> str | None:
    if sources is None:
        return None
    return json.dumps({k: None if v is None else {**v.table.to_json(), "version": v.version}
                       for k, v in sources.items()}, sort_keys=True)


def _sources_from_json(text: str | None) -> dict[str, SourceVersion | None] | None:
    if text is None:
        return None
    return {k: None if v is None else SourceVersion(
        TableIdentity(format=v["format"], location=v["location"], table_id=v["table_id"]),
        v["version"]) for k, v in json.loads(text).items()}


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
        sources=_sources_from_json(row.get(s.SOURCES)),
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
