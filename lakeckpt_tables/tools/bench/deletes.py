"""``lakeckpt bench deletes``: what ``deletes="honor"`` costs (issue 35 item 6).

- **No deletion**: a pass with the setting on, the table unchanged, against the same pass
  without it, both checkpointing every ``every`` batches (the setting's work is at
  checkpoints: a look at the log, a gather of the states), on both table shapes; wall-clock
  ratio of interleaved passes (NOTE [ interleaving ] in ``_common.py``), target >= 0.95x.
- **Applying a deletion**: deletion vectors deleting ``share`` of the rows of the narrow and the
  token table, committed after a pass began; the time rank 0 takes to observe them and
  re-plan the rest of the pass (``observe_deletions``: list the deleting version, map rows,
  take them out of the layouts), per deleted row.
"""

from __future__ import annotations

import shutil
import statistics
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lakeckpt_tables.tools.bench._common import (
    Figure,
    Progress,
    clock,
    figure_lines,
    interleaved_rounds,
    machine_note,
    no_loader_warnings,
    scratch,
)
from lakeckpt_tables.tools.bench._timing import no_dcp_warnings
from lakeckpt_tables.tools.bench.shapes import SHAPES, ensure_shape_table

__all__ = ["DEFAULT_ROWS", "DeletesReport", "format_report", "run_deletes_bench"]

DEFAULT_ROWS = 1_000_000
BATCH = 8192
EVERY = 20  # batches between checkpoints
SHARE = 0.01  # rows a deletion deletes


@dataclass
class DeletesReport:
    """The figures, and per shape the ratios of each round.

    Attributes:
        rows: rows of each table.
        ratios: per shape, wall-clock ratios (honor / pin) of the interleaved rounds.
        apply_ms: per shape, milliseconds to observe and take out one deleting commit.
        deleted: per shape, the rows it deleted.
        figures: the printed figures.
        machine: CPUs and load when measured.
    """

    rows: int
    ratios: dict[str, list[float]] = field(default_factory=dict)
    apply_ms: dict[str, float] = field(default_factory=dict)
    deleted: dict[str, int] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    machine: str = ""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["figures"] = [f.to_json() for f in self.figures]
        out["passed"] = all(f.passed is not False for f in self.figures)
        return out


class _Checkpointed:
    """One pass of a reader, saved every ``EVERY`` batches by a manager of its own (each pass
    a run of its own: ``run_id``)."""

    def __init__(self, table: str, columns: tuple[str, ...], root: Path, run_id: str,
                 deletes: str) -> None:
        self.args = (table, columns, root, run_id, deletes)

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        from torchdata.stateful_dataloader import StatefulDataLoader

        from lakeckpt_tables.checkpoint import CheckpointManager
        from lakeckpt_tables.reader.dataset import LakeDataset
        from lakeckpt_tables.sources.delta import DeltaSource

        table, columns, root, run_id, deletes = self.args
        loader = StatefulDataLoader(LakeDataset(DeltaSource(table), columns=list(columns),
                                                batch_size=BATCH, seed=1, deletes=deletes),
                                    batch_size=None)
        manager = CheckpointManager(root, run_id)
        for step, batch in enumerate(loader, 1):
            yield batch
            if step % EVERY == 0:
                manager.save(step, dataloader=loader)


class _Rounds:
    """Builds each round's two passes, each a run of its own."""

    def __init__(self, table: Any, root: Path) -> None:
        self.table, self.root, self.made = table, root, 0

    def __call__(self) -> dict[str, Any]:
        self.made += 1
        return {mode: _Checkpointed(self.table.uri, self.table.columns, self.root,
                                    f"{mode}-{self.made}", mode) for mode in ("honor", "pin")}


