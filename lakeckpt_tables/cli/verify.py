"""``lakeckpt verify TARGET``: prove exactly-once from the ledger; exit 1 on a violation.

``finished_passes`` names the passes the proof covers in full (no gap as well as no overlap):
``segment 0 epochs 0-1`` is both epochs of the pinned snapshot, ``segments 1-3 epoch 0`` the
follow segments 1 to 3; a Mixture's by source (``code: segment 0 epoch 0; web: none``, a
source whose pass its Mixture ended before: ``none``). Passes not finished yet are checked for
overlaps only.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from lakeckpt_tables.cli._output import add_output, add_target, emit

__all__ = ["describe_passes", "register", "run"]


def register(parser: argparse.ArgumentParser) -> None:
    add_target(parser, sources=True)
    parser.add_argument("--run", default=None, help="only this run (default: every run)")
    parser.add_argument("--checkpoint", default=None, metavar="ID",
                        help="verify up to this checkpoint (default: each run's newest)")
    parser.add_argument("--tokenizer", default=None, metavar="JSON",
                        help="the tokenizer.json of a run that packed a text column "
                        "(LakeDataset(..., tokenizer=...)): its passes are sized by its tokens")
    add_output(parser)


def run(args: argparse.Namespace) -> int:
    from lakeckpt_tables.audit.exactly_once import verify
    from lakeckpt_tables.audit.registry import load_catalog
    from lakeckpt_tables.cli._options import source_catalog, storage_options

    # verify takes a catalog object: a name or URI given here is loaded (an Iceberg ledger)
    catalog = load_catalog(args.catalog) if args.target.startswith("iceberg:") else None
    tokenizer = None
    if args.tokenizer is not None:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(args.tokenizer)
    verdicts = verify(args.target, run=args.run, checkpoint=args.checkpoint, tokenizer=tokenizer,
                      catalog=catalog, storage_options=storage_options(args),
                      source_catalog=source_catalog(args))
    rows = []
    for v in verdicts:
        row = v.to_json()
        row["finished_passes"] = "; ".join(
            f"{key}: {describe_passes(passes)}" for key, passes in v.source_passes.items()
        ) if v.source_passes else describe_passes(v.finished_passes)
        row["first_violation"] = v.violations[0] if v.violations else None
        row["violations"] = len(v.violations)
        rows.append(row)
    columns = ("run_id", "step", "ok", "checkpoints", "records", "rows", "tokens", "skipped",
               "excluded",
               "finished_passes", "violations", "first_violation")
    if args.output == "json":
        emit([v.to_json() for v in verdicts], "json")
    else:
        emit(rows, args.output, columns=columns, title="exactly-once")
    failed = [v for v in verdicts if not v.ok]
    if failed:
        print(f"FAILED: {failed[0].violations[0]}", file=sys.stderr)
        return 1
    return 0


def describe_passes(passes: Sequence[tuple[int, int]]) -> str:
    """``[(0, 0), (0, 1), (1, 0), (2, 0)]`` as ``segment 0 epochs 0-1; segments 1-2 epoch 0``:
    epochs per segment, then segments with the same epochs together; ``none`` when empty."""
    epochs: dict[int, list[int]] = {}
    for segment, epoch in sorted(set(passes)):
        epochs.setdefault(segment, []).append(epoch)
    groups: list[tuple[list[int], list[int]]] = []  # (segments, their epochs)
    for segment, its in epochs.items():
        if groups and groups[-1][1] == its and groups[-1][0][-1] == segment - 1:
            groups[-1][0].append(segment)
        else:
            groups.append(([segment], its))
    parts = []
    for segments, its in groups:
        seg = _ranges(segments)
        ep = _ranges(its)
        parts.append(f"segment{'s' if len(segments) > 1 else ''} {seg} "
                     f"epoch{'s' if len(its) > 1 else ''} {ep}")
    return "; ".join(parts) or "none"


def _ranges(values: list[int]) -> str:
    out: list[str] = []
    start = prev = values[0]
    for v in [*values[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ",".join(out)
