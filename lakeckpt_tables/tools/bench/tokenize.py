"""``lakeckpt bench tokenize``: a packing reader over a text column against the tokenizer alone.

Text tokenized as it is read (NOTE [ text tokenized on the fly ] in
``reader/packing/tokenize.py``), in wall-clock time over the same documents, in one process:
- the tokenizing reader (read the text column with pyarrow, tokenize, pack into sequences of
  ``seq_len``) >= 0.9x the tokenizer's own ``encode_batch`` over the same texts, already in
  memory, their ids taken out (``e.ids``: what any consumer of the ids does). Each figure is the
  median of the ratios of interleaved rounds, the two loops run one after the other in
  alternating turns (NOTE [ interleaving ] in ``_common.py``);
- the planning pass apart: the token counts a plan needs, computed once (every row group
  tokenized) and then read back from the cache (``token_cache``).

A tiny BPE tokenizer is trained on the synthetic documents first (nothing is downloaded).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lakeckpt_tables.tools.bench._common import (
    Figure,
    figure_lines,
    machine_note,
    quiet,
    scratch,
    write_delta,
)

__all__ = ["DEFAULT_DOCS", "QUICK_DOCS", "TokenizeBenchReport", "format_report", "register",
           "run", "run_tokenize_bench"]

DEFAULT_DOCS = 20_000
QUICK_DOCS = 2_000
SEQ_LEN = 512
SEQUENCES = 8
TARGET = 0.9
_ROW_GROUP_ROWS = 1_000


@dataclass(frozen=True)
class TokenizeBenchReport:
    """What ``lakeckpt bench tokenize`` measured."""

    figures: list[Figure]
    tokens: int
    docs: int
    rounds: int
    planning_s: float
    planning_cached_s: float
    table: str

    def to_json(self) -> dict[str, Any]:
        return {"figures": [f.to_json() for f in self.figures], "tokens": self.tokens,
                "docs": self.docs, "rounds": self.rounds, "planning_s": self.planning_s,
                "planning_cached_s": self.planning_cached_s, "table": self.table,
                "passed": all(f.passed is not False for f in self.figures)}


def build(path: Path, docs: int, *, seed: int = 0) -> Any:
    """A Delta table of ``docs`` English-like documents (``text``) and a BPE tokenizer
    trained on a sample of them."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    words = ["".join(rng.choice(letters, rng.integers(2, 9), p=None)) for _ in range(5_000)]
    lengths = rng.integers(20, 400, docs)  # words per document
    picks = rng.zipf(1.3, int(lengths.sum())) % len(words)
    texts, at = [], 0
    for n in lengths:
        texts.append(" ".join(words[i] for i in picks[at:at + n]))
        at += n
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(texts[:2_000], trainers.BpeTrainer(
        vocab_size=8_000, special_tokens=["[UNK]", "[EOS]"], show_progress=False))
    if not (path / "_delta_log").exists():
        write_delta(path, [pa.table({"text": texts})], row_group_rows=_ROW_GROUP_ROWS)
    return tokenizer


