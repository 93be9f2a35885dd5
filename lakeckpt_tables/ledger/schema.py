"""The ledger's one flat table: column names, record kinds and the Arrow schema.

Every ledger backend stores exactly :data:`LEDGER_SCHEMA`. Checkpoint, consumption and event
rows share one table so that a checkpoint and everything it consumed land in a single atomic
commit; the ``record`` column says which kind a row is, and the columns of the other kinds are
null. Bump :data:`LEDGER_FORMAT_VERSION` on any change a reader of an older version would
misread; a ledger stamped with another version is refused when opened.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

__all__ = [
    "ADDED_COLUMNS",
    "CHECKPOINT_ID",
    "CHECKSUM",
    "COMMITTED_AT",
    "CONFIG_HASH",
    "CONSUMPTION_COLUMNS",
    "DETAIL",
    "EPOCH",
    "EVENT",
    "FILE",
    "FORMAT_PROPERTY",
    "LEDGER_FORMAT_VERSION",
    "LEDGER_SCHEMA",
    "MANIFEST",
    "MODEL_LOCATION",
    "OWNER",
    "PARENT_ID",
    "RANK",
    "READER_STATE",
    "RECORD",
    "RECORD_CHECKPOINT",
    "RECORD_CONSUMPTION",
    "RECORD_EVENT",
    "ROWS",
    "ROW_END",
    "ROW_GROUP",
    "ROW_START",
    "RUN_ID",
    "SEGMENT",
    "SOURCES",
    "SOURCE_FORMAT",
    "SOURCE_KEY",
    "SOURCE_LOCATION",
    "SOURCE_TABLE_ID",
    "SOURCE_VERSION",
    "STEP",
    "TAGS",
    "TOKENS",
    "WALL_TIME_S",
    "WORKER",
    "WORLD_SIZE",
]

LEDGER_FORMAT_VERSION: Final = 2
"""Version of this schema and of the meaning of its columns (2: ``owner`` and ``checksum``)."""

FORMAT_PROPERTY: Final = "lakeckpt.ledger.format"
"""Table property (Delta configuration, Iceberg table property) holding the format version."""

RECORD_CHECKPOINT: Final = "checkpoint"
"""One row per committed checkpoint."""
RECORD_CONSUMPTION: Final = "consumption"
"""One row per row range a (rank, worker) consumed from since the previous checkpoint."""
RECORD_EVENT: Final = "event"
"""A noteworthy happening (segment formed, commit skipped, restore fallback...)."""

# -- columns every row has ------------------------------------------------------------------
RECORD: Final = "record"
"""Kind of row: ``checkpoint``, ``consumption`` or ``event``."""
RUN_ID: Final = "run_id"
"""The training run the row belongs to."""
CHECKPOINT_ID: Final = "checkpoint_id"
"""Checkpoint the row was committed with; ``""`` for events recorded outside a checkpoint."""
STEP: Final = "step"
"""Training step of that checkpoint; ``-1`` for events recorded outside a checkpoint."""
COMMITTED_AT: Final = "committed_at"
"""When the ledger commit holding the row was made (UTC)."""
OWNER: Final = "owner"
"""The job (a token each CheckpointManager draws) that committed the row; null if not said.
The run's newest owner is the one job allowed to commit its checkpoints (fencing)."""
CHECKSUM: Final = "checksum"
"""SHA-256 over the row's other fields (:func:`lakeckpt_tables.ledger.records.row_checksum`),
checked on read: a row that fails it is damaged and is not trusted."""

# -- checkpoint rows ------------------------------------------------------------------------
PARENT_ID: Final = "parent_id"
"""Checkpoint this one was resumed from, or null for the first checkpoint of a run."""
MODEL_LOCATION: Final = "model_location"
"""Directory or URI holding the model/optimizer state (torch.distributed.checkpoint)."""
MANIFEST: Final = "manifest"
"""JSON ``{relative file path: {"sha256": hex, "bytes": size}}`` of what the checkpoint wrote."""
READER_STATE: Final = "reader_state"
"""Encoded reader state; opaque to the ledger."""
SOURCE_FORMAT: Final = "source_format"
"""Format of the source table read by the run (``delta`` or ``iceberg``)."""
SOURCE_LOCATION: Final = "source_location"
"""Root URI of the source table."""
SOURCE_TABLE_ID: Final = "source_table_id"
"""Delta ``metaData.id`` or Iceberg ``table-uuid`` of the source: survives a move of the table."""
SOURCE_VERSION: Final = "source_version"
"""Delta version or Iceberg snapshot id the reader was pinned to at the checkpoint."""
WORLD_SIZE: Final = "world_size"
"""Number of ranks that prepared the checkpoint."""
TAGS: Final = "tags"
"""Free-form labels given by the user."""
CONFIG_HASH: Final = "config_hash"
"""Hash of the run configuration; a restore under another configuration warns, naming both."""
WALL_TIME_S: Final = "wall_time_s"
"""Seconds of training wall time up to the checkpoint."""