def run_deletes_bench(*, rows: int = DEFAULT_ROWS, root: str | Path | None = None,
                      rounds: int = 3, min_seconds: float = 0.0,
                      progress: Progress | None = None) -> DeletesReport:
    """Measure (see the module docstring)."""
    say = progress or (lambda _: None)
    report = DeletesReport(rows)
    with scratch(root, "lakeckpt-bench-deletes-") as base, no_dcp_warnings():
        for shape in SHAPES:
            table = ensure_shape_table(base, shape, rows)
            say(f"{shape}: {rows:,} rows, passes with deletes='honor' and 'pin'")
            checkpoints = base / f"ck-{shape}"
            shutil.rmtree(checkpoints, ignore_errors=True)  # runs of an earlier bench
            loops = _Rounds(table, checkpoints)
            times = interleaved_rounds(loops, "id", {"honor": rows, "pin": rows},
                                       rounds=rounds, min_seconds=min_seconds)
            report.ratios[shape] = [t["pin"].wall_s / t["honor"].wall_s for t in times]
            ms, deleted = _apply_cost(table, base / f"deleted-{shape}")
            report.apply_ms[shape], report.deleted[shape] = ms, deleted
            say(f"{shape}: ratio {statistics.median(report.ratios[shape]):.3f}x, "
                f"a deletion of {deleted:,} rows applied in {ms:.0f} ms")
    for shape, ratios in report.ratios.items():
        ratio = statistics.median(ratios)
        report.figures.append(Figure(
            f"{shape}: deletes='honor', no deletion / 'pin' (wall)", ratio, "x", ">= 0.95x",
            ratio >= 0.95, f"median of {len(ratios)} interleaved passes, a checkpoint every "
            f"{EVERY} batches of {BATCH}"))
    for shape, ms in report.apply_ms.items():
        deleted = report.deleted[shape]
        report.figures.append(Figure(
            f"{shape}: applying a deletion, per deleted row", 1000 * ms / max(deleted, 1),
            "us", "", None, f"{deleted:,} rows ({SHARE:.0%}) by deletion vectors: {ms:.0f} ms "
                            "to observe and re-plan"))
    report.machine = machine_note()
    return report


def _apply_cost(table: Any, path: Path) -> tuple[float, int]:
    """Deletion vectors deleting SHARE of a copy of ``table``, committed a few batches into a
    pass; the milliseconds ``observe_deletions`` takes, and the rows deleted."""
    from deltalake import DeltaTable
    from torchdata.stateful_dataloader import StatefulDataLoader

    from lakeckpt_tables.reader import ReaderState
    from lakeckpt_tables.reader.dataset import LakeDataset
    from lakeckpt_tables.reader.deletions import observe_deletions
    from lakeckpt_tables.sources.delta import DeltaSource
    from lakeckpt_tables.tools.bench.tables import write_deletion_vectors

    if path.exists():
        shutil.rmtree(path)
    shutil.copytree(table.uri, path)
    dataset = LakeDataset(DeltaSource(str(path)), columns=["id"], batch_size=BATCH, seed=1,
                          deletes="honor")
    loader = StatefulDataLoader(dataset, batch_size=None)
    it = iter(loader)
    with no_loader_warnings():
        for _ in range(3):
            next(it)
    state = ReaderState.from_dict(loader.state_dict()["dataset_state"])
    rng = np.random.default_rng(0)
    deleted: dict[str, Any] = {}
    for add in pa.table(DeltaTable(str(path)).get_add_actions(flatten=True)).to_pylist():
        n = pq.ParquetFile(path / add["path"]).metadata.num_rows
        deleted[add["path"]] = np.sort(rng.choice(n, max(1, int(n * SHARE)), replace=False))
    write_deletion_vectors(str(path), deleted)
    start = clock()
    _, details = observe_deletions(dataset, state)
    ms = 1000 * (clock() - start)
    return ms, sum(int(d["rows"]) for d in details)


def format_report(report: DeletesReport) -> str:
    lines = [f"deletes='honor': {report.rows:,} rows per table, both shapes"]
    lines += figure_lines(report.figures)
    lines.append(f"machine: {report.machine}")
    return "\n".join(lines)
