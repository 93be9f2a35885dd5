"""``lakeckpt bench``: measure the figures of DESIGN.md ("Figures we hold ourselves to").

``lakeckpt bench read [--rows N | --quick] [--dir PATH] [--json]``: reader throughput against
the raw pyarrow-to-torch limit, resume time to first batch, reader state size, shuffle quality,
the cost of deletion vectors and partition columns, and the reader under StatefulDataLoader at
0 and 2 workers across batch sizes.

``lakeckpt bench checkpoint [--quick] [--dir PATH] [--json]``: ledger commit latency for 1, 4
and 8 ranks (Delta; Iceberg on SQLite and PostgreSQL for one rank), step-time overhead of sync
and async saves, reader tracking cost, and ledger bytes per checkpoint.

``lakeckpt bench follow [--quick] [--poll-interval S] [--dir PATH] [--json]``: follow mode's
delay from an append's commit to its first row in a batch (p50/p99), and the cost of forming a
segment over a backlog of 10,000 commits (1,000 with ``--quick``).

``lakeckpt bench tables [--rows N] [--dir PATH] [--json]``: the cost of deletion vectors and
partition columns alone (also part of ``bench read``).

``lakeckpt bench deletes [--rows N] [--rounds R] [--dir PATH] [--json]``: a pass with
``deletes="honor"`` and no deletion against the same pass with ``"pin"`` (both shapes, a
checkpoint every 20 batches), and the cost of applying a deletion per deleted row.

``lakeckpt bench peers [--rows N | --quick] [--shapes narrow,tokens] [--workers 0] [--json]``:
a narrow numeric table and a token table, each read by raw pyarrow, StatefulDataLoader over a
plain IterableDataset (the ceiling), the library and Hugging Face datasets streaming; wall
clock, medians of paired rounds; resume at 0/50/90% of a pass.

``lakeckpt bench workers [--shape tokens] [--workers 0,2,4,8] [--batch-sizes 1024,8192]``: the
library at each worker count beside the raw read, and what one batch costs (decode, copy,
hand-off): when workers pay.

``lakeckpt bench scale [--ranks 256] [--workers 8] [--files N] [--row-groups R] [--saves 50]
[--quick] [--json]``: a 256-rank job simulated in one process over a metadata-only table: plan
time and memory per rank, reader state size, commit p50/p99, elastic restore, ledger size.

``lakeckpt bench tokenize [--docs N | --quick] [--rounds R] [--json]``: a packing reader over a
text column, tokenized as it is read, against the tokenizer's own ``encode_batch`` over the same
documents; the planning pass (token counts) apart, computed and then from the cache.

``lakeckpt bench compare NEW.json [--baseline B]``: every ratio of a ``--json`` report that fell
more than 10% below the committed baseline (``baselines/``); exit status 1 when any fell.

Every throughput figure is wall-clock time (CPU time beside it), and names its table's shape.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from lakeckpt_tables.tools.bench import compare
from lakeckpt_tables.tools.bench._common import scratch

__all__ = ["register", "run"]


def register(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench`` subcommands to ``parser``."""
    from lakeckpt_tables.tools.bench.read import DEFAULT_ROWS, QUICK_ROWS

    sub = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    read = sub.add_parser("read", help="reader throughput, resume time and state size",
                          description="Reader throughput as a ratio to the raw pyarrow-to-torch "
                          "batch limit, time to first batch after resuming at 0/50/90%, "
                          "the reader state size for a simulated 10 TB table, 128 ranks x 8 "
                          "workers, shuffle quality on one large row group, what deletion "
                          "vectors and partition columns cost, and the reader under "
                          "StatefulDataLoader at 0 and 2 workers across batch sizes.")
    _size_arguments(read, "the synthetic table", DEFAULT_ROWS, QUICK_ROWS)
    read.add_argument("--dir", metavar="PATH", default=None,
                      help="keep the synthetic table under PATH and reuse it on later runs "
                      "(default: a temporary directory, removed afterwards)")
    read.add_argument("--rounds", type=_positive, default=5,
                      help="least interleaved throughput rounds (default 5)")
    read.add_argument("--min-seconds", type=float, default=3.0, metavar="S",
                      help="keep adding throughput rounds (up to 50) until S seconds are spent "
                      "(default 3)")
    read.add_argument("--resume-rounds", type=_positive, default=5, metavar="N",
                      help="resume measurements per position, median kept (default 5)")
    read.add_argument("--state-tb", type=float, default=10.0, metavar="TB",
                      help="size of the simulated table of the reader-state figures "
                      "(default 10 TB)")
    read.add_argument("--loader-rounds", type=_positive, default=3, metavar="N",
                      help="rounds of the 0/2-worker StatefulDataLoader grid (default 3)")
    read.add_argument("--json", action="store_true", help="print the report as JSON")
    read.add_argument("--uri", default=None, help="measure on an object store instead: the "
                      "Delta table at URI (created if absent): requests per row group, footer "
                      "reads, throughput against pyarrow.dataset on the same endpoint")
    read.add_argument("--storage-options", default=None, metavar="JSON",
                      help="storage options for --uri, as a JSON object")
    read.add_argument("--latency-ms", type=int, default=0, metavar="MS",
                      help="with --uri on the local server: also measure with MS ms injected "
                      "per request")

    ckpt = sub.add_parser("checkpoint", help="ledger commit latency, save overhead, ledger bytes",
                          description="Ledger commit latency p50/p99 for 1, 4 and 8 torchrun "
                          "ranks, step-time overhead of sync and async saves, reader tracking "
                          "cost, and ledger bytes per checkpoint.")
    ckpt.add_argument("--quick", action="store_true",
                      help="a smoke run of ~30 s: 1 and 2 ranks, 8 saves each, 3 short "
                      "overhead rounds")
    ckpt.add_argument("--dir", metavar="PATH", default=None,
                      help="keep the source tables under PATH and reuse them on later runs "
                      "(default: a temporary directory, removed afterwards)")
    ckpt.add_argument("--json", action="store_true", help="print the report as JSON")

    from lakeckpt_tables.tools.bench.follow import (
        DEFAULT_BACKLOG,
        DEFAULT_COMMITS,
        DEFAULT_INTERVAL,
        DEFAULT_POLL,
        QUICK_BACKLOG,
        QUICK_COMMITS,
    )

    follow = sub.add_parser("follow", help="follow mode: append-to-batch latency, backlog cost",
                            description="Follow mode: the delay from an append's commit to its "
                            "first row in a batch (p50/p99, in-process and in a DataLoader "
                            "worker), and the time to form a segment over a backlog of "
                            "commits.")
    follow.add_argument("--quick", action="store_true",
                        help=f"{QUICK_COMMITS} commits per latency run (default "
                        f"{DEFAULT_COMMITS}) and a backlog of {QUICK_BACKLOG:,} commits "
                        f"(default {DEFAULT_BACKLOG:,})")
    follow.add_argument("--poll-interval", type=_seconds, default=DEFAULT_POLL, metavar="S",
                        help=f"the follower's poll_interval (default {DEFAULT_POLL} s)")
    follow.add_argument("--interval", type=_seconds, default=DEFAULT_INTERVAL, metavar="S",
                        help="mean seconds between the writer's commits (default "
                        f"{DEFAULT_INTERVAL})")
    follow.add_argument("--commits", type=_positive, default=None,
                        help="commits per latency run (overrides --quick)")
    follow.add_argument("--backlog", type=_positive, default=None,
                        help="commits of the backlog table (overrides --quick)")
    follow.add_argument("--dir", metavar="PATH", default=None,
                        help="keep the backlog table under PATH and reuse it on later runs "
                        "(default: a temporary directory, removed afterwards)")
    follow.add_argument("--json", action="store_true", help="print the report as JSON")

    from lakeckpt_tables.tools.bench.audit import (
        BATCH,
        DEFAULT_CHECKPOINTS,
        LEDGERS,
        QUICK_CHECKPOINTS,
        RECORDS,
    )

    audit = sub.add_parser("audit", help="progress, verify, maintain and commit latency on a "
                           "big ledger",
                           description="A ledger of 100,000 checkpoints x 64 consumption "
                           "records (or --records in all): maintain, then time progress, verify "
                           "of one run, and commit latency; the CLI's wall time, CPU time and "
                           "peak memory for each command.")
    audit.add_argument("--checkpoints", type=_positive, default=DEFAULT_CHECKPOINTS,
                       help=f"checkpoints in the ledger (default {DEFAULT_CHECKPOINTS:,})")
    audit.add_argument("--records", type=_positive, default=None,
                       help="consumption records in all (sets --checkpoints to RECORDS / "
                       "--per-checkpoint), e.g. 1000000")
    audit.add_argument("--per-checkpoint", type=_positive, default=None,
                       help=f"consumption records per checkpoint (default {RECORDS}; 100 with "
                       "--records)")
    audit.add_argument("--ledger", choices=LEDGERS, default="delta",
                       help="the ledger's table format (default delta)")
    audit.add_argument("--batch", type=_positive, default=BATCH,
                       help=f"checkpoints per commit while building (default {BATCH}): the "
                       "files maintain compacts")
    audit.add_argument("--quick", action="store_const", dest="checkpoints",
                       const=QUICK_CHECKPOINTS, help=f"{QUICK_CHECKPOINTS:,} checkpoints")
    audit.add_argument("--dir", metavar="PATH", default=None,
                       help="build the ledger under PATH (default: a temporary directory)")
    audit.add_argument("--json", action="store_true", help="print the report as JSON")
    _register_peers(sub)
    _register_deletes(sub)
    _register_workers(sub)
    _register_mixture(sub)
    compare.register(sub)
    from lakeckpt_tables.tools.bench import planning

    planning.register(sub)
    from lakeckpt_tables.tools.bench import scale, tokenize

    scale.register(sub)
    tokenize.register(sub)
    from lakeckpt_tables.tools.bench.read import FEATURE_ROWS

    tables = sub.add_parser("tables", help="what deletion vectors and partition columns cost",
                            description="The cost figures of `bench read` alone (issue 9 item "
                            "8): the reader over the same rows with 1% of them deleted by "
                            "deletion vectors, and with a partition column from the log, "
                            "against the same data without them; CPU-time ratios of "
                            "interleaved passes.")
    tables.add_argument("--rows", type=_positive, default=FEATURE_ROWS,
                        help=f"rows of each table (default {FEATURE_ROWS:,})")
    tables.add_argument("--rounds", type=_positive, default=5,
                        help="least interleaved rounds (default 5)")
    tables.add_argument("--min-seconds", type=float, default=3.0, metavar="S",
                        help="keep adding rounds (up to 50) until S seconds are spent "
                        "(default 3)")
    tables.add_argument("--dir", metavar="PATH", default=None,
                        help="keep the tables under PATH and reuse them (default: temporary)")
    tables.add_argument("--json", action="store_true", help="print the report as JSON")