# -- consumption rows -----------------------------------------------------------------------
RANK: Final = "rank"
"""Rank that consumed the rows."""
WORKER: Final = "worker"
"""DataLoader worker (within the rank) that consumed the rows."""
SEGMENT: Final = "segment"
"""Segment the rows were read in (a pinned snapshot, or the rows appended between two)."""
EPOCH: Final = "epoch"
"""Epoch of the segment the rows were read in."""
FILE: Final = "file"
"""Data file path or URI, as the source lists it."""
ROW_GROUP: Final = "row_group"
"""Row group index within the file."""
ROW_START: Final = "row_start"
"""First row of the consumed range, counted within the row group."""
ROW_END: Final = "row_end"
"""One past the last row of the consumed range, counted within the row group."""
ROWS: Final = "rows"
"""Rows of the range consumed: ``row_end - row_start``, or fewer where a checkpoint fell inside
a shuffled window (a seeded subset was consumed; the next checkpoint records the rest)."""

SOURCE_KEY: Final = "source_key"
"""Key of the Mixture source the rows were read from (``Mixture({key: dataset})``); null for a
run reading one table. Added after format version 2 without changing it: a ledger without the
column gains it when opened (:data:`ADDED_COLUMNS`), and rows where it is null keep their
checksums."""
TOKENS: Final = "tokens"
"""Tokens a packed reader (``pack_tokens``) delivered in the record's stream span of this row
group: the elements of ``input_ids``, each document's eos included, so a run's records sum to
the tokens it trained on. A packed record counts as ``rows`` the rows whose eos it delivered; one
of ``rows`` 0 (``row_start == row_end``, the row whose tokens they are) carries tokens of a
document whose eos a later record delivers. Null for a reader of rows. Added after format
version 2 like :data:`SOURCE_KEY` (:data:`ADDED_COLUMNS`)."""
SOURCES: Final = "sources"
"""A Mixture's checkpoint: JSON object of each source key's table and pinned version,
``{key: {"format", "location", "table_id", "version"}}`` (a source not drawn yet: null), as its
reader states hold them; null for a run of one table, which ``source_*`` name. Added after
format version 2 like :data:`SOURCE_KEY` (:data:`ADDED_COLUMNS`)."""

# -- event rows -----------------------------------------------------------------------------
EVENT: Final = "event"
"""Name of the event, e.g. ``segment_formed`` or ``restore_fallback``."""
DETAIL: Final = "detail"
"""JSON object with the event's details."""

_REQUIRED = {RECORD, RUN_ID, CHECKPOINT_ID, STEP, COMMITTED_AT}

_TYPES: dict[str, pa.DataType] = {
    RECORD: pa.string(),
    RUN_ID: pa.string(),
    CHECKPOINT_ID: pa.string(),
    STEP: pa.int64(),
    COMMITTED_AT: pa.timestamp("us", tz="UTC"),
    OWNER: pa.string(),
    CHECKSUM: pa.string(),
    PARENT_ID: pa.string(),
    MODEL_LOCATION: pa.string(),
    MANIFEST: pa.string(),
    READER_STATE: pa.string(),
    SOURCE_FORMAT: pa.string(),
    SOURCE_LOCATION: pa.string(),
    SOURCE_TABLE_ID: pa.string(),
    SOURCE_VERSION: pa.int64(),
    WORLD_SIZE: pa.int32(),
    TAGS: pa.list_(pa.string()),
    CONFIG_HASH: pa.string(),
    WALL_TIME_S: pa.float64(),
    RANK: pa.int32(),
    WORKER: pa.int32(),
    SEGMENT: pa.int64(),
    EPOCH: pa.int64(),
    FILE: pa.string(),
    ROW_GROUP: pa.int32(),
    ROW_START: pa.int64(),
    ROW_END: pa.int64(),
    ROWS: pa.int64(),
    SOURCE_KEY: pa.string(),
    TOKENS: pa.int64(),
    SOURCES: pa.string(),
    EVENT: pa.string(),
    DETAIL: pa.string(),
}

LEDGER_SCHEMA: Final = pa.schema(
    [pa.field(name, type_, nullable=name not in _REQUIRED) for name, type_ in _TYPES.items()]
)
"""The ledger table's schema, identical for every backend."""

CONSUMPTION_COLUMNS: Final = (
    RUN_ID,
    CHECKPOINT_ID,
    STEP,
    COMMITTED_AT,
    RANK,
    WORKER,
    SEGMENT,
    EPOCH,
    FILE,
    ROW_GROUP,
    ROW_START,
    ROW_END,
    ROWS,
    SOURCE_KEY,
    TOKENS,
)
"""Columns of :meth:`Ledger.consumption`'s result, in order."""

ADDED_COLUMNS: Final = (SOURCE_KEY, TOKENS, SOURCES)
"""Nullable columns added to the format-2 schema later: a ledger created before lacks them and
gains them when opened; hashed into a row's checksum only when not null (old rows verify)."""
