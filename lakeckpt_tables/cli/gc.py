"""``lakeckpt gc ROOT``: remove model files no retained committed checkpoint names.

The rule of ``CheckpointManager.gc``: per run, keep the newest ``--keep-last`` untagged
checkpoints and every tagged one, and remove directories of attempts no checkpoint names.
Tags given after the commit (``lakeckpt tag``) are honoured too: they live in the ledger as
``tag`` events, which the ``checkpoints`` view folds in. A Delta ledger's orphan files (written
by a commit that crashed before landing, provably named by no log entry, older than the grace
period) are removed too, and nothing else of the ledger (``DeltaLedger.remove_orphans``).
"""

from __future__ import annotations

import argparse
import os
import shutil

from lakeckpt_tables.cli._output import add_output, emit

__all__ = ["register", "run"]


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="ROOT", help="checkpoint root (model files live here)")
    parser.add_argument("--ledger", default=None,
                        help="the runs' ledger when not <ROOT>/_ledger (delta:<uri> or "
                        "iceberg:<namespace.table>)")
    parser.add_argument("--catalog", default=None, metavar="NAME",
                        help="pyiceberg catalog of an Iceberg ledger")
    parser.add_argument("--keep-last", type=int, default=3,
                        help="untagged checkpoints kept per run (default 3)")
    parser.add_argument("--orphans-older-than-hours", type=int, default=None, metavar="H",
                        help="grace period of orphan ledger files (default 24: a commit may "
                        "be writing a younger file)")
    parser.add_argument("--dry-run", action="store_true", help="list, remove nothing")
    add_output(parser)


def run(args: argparse.Namespace) -> int:
    from lakeckpt_tables.audit.views import connect

    con = connect(args.ledger or args.target, catalog=args.catalog)
    records = con.sql("SELECT run_id, model_location, len(tags) > 0 AS tagged FROM checkpoints "
                      "ORDER BY run_id, step").fetchall()
    removed = []
    for run_id in sorted({r[0] for r in records}):
        for location in _removable(args.target, [r for r in records if r[0] == run_id],
                                   run_id, args.keep_last):
            if not args.dry_run:
                shutil.rmtree(os.path.join(args.target, location), ignore_errors=True)
            removed.append({"run_id": run_id, "location": location})
    removed += _ledger_orphans(args)
    emit(removed, args.output, columns=("run_id", "location"),
         title="would remove" if args.dry_run else "removed", empty="nothing to remove")
    return 0


def _ledger_orphans(args: argparse.Namespace) -> list[dict[str, str]]:
    from lakeckpt_tables.cli._ledger import existing_ledger
    from lakeckpt_tables.ledger.delta import ORPHAN_GRACE_HOURS, DeltaLedger

    ledger = existing_ledger(args.ledger or args.target, args.catalog)
    if not isinstance(ledger, DeltaLedger):
        return []
    hours = ORPHAN_GRACE_HOURS if args.orphans_older_than_hours is None \
        else args.orphans_older_than_hours
    return [{"run_id": "(ledger)", "location": f"{ledger.describe()}/{path}"}
            for path in ledger.remove_orphans(older_than_hours=hours, dry_run=args.dry_run)]


def _removable(root: str, records: list[tuple[str, str, bool]], run_id: str,
               keep_last: int) -> list[str]:
    untagged = [location for _, location, tagged in records if not tagged]
    old = set(untagged[: max(len(untagged) - keep_last, 0)])
    keep = {location for _, location, _ in records} - old
    run_dir = os.path.join(root, run_id)
    names = sorted(os.listdir(run_dir)) if os.path.isdir(run_dir) else []
    return [f"{run_id}/{n}" for n in names if f"{run_id}/{n}" not in keep]