def _register_deletes(sub: Any) -> None:
    from lakeckpt_tables.tools.bench.deletes import DEFAULT_ROWS

    deletes = sub.add_parser("deletes", help="what deletes='honor' costs: a pass with no "
                             "deletion, and applying one per deleted row",
                             description="A pass with deletes='honor' and no deletion against "
                             "the same pass with 'pin' (a checkpoint every 20 batches; both "
                             "table shapes; wall-clock ratio of interleaved passes, target "
                             ">= 0.95x), and the time to observe and take out a deletion "
                             "vector commit deleting 1% of the rows, per deleted row.")
    deletes.add_argument("--rows", type=_positive, default=DEFAULT_ROWS,
                         help=f"rows of each table (default {DEFAULT_ROWS:,})")
    deletes.add_argument("--rounds", type=_positive, default=3,
                         help="least interleaved rounds (default 3)")
    deletes.add_argument("--dir", metavar="PATH", default=None,
                         help="keep the tables under PATH and reuse them (default: temporary)")
    deletes.add_argument("--json", action="store_true", help="print the report as JSON")


def _deletes(args: argparse.Namespace) -> int:
    from lakeckpt_tables.tools.bench.deletes import format_report, run_deletes_bench

    report = run_deletes_bench(rows=args.rows, root=args.dir, rounds=args.rounds,
                               progress=_progress)
    return _emit(report, args.json, format_report)


