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

``lakeckpt bench peers [--rows N | --quick] [--dir PATH] [--json-out FILE]``: one token table
read by raw pyarrow, a plain IterableDataset, naive skip-ahead resume, Hugging Face datasets
streaming and the library, under StatefulDataLoader at 0 and 2 workers; a markdown table of
ratios, resume times at 0/50/90%.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

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
    size = read.add_mutually_exclusive_group()
    size.add_argument("--rows", type=_positive, default=DEFAULT_ROWS,
                      help=f"rows of the synthetic table (default {DEFAULT_ROWS:,})")
    size.add_argument("--quick", action="store_const", dest="rows", const=QUICK_ROWS,
                      help=f"a fast smoke run on {QUICK_ROWS:,} rows")
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

    from lakeckpt_tables.tools.bench.audit import DEFAULT_CHECKPOINTS, QUICK_CHECKPOINTS

    audit = sub.add_parser("audit", help="progress, verify and commit latency on a big ledger",
                           description="A ledger of 100,000 checkpoints x 64 consumption "
                           "records: maintain, then time progress, verify of one run, and "
                           "commit latency.")
    audit.add_argument("--checkpoints", type=_positive, default=DEFAULT_CHECKPOINTS,
                       help=f"checkpoints in the ledger (default {DEFAULT_CHECKPOINTS:,})")
    audit.add_argument("--quick", action="store_const", dest="checkpoints",
                       const=QUICK_CHECKPOINTS, help=f"{QUICK_CHECKPOINTS:,} checkpoints")
    audit.add_argument("--dir", metavar="PATH", default=None,
                       help="build the ledger under PATH (default: a temporary directory)")
    audit.add_argument("--json", action="store_true", help="print the report as JSON")
    from lakeckpt_tables.tools.bench.peers import DEFAULT_ROWS as PEER_ROWS
    from lakeckpt_tables.tools.bench.peers import QUICK_ROWS as PEER_QUICK

    peers = sub.add_parser("peers", help="the library beside raw pyarrow, a plain loader, HF",
                           description="One token table read by raw pyarrow, StatefulDataLoader "
                           "over a plain IterableDataset, naive skip-ahead resume, Hugging Face "
                           "datasets streaming (the 'bench' extra) and the library, at 0 and 2 "
                           "workers, with resume at 0, 50 and 90% of a pass.")
    psize = peers.add_mutually_exclusive_group()
    psize.add_argument("--rows", type=_positive, default=PEER_ROWS,
                       help=f"rows of the token table (default {PEER_ROWS:,})")
    psize.add_argument("--quick", action="store_const", dest="rows", const=PEER_QUICK,
                       help=f"a fast smoke run on {PEER_QUICK:,} rows")
    peers.add_argument("--batch-size", type=_positive, default=1024, help="rows per batch")
    peers.add_argument("--rounds", type=_positive, default=3, help="rounds (median taken)")
    peers.add_argument("--dir", metavar="PATH", default=None,
                       help="keep the token table under PATH and reuse it (default: temporary)")
    peers.add_argument("--json-out", metavar="FILE", default=None,
                       help="also write the report as JSON to FILE")
    from lakeckpt_tables.tools.bench import planning

    planning.register(sub)
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
    if args.bench == "peers":
        return _peers(args)
    if args.bench == "planning":
        from lakeckpt_tables.tools.bench import planning

        return planning.run(args)
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
    from lakeckpt_tables.tools.bench.audit import format_report, run_audit_bench

    report = run_audit_bench(checkpoints=args.checkpoints, root=args.dir, progress=_progress)
    return _emit(report, args.json, format_report)


def _tables(args: argparse.Namespace) -> int:
    from lakeckpt_tables.tools.bench.tables import format_report, run_tables_bench

    report = run_tables_bench(rows=args.rows, root=args.dir, rounds=args.rounds,
                              min_seconds=args.min_seconds, progress=_progress)
    return _emit(report, args.json, format_report)


def _peers(args: argparse.Namespace) -> int:
    import tempfile

    from lakeckpt_tables.tools.bench.peers import format_peers, run_peers_bench, write_json

    with tempfile.TemporaryDirectory(prefix="lakeckpt-peers-") as scratch:
        report = run_peers_bench(args.dir or scratch, rows=args.rows,
                                 batch_size=args.batch_size, rounds=args.rounds,
                                 progress=_progress)
    print(format_peers(report))
    if args.json_out:
        write_json(report, args.json_out)
    return 0


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
