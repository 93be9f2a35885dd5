"""What reading real tables costs: deletion vectors and partition columns (issue 9 item 8).

Four Delta tables hold the same rows of the synthetic table (``id``, ``x``, the same files and
row groups):

- ``plain``: the synthetic table itself;
- ``deleted``: the same data files, plus a commit giving every file a deletion vector that
  deletes 1% of its rows, as Databricks writes them (``deletion_vector_<uuid>.bin`` files, a
  ``u`` descriptor; NOTE [ deletion vectors written here ]);
- ``partitioned``: the same rows partitioned by ``day`` (int32, one value per file): ``day``
  comes from the log, a constant column per file;
- ``stored``: the same rows with ``day`` stored in the files as an ordinary column.

The reader reads each (shuffle off, no read-ahead) in interleaved passes, and each figure is a
ratio of rows per wall-clock second taken side by side in one round, the median over rounds
(NOTE [ interleaving ] in ``_common.py``; the CPU-time ratio is printed beside it):
- deletion vectors: ``deleted`` / ``plain`` (the 1% of rows not delivered are not counted);
- partition column: ``partitioned`` / ``stored``, both read as (id, x, day): the same batches,
  the column from the log against the column in the files. Beside it, informative: both
  against ``plain`` read as (id, x), what any third column costs the reader's batches.
Target (issue 9 item 8): each costs at most 5%, i.e. a ratio >= 0.95. The reading layer
alone (``RowGroupReader.read``, no batches) is measured the same way and printed beside.
"""

from __future__ import annotations

import json
import shutil
import statistics
import struct
import time
import uuid
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa

from lakeckpt_tables.reader.dataset import LakeDataset
from lakeckpt_tables.sources.delta import DeltaSource
from lakeckpt_tables.tools.bench._common import (
    Figure,
    LoopTime,
    Progress,
    figure_lines,
    interleaved_rounds,
    machine_note,
    passed,
    quiet,
    scratch,
    write_delta,
)
from lakeckpt_tables.tools.bench.data import (
    ROW_GROUP_ROWS,
    ensure_synthetic_table,
    file_count,
    synthetic_parts,
    warm_page_cache,
)

__all__ = [
    "COST_TARGET",
    "DELETED_SHARE",
    "FeatureCost",
    "FeatureTables",
    "TablesReport",
    "add_deletion_vectors",
    "ensure_feature_tables",
    "feature_figures",
    "format_report",
    "measure_feature_cost",
    "run_tables_bench",
]

COST_TARGET = 0.05
"""Most share of the plain read's throughput a table feature may cost (issue 9 item 8)."""
DELETED_SHARE = 0.01
"""Share of each file's rows the ``deleted`` table's deletion vectors delete."""

_DV_MAGIC = 1681511377  # RoaringBitmapArray, little-endian int32 (Delta protocol)
_Z85 = ("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
        ".-:+=^!/*?&<>()[]{}@%$#")


@dataclass(frozen=True)
class FeatureTables:
    """The four tables of the module docstring (local paths) and their rows.

    Attributes:
        plain, deleted, partitioned, stored: table roots.
        rows: rows of ``plain``, ``partitioned`` and ``stored``.
        deleted_rows: rows the ``deleted`` table's deletion vectors delete.
    """

    plain: str
    deleted: str
    partitioned: str
    stored: str
    rows: int
    deleted_rows: int


def _z85(data: bytes) -> str:
    """Z85 (ZeroMQ base-85), the encoding of a deletion vector's UUID in the Delta log."""
    out: list[str] = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i:i + 4], "big")
        chunk = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            chunk.append(_Z85[digit])
        out.extend(reversed(chunk))
    return "".join(out)


def _bitmap_array(positions: np.ndarray[Any, Any]) -> bytes:
    """Positions as the Delta protocol's RoaringBitmapArray (64-bit roaring, portable)."""
    from pyroaring import BitMap

    pos = np.asarray(positions, dtype=np.int64)
    keys = np.unique(pos >> 32)
    body = struct.pack("<iq", _DV_MAGIC, len(keys))
    for key in keys:
        low = (pos[(pos >> 32) == key] & 0xFFFFFFFF).astype(np.uint32)
        body += struct.pack("<i", int(key)) + BitMap(low.tolist()).serialize()
    return body


