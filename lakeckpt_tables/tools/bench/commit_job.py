"""The commit-latency job of ``lakeckpt bench checkpoint``: what every rank of it runs.

A tiny model trained from a ``StatefulDataLoader`` over a Delta table of small row groups,
saved every few steps through a timed :class:`CheckpointManager` (NOTE [ what the commit figure
times ] in :mod:`.checkpoint`). Run in this process as a world of one, or per rank under
``torchrun``: ``python -m torch.distributed.run --standalone --nproc-per-node=N -m
lakeckpt_tables.tools.bench.commit_job --spec JSON --out PATH`` (rank 0 writes the result to
PATH).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from lakeckpt_tables.ledger import DEFAULT_LEDGER_DIR, CheckpointRecord, Ledger
from lakeckpt_tables.reader.dataset import LakeDataset
from lakeckpt_tables.sources.delta import DeltaSource
from lakeckpt_tables.tools.bench._common import write_delta
from lakeckpt_tables.tools.bench._timing import TimedManager, clock, no_dcp_warnings, train_step
from lakeckpt_tables.tools.bench.data import synthetic_parts

__all__ = ["COMMIT_ROW_GROUP_ROWS", "COMMIT_TABLE_ROWS", "CommitJobSpec", "LedgerKind",
           "drop_iceberg_ledger", "ensure_commit_table", "main", "run_commit_job"]

COMMIT_TABLE_ROWS = 262_144
COMMIT_ROW_GROUP_ROWS = 256
"""Small row groups, so that each worker consumes from a few row groups between checkpoints:
every worker then contributes a few consumption records to every commit."""

LedgerKind = Literal["delta", "iceberg-sqlite", "iceberg-postgres"]
_RUN_ID = "bench"

# ------------------------------------------------------------------------- commit table


def ensure_commit_table(root: str | Path, rows: int = COMMIT_TABLE_ROWS,
                        row_group_rows: int = COMMIT_ROW_GROUP_ROWS) -> str:
    """A Delta table of ``rows`` rows (``id``, ``x``) in row groups of ``row_group_rows``.

    Built under ``root/commit-<rows>-<row_group_rows>`` in 4 files, or reused when a previous
    run left a table of that many rows there.
    """
    path = Path(root) / f"commit-{rows}-{row_group_rows}"
    if (path / "_delta_log").is_dir():
        with contextlib.suppress(Exception):  # an unreadable leftover is rebuilt
            if DeltaSource(str(path)).snapshot().rows == rows:
                return str(path)
    write_delta(path, synthetic_parts(rows, 4), row_group_rows=row_group_rows)
    return str(path)


# ---------------------------------------------------------------------------- the job


@dataclass(frozen=True)
class CommitJobSpec:
    """One commit-latency job: what every rank runs (see :func:`run_commit_job`).

    Attributes:
        table: the Delta table trained from.
        root: checkpoint root of the job (the Delta ledger lives in ``root/_ledger``).
        ledger: which ledger backend.
        saves: measured saves.
        warmup: saves before the measured ones (first DCP save, ledger creation...), not
            counted in the latencies but counted in the ledger bytes.
        steps_between: training steps between saves.
        batch_size: rows per batch on every rank.
        workers: DataLoader workers per rank.
        pg_uri: the PostgreSQL SQLAlchemy URI, for ``iceberg-postgres``.
        namespace: the Iceberg namespace of the ledger table (dropped at the end on PostgreSQL).
    """

    table: str
    root: str
    ledger: LedgerKind = "delta"
    saves: int = 50
    warmup: int = 2
    steps_between: int = 10
    batch_size: int = 64
    workers: int = 2
    pg_uri: str | None = None
    namespace: str = "lakeckpt_bench"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> CommitJobSpec:
        return CommitJobSpec(**json.loads(text))


def _tree(path: Path) -> tuple[int, int]:
    """(bytes, files) under ``path``."""
    total = files = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(dirpath, name))
                files += 1
    return total, files


def _footprint(spec: CommitJobSpec) -> dict[str, int]:
    """What the ledger holds on disk now: data and log/metadata bytes, and files."""
    root = Path(spec.root)
    if spec.ledger == "delta":
        ledger = root / DEFAULT_LEDGER_DIR
        total, files = _tree(ledger)
        log_bytes, log_files = _tree(ledger / "_delta_log")
        return {"bytes": total, "files": files, "data_bytes": total - log_bytes,
                "data_files": files - log_files, "log_bytes": log_bytes, "log_files": log_files}
    warehouse = root / "warehouse"
    total, files = _tree(warehouse)
    meta_bytes = meta_files = 0
    for meta in warehouse.rglob("metadata"):
        b, f = _tree(meta)
        meta_bytes, meta_files = meta_bytes + b, meta_files + f
    catalog = root / "catalog.db"
    if catalog.exists():
        meta_bytes += catalog.stat().st_size
        total += catalog.stat().st_size
    return {"bytes": total, "files": files, "data_bytes": total - meta_bytes,
            "data_files": files - meta_files, "log_bytes": meta_bytes, "log_files": meta_files}


def _live_bytes(spec: CommitJobSpec) -> int | None:
    """Delta: bytes of the data files the current snapshot names, plus the whole log."""
    if spec.ledger != "delta":
        return None
    import pyarrow as pa
    from deltalake import DeltaTable

    path = Path(spec.root) / DEFAULT_LEDGER_DIR
    adds = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True))
    return int(sum(adds.column("size_bytes").to_pylist())) + _tree(path / "_delta_log")[0]


def _iceberg_catalog(spec: CommitJobSpec) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    warehouse = Path(spec.root) / "warehouse"
    warehouse.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{Path(spec.root) / 'catalog.db'}"
    if spec.ledger == "iceberg-postgres":
        if spec.pg_uri is None:
            raise ValueError("an iceberg-postgres commit job needs pg_uri")
        uri = spec.pg_uri
    return SqlCatalog("lakeckpt_bench", uri=uri, warehouse=warehouse.as_uri())


def _open_ledger(spec: CommitJobSpec) -> Ledger | None:
    """The job's ledger on rank 0; None means the default Delta ledger under the root."""
    if spec.ledger == "delta":
        return None
    from lakeckpt_tables.ledger import IcebergLedger

    return IcebergLedger(f"{spec.namespace}.ledger", catalog=_iceberg_catalog(spec))


