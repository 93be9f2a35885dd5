"""Batches skipped after a restore (a loss spike): consumed without training, and recorded.

NOTE [ skipped batches ]
After a loss spike a run restarts from an earlier checkpoint and skips the next batches (PaLM's
practice). Calling ``next()`` on the loader would record them as trained: the next
checkpoint's consumption is everything its reader state moved past. So
``CheckpointManager.skip`` (collective: every rank skips the same batches, as every rank
trains the same steps) reads the batches from the loader and drops them, captures what each
rank consumed doing so exactly as a save would, gathers it on rank 0, and resumes every rank's
loader from the merged state after the skip, through the dataset as a restore does (so 0 or
more DataLoader workers, plain, packed and mixed readers go on from there, each row once).
That state is the baseline of the next checkpoint, whose consumption records therefore hold
trained rows only; the skipped ones go, with the same commit, into a ``skipped`` event:

    {"reason", "by", "batches", "after_step" (the step trained last), "resumed_from" (the
     checkpoint restored, or null), "index" (its order among the skips of that commit),
     "rows", "tokens" (packed readers), "columns" and "records" (the consumption records of
     the skipped rows, the ledger's own columns), "state" (the encoded merged reader state
     after the skip)}

A skip not followed by a committed checkpoint was never recorded: a crash after it restores
the checkpoint before it, whose rows were neither trained nor skipped, and the job skips
again. ``verify`` counts the skipped rows as consumed, not trained (``Verdict.skipped``): a
pass is exactly once when trained and skipped rows together give every row once. The audit
replays a checkpoint from the state after its last skip, so ``rows`` gives trained rows only,
and ``skipped_rows`` the skipped ones (``audit/skipped.py``).
"""

from __future__ import annotations

import getpass
import itertools
from collections.abc import Mapping
from typing import Any

from lakeckpt_tables.checkpoint import readers
from lakeckpt_tables.checkpoint._world import World
from lakeckpt_tables.errors import CheckpointError
from lakeckpt_tables.ledger import ConsumptionRecord, LedgerEvent
from lakeckpt_tables.ledger.records import SEALED_COLUMNS
from lakeckpt_tables.reader import encode_state

__all__ = ["SKIP_EVENT", "Skipped", "skip_batches"]

SKIP_EVENT = "skipped"

Skipped = tuple[int, dict[str, Any] | None, list[LedgerEvent]]
"""(batches skipped, merged reader state after the skip, on rank 0 the events to commit with
the next checkpoint: the reader's own (a pass reached, a source added...) and ``skipped``)."""


def skip_batches(world: World, dataloader: Any, baseline: Mapping[str, Any] | None, *,
                 batches: int, reason: str, by: str | None, after_step: int | None,
                 resumed_from: str | None, index: int) -> Skipped:
    """Skip ``batches`` batches of ``dataloader`` on every rank (NOTE [ skipped batches ]).

    Raises:
        CheckpointError: ``batches`` is not a positive int, ``reason`` is empty, or there is
            no loader to skip in.
    """
    if not isinstance(batches, int) or isinstance(batches, bool) or batches < 1:
        raise CheckpointError(f"skip(batches={batches!r}): pass a positive number of batches")
    if not isinstance(reason, str) or not reason.strip():
        raise CheckpointError("skip(reason=...): say why the batches are skipped (it is "
                              "recorded in the ledger)")
    if dataloader is None:
        raise CheckpointError("skip(dataloader=None): pass the loader the run trains from")
    it = iter(dataloader)
    done = sum(1 for _ in itertools.islice(it, batches))
    state, consumed, events = readers.capture(dataloader, baseline)
    del it  # its workers stop: the loader goes on from the merged state below
    reports = world.gather_to_root((state, consumed, events))
    out: list[LedgerEvent] = []
    merged_state = None
    if reports is not None:
        merged_state, _, _ = readers.merged([s for s, _, _ in reports if s is not None],
                                            "skip")
        records = [r for _, c, _ in reports for r in c]
        # rank 0's reader events speak for all ranks, as at a save (checkpoint/commit.py)
        out = [*reports[0][2], _event(records, merged_state, batches=done, reason=reason,
                                      by=by or _user(), after_step=after_step,
                                      resumed_from=resumed_from, index=index)]
    merged_state = world.broadcast(merged_state)
    if merged_state is not None:
        readers.restore(dataloader, merged_state)
    return done, merged_state, out


def _event(records: list[ConsumptionRecord], state: dict[str, Any] | None, *, batches: int,
           reason: str, by: str, after_step: int | None, resumed_from: str | None,
           index: int) -> LedgerEvent:
    tokens = [r.tokens for r in records if r.tokens is not None]
    return LedgerEvent(SKIP_EVENT, {
        "reason": reason, "by": by, "batches": batches, "after_step": after_step,
        "resumed_from": resumed_from, "index": index,
        "rows": sum(r.rows for r in records), "tokens": sum(tokens) if tokens else None,
        "columns": list(SEALED_COLUMNS),
        "records": [[getattr(r, c) for c in SEALED_COLUMNS] for r in records],
        "state": encode_state(state) if state is not None else None,
    })


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no user name in a container
        return "unknown"
