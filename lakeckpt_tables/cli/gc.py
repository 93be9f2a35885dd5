"""``lakeckpt gc ROOT``: remove model files no retained committed checkpoint names.

The rule of ``CheckpointManager.gc``: per run, keep the newest ``--keep-last`` untagged
checkpoints and every tagged one, and remove directories of attempts no checkpoint names.
Tags given after the commit (``lakeckpt tag``) are honoured too: they live in the ledger as
``tag`` events, which the ``checkpoints`` view folds in. A Delta ledger's orphan files (written
by a commit that crashed before landing, provably named by no log entry, older than the grace
period) are removed too (``DeltaLedger.remove_orphans``), and so are the files a compaction
replaced more than a week ago (``DeltaLedger.remove_replaced``; ``--replaced-older-than-hours``):
nothing else of the ledger. An Iceberg ledger's files that no snapshot it keeps names (a
compaction expires the snapshots of the files it replaced) are removed past the orphans' grace
period (``IcebergLedger.remove_orphans``).
Removing a committed checkpoint's model files records a ``removed`` event, so ``lakeckpt
checkpoints`` shows it ``removed`` (not restorable).
"""

from __future__ import annotations

import argparse
from typing import Any

from lakeckpt_tables.cli._output import add_output, emit

__all__ = ["register", "run"]


def register(parser: argparse.ArgumentParser) -> None:
    from lakeckpt_tables.cli._options import add_storage_options

    parser.add_argument("target", metavar="ROOT", help="checkpoint root (model files live here)")
    parser.add_argument("--ledger", default=None,
                        help="the runs' ledger when not <ROOT>/_ledger (delta:<uri> or "
                        "iceberg:<namespace.table>)")
    parser.add_argument("--catalog", default=None, metavar="NAME|URI",
                        help="pyiceberg catalog of an Iceberg ledger")
    add_storage_options(parser)
    parser.add_argument("--keep-last", type=int, default=3,
                        help="untagged checkpoints kept per run (default 3)")
    parser.add_argument("--orphans-older-than-hours", type=int, default=None, metavar="H",
                        help="grace period of orphan ledger files (default 24: a commit may "
                        "be writing a younger file)")
    parser.add_argument("--replaced-older-than-hours", type=int, default=None, metavar="H",
                        help="keep Delta ledger files a compaction replaced this long (default "
                        "168: an audit of an older ledger version may still read them)")
    parser.add_argument("--dry-run", action="store_true", help="list, remove nothing")
    add_output(parser)


def run(args: argparse.Namespace) -> int:
    from lakeckpt_tables.audit.views import connect
    from lakeckpt_tables.cli._ledger import existing_ledger
    from lakeckpt_tables.cli._options import storage_options
    from lakeckpt_tables.io import Storage
    from lakeckpt_tables.ledger import LedgerEvent

    options = storage_options(args)
    store = Storage(args.target, options)
    con = connect(args.ledger or args.target, catalog=args.catalog, storage_options=options)
    records = con.sql("SELECT run_id, model_location, len(tags) > 0 AS tagged, checkpoint_id, "
                      "step, status = 'committed' AND removed_at IS NULL AS listed "
                      "FROM checkpoints ORDER BY run_id, step").fetchall()
    ledger = existing_ledger(args.ledger or args.target, args.catalog, options)
    removed = []
    for run_id in sorted({r[0] for r in records}):
        mine = [r for r in records if r[0] == run_id]
        events = []
        for location in _removable(store, [r[:3] for r in mine], run_id, args.keep_last):
            if not args.dry_run:
                store.delete(location)
            removed.append({"run_id": run_id, "location": location})
            # a committed checkpoint's files: the ledger says so (`checkpoints` shows it removed)
            events += [LedgerEvent("removed", {"checkpoint_id": r[3], "step": r[4],
                                               "location": location, "reason": "gc"})
                       for r in mine if r[1] == location and r[5]]
        if events and not args.dry_run:
            ledger.record_events(run_id, events)
    removed += _ledger_orphans(args, ledger)
    emit(removed, args.output, columns=("run_id", "location"),
         title="would remove" if args.dry_run else "removed", empty="nothing to remove")
    return 0


def _ledger_orphans(args: argparse.Namespace, ledger: Any) -> list[dict[str, str]]:
    from lakeckpt_tables.ledger.delta import DeltaLedger
    from lakeckpt_tables.ledger.delta_upkeep import ORPHAN_GRACE_HOURS, REPLACED_GRACE_HOURS

    orphans = ORPHAN_GRACE_HOURS if args.orphans_older_than_hours is None \
        else args.orphans_older_than_hours
    replaced = REPLACED_GRACE_HOURS if args.replaced_older_than_hours is None \
        else args.replaced_older_than_hours
    paths = []
    if isinstance(ledger, DeltaLedger):
        paths += ledger.remove_replaced(older_than_hours=replaced, dry_run=args.dry_run)
    # an Iceberg ledger's compaction expires the snapshots naming the files it replaced: they
    # are orphans then
    paths += ledger.remove_orphans(older_than_hours=orphans, dry_run=args.dry_run)
    return [{"run_id": "(ledger)", "location": f"{ledger.describe()}/{path}"} for path in paths]


def _removable(store: Any, records: list[tuple[str, str, bool]], run_id: str,
               keep_last: int) -> list[str]:
    untagged = [location for _, location, tagged in records if not tagged]
    old = set(untagged[: max(len(untagged) - keep_last, 0)])
    keep = {location for _, location, _ in records} - old
    return [f"{run_id}/{n}" for n in store.list(run_id) if f"{run_id}/{n}" not in keep]