def drop_iceberg_ledger(spec: CommitJobSpec) -> None:
    """Drop the job's Iceberg ledger and namespace (PostgreSQL outlives the job)."""
    catalog = _iceberg_catalog(spec)
    with contextlib.suppress(Exception):
        catalog.drop_table(f"{spec.namespace}.ledger")
    with contextlib.suppress(Exception):
        catalog.drop_namespace(spec.namespace)


def run_commit_job(spec: CommitJobSpec) -> dict[str, Any] | None:
    """Train a tiny model on this rank and save ``warmup + saves`` times; time the commits.

    Runs in a process of a ``torchrun`` job (gloo) or alone as a world of one. Every rank
    trains from a ``StatefulDataLoader`` with ``spec.workers`` workers, so every commit holds
    consumption records of every (rank, worker).

    Returns:
        On rank 0, plain JSON: per measured save the phase-2 ``commit`` and its ``gather``,
        ``ledger_commit`` and ``broadcast``, the whole ``save`` and its ``retire`` seconds, and
        the consumption ``records``; the ledger's footprint
        before the first save, after the last and after ``compact()``; reader state and
        model bytes per checkpoint. None on other ranks.
    """
    import torch.distributed as dist
    from torchdata.stateful_dataloader import StatefulDataLoader

    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    torch.manual_seed(0)
    features = 16
    model = nn.Sequential(nn.Linear(features, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dataset = LakeDataset(DeltaSource(spec.table), columns=["x"], batch_size=spec.batch_size,
                          seed=0, epochs=1000, shuffle_window=4)
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=spec.workers)
    manager = TimedManager(spec.root, _RUN_ID, ledger=_open_ledger(spec) if rank == 0 else None,
                            keep_last=2)
    before = _footprint(spec) if rank == 0 else {}
    saves: list[float] = []
    last: CheckpointRecord | None = None
    step = 0
    with no_dcp_warnings():
        batches = iter(loader)
        for _ in range(spec.warmup + spec.saves):
            for _ in range(spec.steps_between):
                train_step(model, optimizer, next(batches)["x"], features, distributed)
            step += spec.steps_between
            t0 = clock()
            last = manager.save(step, model=model, optimizer=optimizer, dataloader=loader)
            saves.append(clock() - t0)
        manager.wait()
    del batches
    if rank != 0:
        return None
    assert last is not None and manager.ledger is not None
    committed = spec.warmup + spec.saves
    after = _footprint(spec)
    t0 = clock()
    manager.ledger.compact()
    compact_s = clock() - t0
    compacted = _footprint(spec)
    live = _live_bytes(spec)
    w = spec.warmup
    t = manager.timings
    return {
        "ledger": spec.ledger, "ranks": world, "workers": spec.workers,
        "saves": spec.saves, "committed": committed,
        "commit_s": t["commit"][w:], "ledger_commit_s": t["ledger_commit"][w:],
        "gather_s": t["gather"][w:], "broadcast_s": t["broadcast"][w:],
        "save_s": saves[w:], "retire_s": t["retire"][w:], "records": manager.records[w:],
        "reader_state_bytes": len(last.reader_state.encode()),
        "model_bytes": sum(int(d["bytes"]) for d in last.manifest.values()),
        "before": before, "after": after, "compacted": compacted, "live_after_compact": live,
        "compact_s": compact_s,
    }


def main(argv: list[str] | None = None) -> int:
    """One rank of a commit job under ``torchrun`` (or alone)."""
    import torch.distributed as dist

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="CommitJobSpec as JSON")
    parser.add_argument("--out", required=True, help="where rank 0 writes the result (JSON)")
    args = parser.parse_args(argv)
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    try:
        result = run_commit_job(CommitJobSpec.from_json(args.spec))
        if result is not None:
            tmp = f"{args.out}.tmp"
            with open(tmp, "w") as f:
                json.dump(result, f)
            os.replace(tmp, args.out)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