def run_tokenize_bench(*, docs: int = DEFAULT_DOCS, root: str | Path | None = None,
                       rounds: int = 5, progress: Any = quiet) -> TokenizeBenchReport:
    """Measure the tokenizing reader (see the module docstring)."""
    from lakeckpt_tables import DeltaSource, LakeDataset

    logging.getLogger("lakeckpt_tables.reader.packing.planner").setLevel(logging.ERROR)
    with scratch(root, "lakeckpt-bench-tokenize-") as where:
        path = where / f"text-{docs}"
        progress(f"writing {docs:,} documents to {path} and training a BPE tokenizer")
        tokenizer = build(path, docs)
        source = DeltaSource(str(path))
        files = list(source.snapshot().units)
        texts = [pq.ParquetFile(u.path).read_row_group(u.row_group, ["text"])["text"]
                 .to_pylist() for u in files]  # the baseline's documents, in memory
        cache = where / f"token-counts-{time.time_ns()}"

        def reader() -> Any:
            return LakeDataset(source, pack_tokens="text", tokenizer=tokenizer,
                               token_cache=str(cache), seq_len=SEQ_LEN, eos_id=1,
                               batch_size=SEQUENCES, shuffle=False)

        started = time.perf_counter()
        reader().planner.stream_sizes()  # tokenizes every row group once, keeps the counts
        planning = time.perf_counter() - started
        started = time.perf_counter()
        reader().planner.stream_sizes()
        cached = time.perf_counter() - started

        def encode() -> int:
            return sum(len(e.ids) for group in texts
                       for e in tokenizer.encode_batch(group, add_special_tokens=False))

        planned = reader()  # pinned and planned once, like a training job's reader

        def read() -> int:
            return sum(int(b["input_ids"].numel()) for b in planned)

        def fast() -> int:  # what the reader calls: the ids without character offsets
            return sum(len(e.ids) for group in texts
                       for e in tokenizer.encode_batch_fast(group, add_special_tokens=False))

        tokens = encode()
        loops = (("encode", encode), ("fast", fast), ("reader", read))
        done: list[dict[str, tuple[float, float]]] = []
        for i in range(rounds):
            times: dict[str, tuple[float, float]] = {}
            for name, loop in loops[:: 1 if i % 2 else -1]:
                wall, proc = time.perf_counter(), time.process_time()
                loop()
                times[name] = (time.perf_counter() - wall, time.process_time() - proc)
            done.append(times)
            progress(f"round {i + 1}: " + ", ".join(f"{n} {t[0]:.2f} s"
                                                    for n, t in times.items()))

    def ratio(name: str, base: str, target: bool) -> Figure:
        value = statistics.median(r[base][0] / r["reader"][0] for r in done)
        cpu = statistics.median(r[base][1] / r["reader"][1] for r in done)
        return Figure(name, value, "x", f">= {TARGET}x" if target else "",
                      value >= TARGET if target else None,
                      f"same {docs:,} documents ({tokens:,} tokens), wall clock, median of "
                      f"{rounds} paired rounds; CPU {cpu:.2f}x; the reader reads Parquet, "
                      f"tokenizes and packs to {SEQ_LEN}")

    figures = [ratio("tokenizing reader / encode_batch", "encode", True),
               ratio("tokenizing reader / encode_batch_fast", "fast", False)]
    return TokenizeBenchReport(figures, tokens, docs, rounds, round(planning, 3),
                               round(cached, 4), str(path))


def format_report(report: TokenizeBenchReport) -> str:
    lines = figure_lines(report.figures)
    lines.append("")
    lines.append(f"planning pass (token counts of every row group): {report.planning_s:.2f} s "
                 f"tokenizing, {report.planning_cached_s * 1000:.1f} ms from the cache")
    lines.append(f"text table: {report.table}; local disk, {machine_note()}")
    return "\n".join(lines)


def register(sub: Any) -> None:
    """Add ``tokenize`` to the ``lakeckpt bench`` subcommands ``sub``."""
    parser = sub.add_parser("tokenize", help="text tokenized as it is read vs encode_batch",
                            description=__doc__.split("\n\n")[1] if __doc__ else None)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--docs", type=int, default=DEFAULT_DOCS,
                      help=f"documents of the text table (default {DEFAULT_DOCS:,})")
    size.add_argument("--quick", action="store_const", dest="docs", const=QUICK_DOCS,
                      help=f"a fast smoke run on {QUICK_DOCS:,} documents")
    parser.add_argument("--dir", metavar="PATH", default=None,
                        help="keep the table under PATH (default: temporary)")
    parser.add_argument("--rounds", type=int, default=5, help="paired rounds (default 5)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    """Run ``lakeckpt bench tokenize``; 0 when the target is met."""
    import json

    def progress(line: str) -> None:
        print(f"  {line}", file=sys.stderr, flush=True)

    report = run_tokenize_bench(docs=args.docs, root=args.dir, rounds=args.rounds,
                                progress=progress)
    data = report.to_json()
    print(json.dumps(data, indent=2) if args.json else format_report(report))
    return 0 if data["passed"] else 1
