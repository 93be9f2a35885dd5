"""``lakeckpt demo``: show exactly-once resume across real SIGKILLs, and prove it twice.

Builds a synthetic Delta table and trains a tiny model from it with ``CheckpointManager``: once
without interruption, then again in a child process that is SIGKILLed twice (once between
checkpoints, once inside a save) and restarted each time. The proof is printed from two
independent sources, the row ids the trainer saw and the ledger's consumption records. Exit
code 0 only when every row was trained exactly once per epoch, in the uninterrupted run's
order, to bit-identical parameters, and the ledger says the same.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import textwrap
from pathlib import Path

from lakeckpt_tables.tools.demo.ledger_proof import LedgerProof
from lakeckpt_tables.tools.demo.proof import Crash
from lakeckpt_tables.tools.demo.runner import CRASH_ENV
from lakeckpt_tables.tools.demo.scenario import (
    DEFAULT_SAVE_CRASH,
    SAVE_CRASH_POINTS,
    DemoOptions,
    DemoResult,
    run_demo,
)

__all__ = ["register", "report", "run"]

_W = 44  # width of the claims column
_WRAP = 100


def register(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options."""
    parser.add_argument("--dir", type=Path, default=None,
                        help="new or empty directory for the table, checkpoints, ledger and "
                             "logs (kept); default: a temporary directory, removed afterwards")
    parser.add_argument("--rows", type=int, default=200_000,
                        help="rows in the table (default: 200000)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs to train (default: 2)")
    parser.add_argument("--kill-at", type=int, default=None, metavar="STEP",
                        help="SIGKILL attempt 1 once it has trained this step, which must not "
                             "be a checkpoint step (default: half-way between two checkpoints "
                             "about a third into the run)")
    parser.add_argument("--save-crash", choices=tuple(SAVE_CRASH_POINTS),
                        default=DEFAULT_SAVE_CRASH,
                        help=f"the instant of the save at which attempt 2 dies, via "
                             f"{CRASH_ENV} (default: {DEFAULT_SAVE_CRASH}, the last instant "
                             "before the ledger commit)")
    parser.add_argument("--save-crash-at", type=int, default=None, metavar="STEP",
                        help="the checkpoint step whose save attempt 2 dies in (default: the "
                             "save nearest two thirds into the run)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (default: 2)")
    parser.add_argument("--batch-size", type=int, default=256, help="rows per batch (default: 256)")
    parser.add_argument("--checkpoint-every", type=int, default=None, metavar="STEPS",
                        help="steps between checkpoints (default: odd, about 8 per run)")
    parser.add_argument("--seed", type=int, default=0, help="seed of data, model and order")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 when every claim holds, 1 when one does not."""
    root = args.dir if args.dir is not None else Path(tempfile.mkdtemp(prefix="lakeckpt-demo-"))
    options = DemoOptions(root=root, rows=args.rows, epochs=args.epochs, workers=args.workers,
                          batch_size=args.batch_size, seed=args.seed, kill_at=args.kill_at,
                          save_crash=args.save_crash, save_crash_at=args.save_crash_at,
                          checkpoint_every=args.checkpoint_every)
    try:
        result = run_demo(options)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(result.to_json(options), indent=2))
    else:
        print(report(result, kept=args.dir is not None))
    return 0 if result.proof.ok else 1


def _epochs(n: int) -> str:
    return f"{n} epoch" + ("s" if n != 1 else "")


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def _claim(text: str, flag: bool, detail: str = "") -> str:
    return f"  {text:<{_W}}{_yes(flag)}" + (f" ({detail})" if detail else "")


def _crash_lines(n: int, crash: Crash, result: DemoResult) -> list[str]:
    if crash.inside_save:
        nth = result.crash_spec.rpartition("#")[2]
        text = (f"attempt {crash.attempt} SIGKILLed inside the save of step {crash.saving} "
                f"(exit {crash.returncode}), at the crash point {result.save_crash} "
                f"({CRASH_ENV}={result.crash_spec}: the attempt's save number {nth}): "
                f"{SAVE_CRASH_POINTS[result.save_crash]}.")
    elif crash.saving is not None:  # the child ran past the kill step into a save
        text = (f"attempt {crash.attempt} SIGKILLed by the parent at step "
                f"{result.schedule.kill_at}; it had gone on to step {crash.last_step}, and the "
                f"kill landed inside its save (exit {crash.returncode}).")
    else:
        text = (f"attempt {crash.attempt} SIGKILLed by the parent between checkpoints, after "
                f"step {crash.last_step} (exit {crash.returncode}).")
    text += (f" Attempt {crash.attempt + 1} restored step {crash.restored_step}: "
             f"{crash.lost_steps} trained step(s), {crash.lost_rows:,} rows, died with the crash.")
    return textwrap.wrap(text, _WRAP, initial_indent=f"{f'crash {n}':<11}",
                         subsequent_indent=" " * 11)


def _ledger_lines(ledger: LedgerProof, rows: int, epochs: int) -> list[str]:
    cov = ledger.coverage
    lines = [f"proof from the ledger: run {ledger.run_id!r} in {ledger.ledger}",
             "   step  committed at (UTC)          attempt  parent  records       rows  tags"]
    for c in ledger.checkpoints:
        when = c.committed_at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        parent = "-" if c.parent_step is None else str(c.parent_step)
        lines.append(f"  {c.step:>5}  {when}  {c.attempt or '?':>7}  {parent:>6}  "
                     f"{c.records:>7}  {c.rows:>9,}  {','.join(c.tags)}".rstrip())
    lines += [
        f"  {'consumption records':<{_W}}{cov.records} ({cov.exact_records} exact ranges, "
        f"{cov.records - cov.exact_records} counts inside shuffled windows)",
        _claim("rows consumed, all checkpoints", cov.rows == cov.rows_expected,
               f"{cov.rows:,} = {rows:,} rows x {_epochs(epochs)}"),
        _claim("each row group exactly once per epoch", cov.exactly_once,
               f"{cov.row_groups_exact}/{cov.row_groups}; {cov.gap_rows} rows missing, "
               f"{cov.overlap_rows} overlapping, {cov.invalid_records} invalid records"),
        _claim("no record outside a committed checkpoint", ledger.orphan_records == 0,
               f"{ledger.orphan_records} orphans"),
        _claim("each checkpoint continues the one before", ledger.parent_chain),
        _claim("ledger rows = ids trained, per checkpoint", ledger.ids_agree,
               f"{sum(c.agrees_with_ids for c in ledger.checkpoints)}/{len(ledger.checkpoints)} "
               "checkpoints, per row group"),
    ]
    a = ledger.aborted
    if a is not None:
        left = (", ".join(a.leftovers) + f" ({a.files} files"
                + (", .metadata written" if a.metadata else ", no .metadata") + ")"
                if a.leftovers else "no files")
        later = (f"step {a.step} was committed later by attempt {a.recommitted_by}"
                 if a.recommitted_by is not None else f"step {a.step} is not in the ledger")
        lines += [_claim(f"aborted save of step {a.step}: no checkpoint", a.ok),
                  *textwrap.wrap(f"it left {left} on disk; "
                                 f"{'a' if a.named_in_ledger else 'no'} ledger row names it, "
                                 f"and {later}", _WRAP, initial_indent=" " * 4,
                                 subsequent_indent=" " * 4)]
    return lines


def report(result: DemoResult, *, kept: bool) -> str:
    """The human-readable proof."""
    t, s, p = result.table, result.schedule, result.proof
    ids, epochs = p.ids, p.ids.epochs
    lines = [
        f"table      {t.rows:,} rows, {t.files} files, {t.row_groups} row groups "
        f"(Delta version {t.version})",
        f"training   {_epochs(epochs)}, {result.steps} steps, checkpoint every "
        f"{s.checkpoint_every} steps (CheckpointManager, Delta ledger)",
    ]
    for n, crash in enumerate(ids.crashes, 1):
        lines += _crash_lines(n, crash, result)
    lost = ", ".join(f"crash {n}: {c.lost_steps} steps" for n, c in enumerate(ids.crashes, 1))
    lines += [
        "",
        "proof from the row ids the trainer saw (its step logs, lost steps dropped)",
        _claim("rows trained", ids.rows_trained == ids.rows_total * epochs,
               f"{ids.rows_trained:,} = {ids.rows_total:,} rows x {_epochs(epochs)}"),
        _claim("every row exactly once per epoch", ids.exactly_once,
               f"{ids.duplicated} duplicated, {ids.missing} missing"),
        _claim("restarts re-delivered exactly the lost rows",
               all(c.redelivered_exactly for c in ids.crashes), lost),
        _claim("sequence identical to uninterrupted run", ids.sequence_identical,
               f"{ids.batches} vs {ids.reference_batches} batches"),
        _claim("loss curve bit-identical", ids.loss_identical),
        _claim("final parameters bit-identical", ids.params_identical),
        "",
        *_ledger_lines(p.ledger, t.rows, epochs),
        "",
        f"{'PROOF HOLDS' if p.ok else 'PROOF FAILS'} in {result.seconds:.1f} s",
    ]
    if kept:
        lines.append(f"files kept in {result.table.path.parent}")
    return "\n".join(lines)