def _register_peers(sub: Any) -> None:
    from lakeckpt_tables.tools.bench.peers import QUICK_ROWS
    from lakeckpt_tables.tools.bench.shapes import (
        DEFAULT_FILES,
        DEFAULT_ROW_GROUPS,
        DEFAULT_ROWS,
        SHAPES,
    )

    peers = sub.add_parser("peers", help="the library beside raw pyarrow, a plain loader, HF",
                           description="A narrow numeric table and a token table, each read by "
                           "raw pyarrow, StatefulDataLoader over a plain IterableDataset (the "
                           "ceiling), the library and Hugging Face datasets streaming (the "
                           "'bench' extra); wall clock, medians of paired rounds; resume at 0, "
                           "50 and 90% of a pass.")
    _size_arguments(peers, "each table", DEFAULT_ROWS, QUICK_ROWS)
    _shape_arguments(peers, DEFAULT_FILES, DEFAULT_ROW_GROUPS)
    peers.add_argument("--shapes", type=_names(SHAPES), default=tuple(SHAPES),
                       help=f"comma-separated table shapes (default {','.join(SHAPES)})")
    peers.add_argument("--batch-size", type=_positive, default=1024, help="rows per batch")
    peers.add_argument("--rounds", type=_positive, default=3, help="rounds (median taken)")
    peers.add_argument("--workers", type=_counts, default=(0,),
                       help="comma-separated DataLoader worker counts (default 0)")
    peers.add_argument("--no-resume", dest="resume", action="store_false",
                       help="skip the resume figures")
    peers.add_argument("--json", action="store_true", help="print the report as JSON")
    peers.add_argument("--json-out", metavar="FILE", default=None,
                       help="also write the report as JSON to FILE")