def add_deletion_vectors(uri: str, share: float = DELETED_SHARE, *, seed: int = 0) -> int:
    """Commit a deletion vector deleting ``share`` of the rows of every file of ``uri``
    (:func:`write_deletion_vectors`).

    Returns:
        Rows deleted.
    """
    from deltalake import DeltaTable

    rng = np.random.default_rng(seed)
    deleted: dict[str, np.ndarray[Any, Any]] = {}
    for add in pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist():
        rows = int(add["num_records"])
        deleted[add["path"]] = np.sort(rng.choice(rows, max(1, int(rows * share)),
                                                  replace=False))
    write_deletion_vectors(uri, deleted, predicate="lakeckpt bench tables")
    return sum(len(p) for p in deleted.values())


def write_deletion_vectors(uri: str, deleted: Mapping[str, Any], *,
                           operation: str = "DELETE", predicate: str = "") -> int:
    """Commit deletion vectors deleting rows ``deleted[path]`` (file positions) of the files
    of ``uri`` named by their log path, on top of the vectors they have; the new version.

    NOTE [ deletion vectors written here ]
    deltalake reads deletion vectors but does not write them, so this writes them as the
    Delta protocol and Databricks do: one ``deletion_vector_<uuid>.bin`` per file (a version
    byte, then the vector's size as a big-endian int32, the RoaringBitmapArray, its CRC-32),
    and one commit that removes each file and adds it again with a ``u`` descriptor (the
    UUID in Z85, offset 1), raising the protocol to reader 3 / writer 7 with the
    ``deletionVectors`` feature. deltalake's own reader is the judge that it is right
    (``tests/test_bench_tables_smoke.py``).
    """
    from deltalake import DeltaTable

    path = Path(uri)
    dt = DeltaTable(uri)
    adds = {a["path"]: a for a in pa.table(dt.get_add_actions(flatten=True)).to_pylist()}
    before: dict[str, np.ndarray[Any, Any]] = {}
    if "deletionVectors" in (dt.protocol().reader_features or []):
        vectors = pa.table(dt.deletion_vectors())
        for file_uri, keep in zip(vectors.column("filepath").to_pylist(),
                                  vectors.column("selection_vector").to_pylist(), strict=True):
            if keep is not None:
                name = next((p for p in adds if file_uri.endswith("/" + p)), None)
                if name is not None:
                    before[name] = np.flatnonzero(~np.asarray(keep, dtype=bool))
    now = int(time.time() * 1000)
    actions: list[dict[str, Any]] = [
        {"commitInfo": {"timestamp": now, "operation": operation,
                        "operationParameters": {"predicate": predicate},
                        "engineInfo": "lakeckpt tests"}},
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                      "readerFeatures": ["deletionVectors"],
                      "writerFeatures": ["deletionVectors"]}},
    ]
    for name, rows_deleted in deleted.items():
        add = adds[name]
        positions = np.union1d(before.get(name, np.empty(0, np.int64)),
                               np.asarray(rows_deleted, dtype=np.int64))
        vector = _bitmap_array(positions)
        vector_id = uuid.uuid4()
        (path / f"deletion_vector_{vector_id}.bin").write_bytes(
            b"\x01" + struct.pack(">i", len(vector)) + vector
            + struct.pack(">I", zlib.crc32(vector)))
        stats = {"numRecords": int(add["num_records"]),
                 "nullCount": {k[len("null_count."):]: v for k, v in add.items()
                               if k.startswith("null_count.")},
                 "minValues": {k[4:]: v for k, v in add.items() if k.startswith("min.")},
                 "maxValues": {k[4:]: v for k, v in add.items() if k.startswith("max.")},
                 "tightBounds": False}
        common = {"path": name, "partitionValues": {}, "size": int(add["size_bytes"]),
                  "dataChange": True}
        # a remove names the add it removes, its deletion vector included: without it a
        # reader may keep the old (path, vector) beside the new one
        previous = _current_vectors(path).get(name)
        actions.append({"remove": {**common, "deletionTimestamp": now,
                                   **({"deletionVector": previous} if previous else {})}})
        actions.append({"add": {**common, "modificationTime": now, "stats": json.dumps(stats),
                                "deletionVector": {"storageType": "u",
                                                   "pathOrInlineDv": _z85(vector_id.bytes),
                                                   "offset": 1, "sizeInBytes": len(vector),
                                                   "cardinality": len(positions)}}})
    version = int(dt.version()) + 1
    log = path / "_delta_log" / f"{version:020d}.json"
    log.write_text("".join(json.dumps(a) + "\n" for a in actions))
    return version


