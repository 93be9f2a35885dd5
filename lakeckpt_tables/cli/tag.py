"""``lakeckpt tag TARGET ID NAME``: label a committed checkpoint (e.g. ``best``)."""

from __future__ import annotations

import argparse

from lakeckpt_tables.cli._output import add_output, add_target, emit
from lakeckpt_tables.errors import AuditError

__all__ = ["register", "run"]


def register(parser: argparse.ArgumentParser) -> None:
    add_target(parser)
    parser.add_argument("checkpoint", metavar="ID", help="checkpoint id (or a unique prefix)")
    parser.add_argument("name", help="the tag, e.g. best")
    add_output(parser)


def run(args: argparse.Namespace) -> int:
    from lakeckpt_tables.audit.views import connect
    from lakeckpt_tables.cli._ledger import existing_ledger
    from lakeckpt_tables.cli._options import storage_options
    from lakeckpt_tables.ledger import LedgerEvent
    from lakeckpt_tables.ledger.base import EVENT_TAG

    options = storage_options(args)
    ledger = existing_ledger(args.target, args.catalog, options)
    con = connect(ledger, storage_options=options)
    found = con.sql("SELECT run_id, checkpoint_id, step FROM checkpoints "
                    "WHERE starts_with(checkpoint_id, $id)",
                    params={"id": args.checkpoint}).fetchall()
    if len(found) != 1:
        raise AuditError(f"{ledger.describe()}: {len(found)} checkpoints match id "
                         f"{args.checkpoint!r}; list them with `lakeckpt checkpoints "
                         f"{args.target} --all`")
    run_id, checkpoint_id, step = found[0]
    # checkpoint rows are immutable: a tag is an event the checkpoints view folds in
    ledger.record_events(run_id, [LedgerEvent(EVENT_TAG, {"checkpoint_id": checkpoint_id,
                                                      "step": step, "tag": args.name})])
    emit([{"run_id": run_id, "checkpoint_id": checkpoint_id, "step": step, "tag": args.name}],
         args.output, title="tagged")
    return 0