def _register_mixture(sub: Any) -> None:
    from lakeckpt_tables.tools.bench.mixture import DEFAULT_DOCS, QUICK_DOCS

    mixture = sub.add_parser("mixture", help="packed sequences and mixtures: tokens/s",
                             description="Tokens per second, wall clock: a packing reader "
                             "against the unpacked read of the same token column, and a "
                             "mixture of two sources against one.")
    size = mixture.add_mutually_exclusive_group()
    size.add_argument("--docs", type=_positive, default=DEFAULT_DOCS,
                      help=f"documents of the token table (default {DEFAULT_DOCS:,})")
    size.add_argument("--quick", action="store_const", dest="docs", const=QUICK_DOCS,
                      help=f"a fast smoke run on {QUICK_DOCS:,} documents")
    mixture.add_argument("--dir", metavar="PATH", default=None,
                         help="keep the table under PATH and reuse it (default: temporary)")
    mixture.add_argument("--rounds", type=_positive, default=5,
                         help="least interleaved rounds (default 5)")
    mixture.add_argument("--min-seconds", type=float, default=20.0, metavar="S",
                         help="keep adding rounds (up to 50) until S seconds are spent "
                         "(default 20: a round's wall-clock ratio swings 0.7-1.4 under load)")
    mixture.add_argument("--json", action="store_true", help="print the report as JSON")


def _mixture(args: argparse.Namespace) -> int:
    from lakeckpt_tables.tools.bench.mixture import format_report, run_mixture_bench

    report = run_mixture_bench(docs=args.docs, root=args.dir, rounds=args.rounds,
                               min_seconds=args.min_seconds, progress=_progress)
    return _emit(report, args.json, format_report)