def _current_vectors(table: Path) -> dict[str, dict[str, Any]]:
    """The deletion vector descriptor of each live file of a local table, by log replay
    (deltalake's ``get_add_actions`` does not show them)."""
    live: dict[str, dict[str, Any]] = {}
    for entry in sorted((table / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "add" in action:
                live[unquote(action["add"]["path"])] = action["add"].get("deletionVector")
            elif "remove" in action:
                live.pop(unquote(action["remove"]["path"]), None)
    return {path: dv for path, dv in live.items() if dv}


def _with_day(parts: Iterator[pa.Table]) -> Iterator[pa.Table]:
    for day, part in enumerate(parts):
        yield part.append_column("day", pa.array(np.full(part.num_rows, 20_000 + day,
                                                         dtype=np.int32)))


def ensure_feature_tables(root: str | Path, rows: int) -> FeatureTables:
    """Build the four tables under ``root`` (reusing the synthetic one and complete leftovers)."""
    plain = ensure_synthetic_table(root, rows)
    base = Path(root) / f"features-{rows}"
    deleted, partitioned, stored = base / "deleted", base / "partitioned", base / "stored"
    done = base / "complete.json"
    if done.exists():
        return FeatureTables(**json.loads(done.read_text()))
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    shutil.copytree(plain.uri, deleted)
    deleted_rows = add_deletion_vectors(str(deleted))
    files = file_count(rows)
    write_delta(partitioned, _with_day(synthetic_parts(rows, files)),
                row_group_rows=ROW_GROUP_ROWS, partition_by=["day"])
    write_delta(stored, _with_day(synthetic_parts(rows, files)), row_group_rows=ROW_GROUP_ROWS)
    tables = FeatureTables(plain.uri, str(deleted), str(partitioned), str(stored), rows,
                           deleted_rows)
    done.write_text(json.dumps(asdict(tables)))
    return tables


@dataclass(frozen=True)
class FeatureCost:
    """Paired CPU-time rates of the four reads, per round.

    Attributes:
        rows: rows of the plain table.
        deleted_rows: rows its deletion vectors delete.
        batch_size: rows per batch.
        rounds: interleaved rounds counted.
        dv_ratios: per round, rows/s (wall clock) of ``deleted`` over ``plain``.
        partition_ratios: per round, ``partitioned`` (id, x, day) over ``plain`` (id, x).
        stored_ratios: per round, ``stored`` (id, x, day) over ``plain`` (id, x).
        plain_rate: best rows per wall-clock second of the plain read.
        cpu_dv_ratios, cpu_partition_ratios, cpu_stored_ratios: the same in CPU time.
        layer_dv_ratios, layer_partition_ratios, layer_stored_ratios: the same ratios for
            the reading layer alone (``RowGroupReader.read`` of every unit, no batches, no
            tensors): what ``sources/`` costs, apart from the reader's per-column batch work.
    """

    rows: int
    deleted_rows: int
    batch_size: int
    rounds: int
    dv_ratios: tuple[float, ...]
    partition_ratios: tuple[float, ...]
    stored_ratios: tuple[float, ...]
    plain_rate: float
    layer_dv_ratios: tuple[float, ...] = ()
    layer_partition_ratios: tuple[float, ...] = ()
    layer_stored_ratios: tuple[float, ...] = ()
    cpu_dv_ratios: tuple[float, ...] = ()
    cpu_partition_ratios: tuple[float, ...] = ()
    cpu_stored_ratios: tuple[float, ...] = ()

    def cpu(self, name: str) -> float:
        """Median of a CPU-time ratio: ``dv``, ``partition`` or ``stored``."""
        values = getattr(self, f"cpu_{name}_ratios")
        return statistics.median(values) if values else float("nan")

    def ratios(self) -> dict[str, float]:
        """The higher-is-better ratios ``bench compare`` guards (wall clock)."""
        return {"deletion vectors / plain read": self.dv_ratio,
                "partition column from the log / same column stored": self.partition_vs_stored}

    @property
    def dv_ratio(self) -> float:
        return statistics.median(self.dv_ratios)

    @property
    def partition_ratio(self) -> float:
        return statistics.median(self.partition_ratios)

    @property
    def stored_ratio(self) -> float:
        return statistics.median(self.stored_ratios)

    @property
    def partition_vs_stored(self) -> float:
        """The partition column from the log against the same column stored in the files."""
        return statistics.median(p / s for p, s in zip(self.partition_ratios,
                                                       self.stored_ratios, strict=True))

    def layer(self, name: str) -> float:
        """Median of a reading-layer ratio: ``dv``, ``partition`` or ``stored``."""
        values = getattr(self, f"layer_{name}_ratios")
        return statistics.median(values) if values else float("nan")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(unit="rows/s, wall clock", dv_ratio=self.dv_ratio,
                   partition_ratio=self.partition_ratio,
                   stored_ratio=self.stored_ratio, partition_vs_stored=self.partition_vs_stored,
                   dv_cost=1 - self.dv_ratio, partition_cost=1 - self.partition_vs_stored,
                   layer={k: self.layer(k) for k in ("dv", "partition", "stored")})
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


def measure_feature_cost(tables: FeatureTables, *, batch_size: int = 8192, rounds: int = 5,
                         min_seconds: float = 3.0,
                         progress: Progress = quiet) -> FeatureCost:
    """Read the four tables in interleaved passes; ratios of rows per second (wall clock).

    Raises:
        RuntimeError: a read delivered another number of rows than its table holds.
    """
    def dataset(uri: str, columns: Sequence[str]) -> LakeDataset:
        # read_ahead=0: every read happens inside the timed next() of its own loop; read-ahead
        # threads would decode one loop's windows while another loop is being timed.
        return LakeDataset(DeltaSource(uri), columns=list(columns), batch_size=batch_size,
                           shuffle=False, read_ahead=0)

    reads = {"plain": (tables.plain, ("id", "x")), "deleted": (tables.deleted, ("id", "x")),
             "partitioned": (tables.partitioned, ("id", "x", "day")),
             "stored": (tables.stored, ("id", "x", "day"))}

    def fresh() -> dict[str, LakeDataset]:
        # a dataset keeps the row groups it decoded (reader/_cache.py): a new one per pass
        return {name: dataset(uri, columns) for name, (uri, columns) in reads.items()}

    loops = fresh()
    warm_page_cache([u.path for d in loops.values() for u in d.snapshot.units])
    expected = {name: d.snapshot.rows for name, d in loops.items()}

    def report(n: int, times: dict[str, LoopTime]) -> None:
        plain = times["plain"].wall_rate
        progress(f"table features round {n}: deletion vectors "
                 f"{times['deleted'].wall_rate / plain:.3f}x, partition column "
                 f"{times['partitioned'].wall_rate / plain:.3f}x, stored column "
                 f"{times['stored'].wall_rate / plain:.3f}x of the plain read (wall clock)")

    results = interleaved_rounds(fresh, "id", expected, rounds=rounds,
                                 min_seconds=min_seconds, on_round=report)

    def ratios(runs: list[dict[str, LoopTime]], name: str) -> tuple[float, ...]:
        return tuple(r[name].wall_rate / r["plain"].wall_rate for r in runs)

    def cpu_ratios(name: str) -> tuple[float, ...]:
        return tuple(r[name].cpu_rate / r["plain"].cpu_rate for r in results)

    layer = interleaved_rounds(lambda: {n: _layer_reads(d) for n, d in loops.items()}, "id",
                               expected, rounds=rounds, min_seconds=min_seconds / 2)
    return FeatureCost(tables.rows, tables.deleted_rows, batch_size, len(results),
                       ratios(results, "deleted"), ratios(results, "partitioned"),
                       ratios(results, "stored"), max(r["plain"].wall_rate for r in results),
                       ratios(layer, "deleted"), ratios(layer, "partitioned"),
                       ratios(layer, "stored"), cpu_ratios("deleted"),
                       cpu_ratios("partitioned"), cpu_ratios("stored"))


def _layer_reads(dataset: LakeDataset) -> Iterator[dict[str, Any]]:
    """Every unit of ``dataset`` read by the reading layer alone; ``id`` sized as the rows."""
    reader = dataset.snapshot.row_reader()
    columns = list(dataset.columns)
    for unit in dataset.snapshot.units:
        table = reader.read(unit, columns)
        yield {"id": np.empty((table.num_rows, 0))}


def feature_figures(cost: FeatureCost) -> list[Figure]:
    """Issue 9 item 8: what deletion vectors and partition columns cost the reader."""
    target = f">= {1 - COST_TARGET:g}x"
    spread = f"wall clock, median of {cost.rounds} paired rounds"
    return [
        Figure("deletion vectors / plain read", cost.dv_ratio, "x", target,
               cost.dv_ratio >= 1 - COST_TARGET,
               f"{cost.deleted_rows / cost.rows:.0%} of rows deleted; {spread} "
               f"({min(cost.dv_ratios):.2f}-{max(cost.dv_ratios):.2f}); CPU time "
               f"{cost.cpu('dv'):.2f}x"),
        Figure("partition column from the log / same column stored", cost.partition_vs_stored,
               "x", target, cost.partition_vs_stored >= 1 - COST_TARGET,
               f"(id, x, day) from a partitioned and an unpartitioned table; {spread}; CPU "
               f"time {cost.cpu('partition') / cost.cpu('stored'):.2f}x"),
        Figure("  (id, x, day from the log) / (id, x)", cost.partition_ratio, "x", "", None,
               f"a third column costs the reader's batches this much wherever it comes from: "
               f"(id, x, day stored) / (id, x) {cost.stored_ratio:.2f}x"),
        Figure("  reading layer alone: deletion vectors / plain", cost.layer("dv"), "x", "",
               None, "RowGroupReader.read of every unit, no batches"),
        Figure("  reading layer alone: day from the log / stored",
               cost.layer("partition") / cost.layer("stored"), "x", "", None,
               f"(id, x, day from the log) / (id, x) {cost.layer('partition'):.2f}x"),
    ]


@dataclass
class TablesReport:
    """What ``lakeckpt bench tables`` measured."""

    tables: FeatureTables
    cost: FeatureCost
    figures: list[Figure]

    def to_json(self) -> dict[str, Any]:
        return {"bench": "tables", "shape": f"narrow table (id int64, x float32) and its "
                f"deletion-vector and partitioned copies: {self.tables.rows:,} rows",
                "machine": machine_note(), "tables": asdict(self.tables),
                "table_features": self.cost.to_json(),
                "figures": [f.to_json() for f in self.figures], "ratios": self.cost.ratios(),
                "passed": passed(self.figures)}


def run_tables_bench(*, rows: int, root: str | Path | None = None, rounds: int = 5,
                     min_seconds: float = 3.0, batch_size: int = 8192,
                     progress: Progress = quiet) -> TablesReport:
    """Build (or reuse under ``root``) the four tables and measure what the features cost."""
    with scratch(root, "lakeckpt-bench-tables-") as path:
        tables = ensure_feature_tables(path, rows)
        cost = measure_feature_cost(tables, batch_size=batch_size, rounds=rounds,
                                    min_seconds=min_seconds, progress=progress)
    return TablesReport(tables, cost, feature_figures(cost))


def format_report(report: TablesReport) -> str:
    """The figures as a plain-text table, like ``lakeckpt bench read``."""
    verdict = "all targets met" if report.to_json()["passed"] else "some targets MISSED"
    return "\n".join([*figure_lines(report.figures), "",
                      f"{report.tables.rows:,} rows a table; local disk, {machine_note()}; "
                      f"{verdict}"])
