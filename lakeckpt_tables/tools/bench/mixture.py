"""``lakeckpt bench mixture``: packing and mixing against plain reads of the same token column.

Figures (issue 21 item 5), in tokens per wall-clock second, CPU beside, each the median of the
ratios of interleaved rounds (NOTE [ interleaving ] in ``_common.py``):
- a packing reader (``pack_tokens=``) >= 0.9x an unpacked read of the same token column;
- a mixture of two packing sources >= 0.9x one packing source.

Tokens count what the loop hands to training: document tokens for the unpacked read, sequence
tokens (documents, their eos, none of the undelivered tail) for the packed ones.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa

from lakeckpt_tables.tools.bench._common import (
    Figure,
    LoopTime,
    Progress,
    figure_lines,
    interleaved_pass,
    interleaved_rounds,
    machine_note,
    no_loader_warnings,
    quiet,
    scratch,
    write_delta,
)

__all__ = ["DEFAULT_DOCS", "QUICK_DOCS", "MixtureBenchReport", "format_report",
           "run_mixture_bench"]

DEFAULT_DOCS = 100_000
QUICK_DOCS = 5_000
SEQ_LEN = 2048
SEQUENCES = 8  # per batch
MEAN_DOC = 200  # tokens: lengths uniform in [1, 400)
TARGET = 0.9
_ROW_GROUP_ROWS = 5_000


@dataclass(frozen=True)
class MixtureBenchReport:
    """What ``lakeckpt bench mixture`` measured."""

    figures: list[Figure]
    rates: dict[str, float]  # median tokens per wall-clock second, per loop
    rounds: int
    table: str

    def to_json(self) -> dict[str, Any]:
        return {"figures": [f.to_json() for f in self.figures], "rates": self.rates,
                "rounds": self.rounds, "table": self.table,
                "passed": all(f.passed is not False for f in self.figures)}


def build_table(path: Path, docs: int, *, seed: int = 0) -> None:
    """A Delta table of ``docs`` tokenized documents (``tokens``: list<int32>)."""
    rng = np.random.default_rng(seed)
    parts = []
    for lo in range(0, docs, 50_000):
        n = min(50_000, docs - lo)
        lengths = rng.integers(1, 2 * MEAN_DOC, n)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        values = pa.array(rng.integers(1, 50_000, int(offsets[-1])).astype(np.int32))
        parts.append(pa.table({"tokens": pa.ListArray.from_arrays(pa.array(offsets), values)}))
    write_delta(path, parts, row_group_rows=_ROW_GROUP_ROWS)


def _counted(batches: Iterable[Mapping[str, Any]], key: str) -> Iterator[Mapping[str, Any]]:
    """Each batch as its token count (``interleaved_pass`` counts ``batch[column].shape[0]``)."""
    for batch in batches:
        value = batch[key]
        n = value.values.numel() if hasattr(value, "offsets") else value.numel()
        yield {"tokens": SimpleNamespace(shape=(n,))}


def run_mixture_bench(*, docs: int = DEFAULT_DOCS, root: str | Path | None = None,
                      rounds: int = 5, min_seconds: float = 20.0,
                      progress: Progress = quiet) -> MixtureBenchReport:
    """Measure packing and mixing (see the module docstring)."""
    from lakeckpt_tables import DeltaSource, LakeDataset, Mixture

    with scratch(root, "lakeckpt-bench-mixture-") as where:
        path = where / f"tokens-{docs}"
        if not (path / "_delta_log").exists():
            progress(f"writing {docs:,} documents to {path}")
            build_table(path, docs)
        source = DeltaSource(str(path))
        rows_per_batch = SEQUENCES * SEQ_LEN // MEAN_DOC  # the same tokens per batch

        def packed() -> Any:
            return LakeDataset(source, pack_tokens="tokens", seq_len=SEQ_LEN, eos_id=0,
                               batch_size=SEQUENCES, shuffle=False, read_ahead=0)

        built = 0

        def loops() -> dict[str, Iterable[Mapping[str, Any]]]:
            nonlocal built
            unpacked = LakeDataset(source, columns=["tokens"], batch_size=rows_per_batch,
                                   shuffle=False, read_ahead=0)
            mixture = Mixture({"a": packed(), "b": packed()}, weights={"a": 1, "b": 1},
                              on_exhausted="stop")
            made = {"unpacked": _counted(unpacked, "tokens"),
                    "packed": _counted(packed(), "input_ids"),
                    "mixture": _counted(mixture, "input_ids")}
            # every other round runs the loops in the reverse turn: no loop always runs on the
            # caches the same other loop just left
            built += 1
            return made if built % 2 else dict(reversed(made.items()))

        # the tail
        logging.getLogger("lakeckpt_tables.reader.packing.planner").setLevel(logging.ERROR)
        with no_loader_warnings():
            expected = {n: t.rows for n, t in interleaved_pass(loops(), "tokens").items()}
        done: list[dict[str, LoopTime]] = interleaved_rounds(
            loops, "tokens", expected, rounds=rounds, min_seconds=min_seconds,
            on_round=lambda i, t: progress(
                f"round {i}: " + ", ".join(f"{n} {x.wall_rate / 1e6:.1f} M tokens/s"
                                           for n, x in t.items())))
    wall = {n: statistics.median(r[n].wall_rate for r in done) for n in expected}

    def ratio(name: str, a: str, b: str, target: str) -> Figure:
        # the median of each round's ratio: a round's loops ran side by side, under the same
        # load, so their ratio holds on a shared machine where the rates themselves swing
        value = statistics.median(r[a].wall_rate / r[b].wall_rate for r in done)
        cpu_ratio = statistics.median(r[a].cpu_rate / r[b].cpu_rate for r in done)
        return Figure(name, value, "x", f">= {TARGET}x", value >= TARGET,
                      f"median of paired rounds; {wall[a] / 1e6:.1f} vs {wall[b] / 1e6:.1f} M "
                      f"tokens/s wall clock (medians); CPU {cpu_ratio:.2f}x; {target}")

    figures = [
        ratio("packed / unpacked token read", "packed", "unpacked",
              f"seq_len {SEQ_LEN}, {SEQUENCES} sequences per batch"),
        ratio("mixture of two / one source", "mixture", "packed", "both packed, weights 1:1"),
    ]
    return MixtureBenchReport(figures, {n: round(v, 1) for n, v in wall.items()}, len(done),
                              str(path))


def format_report(report: MixtureBenchReport) -> str:
    """The figures as a plain-text table, like ``lakeckpt bench read``."""
    lines = figure_lines(report.figures)
    lines.append("")
    lines.append(f"token table: {report.table}; median of {report.rounds} interleaved rounds; "
                 f"local disk, {machine_note()}")
    return "\n".join(lines)