def _register_workers(sub: Any) -> None:
    from lakeckpt_tables.tools.bench.shapes import SHAPES
    from lakeckpt_tables.tools.bench.workers import BATCH_SIZES, WORKERS

    workers = sub.add_parser("workers", help="when DataLoader workers pay: grid and per-batch "
                             "costs", description="The library under StatefulDataLoader and "
                             "ChunkedLoader at each worker count beside the raw read, whole "
                             "passes in wall clock, and what one batch costs: decode, the "
                             "library's work, the copy into shared memory, the main process's "
                             "hand-off.")
    workers.add_argument("--shape", choices=tuple(SHAPES), default="tokens",
                         help="table shape (default tokens)")
    workers.add_argument("--rows", type=_positive, default=1_000_000,
                         help="rows of the table (default 1,000,000)")
    _shape_arguments(workers, 8, 64)
    workers.add_argument("--workers", type=_counts, default=WORKERS,
                         help=f"comma-separated worker counts (default "
                         f"{','.join(map(str, WORKERS))})")
    workers.add_argument("--batch-sizes", type=_counts, default=BATCH_SIZES,
                         help=f"comma-separated batch sizes (default "
                         f"{','.join(map(str, BATCH_SIZES))})")
    workers.add_argument("--rounds", type=_positive, default=3, help="rounds (median taken)")
    workers.add_argument("--no-chunked", dest="chunked", action="store_false",
                         help="leave ChunkedLoader out")
    workers.add_argument("--json", action="store_true", help="print the report as JSON")


def _size_arguments(parser: argparse.ArgumentParser, what: str, rows: int, quick: int) -> None:
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--rows", type=_positive, default=rows,
                      help=f"rows of {what} (default {rows:,})")
    size.add_argument("--quick", action="store_const", dest="rows", const=quick,
                      help=f"a fast smoke run on {quick:,} rows")


def _shape_arguments(parser: argparse.ArgumentParser, files: int, row_groups: int) -> None:
    parser.add_argument("--files", type=_positive, default=files,
                        help=f"data files of each table (default {files})")
    parser.add_argument("--row-groups", type=_positive, default=row_groups,
                        help=f"row groups of each table in all (default {row_groups})")
    parser.add_argument("--dir", metavar="PATH", default=None,
                        help="keep the tables under PATH and reuse them (default: temporary)")


def run(args: argparse.Namespace) -> int:
    """Run the chosen benchmark; exit status 0 when every target is met, 1 otherwise."""
    if args.bench == "read":
        return _read(args)
    if args.bench == "checkpoint":
        return _checkpoint(args)
    if args.bench == "follow":
        return _follow(args)
    if args.bench == "audit":
        return _audit(args)
    if args.bench == "tables":
        return _tables(args)
    if args.bench == "deletes":
        return _deletes(args)
    if args.bench == "peers":
        return _peers(args)
    if args.bench == "workers":
        return _workers(args)
    if args.bench == "mixture":
        return _mixture(args)
    if args.bench == "compare":
        return compare.run(args)
    if args.bench == "planning":
        from lakeckpt_tables.tools.bench import planning

        return planning.run(args)
    if args.bench == "scale":
        from lakeckpt_tables.tools.bench import scale

        return scale.run(args)
    if args.bench == "tokenize":
        from lakeckpt_tables.tools.bench import tokenize

        return tokenize.run(args)
    raise AssertionError(f"unknown bench {args.bench!r}")  # argparse restricts the choices


def _progress(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


def _emit(report: Any, as_json: bool, text: Callable[[Any], str]) -> int:
    """Print ``report`` (JSON or text); exit status 0 when every target is met."""
    data = report.to_json()
    print(json.dumps(data, indent=2) if as_json else text(report))
    return 0 if data["passed"] else 1


def _read(args: argparse.Namespace) -> int:
    from lakeckpt_tables.tools.bench.read import format_report, run_read_bench

    if args.uri:
        return _read_store(args)
    report = run_read_bench(rows=args.rows, root=args.dir, rounds=args.rounds,
                            min_seconds=args.min_seconds, resume_rounds=args.resume_rounds,
                            state_bytes=int(args.state_tb * 10**12),
                            loader_rounds=args.loader_rounds, progress=_progress)
    return _emit(report, args.json, format_report)


def _read_store(args: argparse.Namespace) -> int:
    from lakeckpt_tables.tools.bench.storage import format_report, run_store_read_bench

    options = json.loads(args.storage_options) if args.storage_options else None
    report = run_store_read_bench(args.uri, options, rows=args.rows, rounds=args.rounds,
                                  latency_ms=args.latency_ms, progress=_progress)
    return _emit(report, args.json, format_report)


def _checkpoint(args: argparse.Namespace) -> int:
    from lakeckpt_tables.tools.bench.checkpoint import format_report, run_checkpoint_bench

    report = run_checkpoint_bench(quick=args.quick, root=args.dir, progress=_progress)
    return _emit(report, args.json, format_report)


def _follow(args: argparse.Namespace) -> int:
    from lakeckpt_tables.tools.bench.follow import format_report, run_follow_bench

    report = run_follow_bench(quick=args.quick, root=args.dir, poll_interval=args.poll_interval,
                              commits=args.commits, interval=args.interval,
                              backlog=args.backlog, progress=_progress)
    return _emit(report, args.json, format_report)


def _audit(args: argparse.Namespace) -> int:
    from lakeckpt_tables.tools.bench.audit import RECORDS, format_report, run_audit_bench

    per = args.per_checkpoint or (100 if args.records else RECORDS)
    checkpoints = args.records // per if args.records else args.checkpoints
    report = run_audit_bench(checkpoints=checkpoints, records=per, ledger=args.ledger,
                             batch=args.batch, root=args.dir, progress=_progress)
    return _emit(report, args.json, format_report)


def _tables(args: argparse.Namespace) -> int:
    from lakeckpt_tables.tools.bench.tables import format_report, run_tables_bench

    report = run_tables_bench(rows=args.rows, root=args.dir, rounds=args.rounds,
                              min_seconds=args.min_seconds, progress=_progress)
    return _emit(report, args.json, format_report)


def _peers(args: argparse.Namespace) -> int:
    from lakeckpt_tables.tools.bench.peers import format_peers, run_peers_bench, write_json

    with scratch(args.dir, "lakeckpt-peers-") as root:
        report = run_peers_bench(root, shapes=args.shapes, rows=args.rows, files=args.files,
                                 row_groups=args.row_groups, batch_size=args.batch_size,
                                 rounds=args.rounds, workers=args.workers, resume=args.resume,
                                 progress=_progress)
    if args.json_out:
        write_json(report, args.json_out)
    return _emit(report, args.json, format_peers)


def _workers(args: argparse.Namespace) -> int:
    from lakeckpt_tables.tools.bench.workers import format_workers, run_workers_bench

    with scratch(args.dir, "lakeckpt-workers-") as root:
        report = run_workers_bench(root, shape=args.shape, rows=args.rows, files=args.files,
                                   row_groups=args.row_groups, workers=args.workers,
                                   batch_sizes=args.batch_sizes, rounds=args.rounds,
                                   chunked=args.chunked, progress=_progress)
    return _emit(report, args.json, format_workers)


def _names(choices: Any) -> Any:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(n for n in text.split(",") if n)
        unknown = [n for n in names if n not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown) or 'empty list'}; "
                                             f"choose among {', '.join(choices)}")
        return names
    return parse


def _counts(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v)
    except ValueError:
        values = ()
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated counts >= 0, got {text!r}")
    return values


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


def _positive(text: str) -> int:
    value = int(text.replace("_", ""))
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value
