"""The ``eos_in_documents`` ledger event: how often a packing reader's ``eos_id`` occurred
inside the documents a checkpoint delivered.

NOTE [ eos counted in the ledger ]
An ``eos_id`` inside a document makes its boundaries ambiguous to the model; the reader warns
once per process (``reader/packing/stream.py``) and counts every occurrence exactly. The count is
kept where positions are: each slice's state holds its cumulative count (``eos_inside`` in
``reader/state.py``), raised with the batch whose ``input_ids`` hold the token, so a document
cut across sequences, batches or checkpoints has each occurrence counted once, when its token
is delivered. A resumed slice goes on from its saved count (a worker that takes over another
slice takes its count); an elastic re-plan carries the old slices' sum onto slice 0.

A checkpoint's count is then the merged state's sum less the previous checkpoint's: only the
coordinator holds the merged state of every rank, so it adds the event (one per source of a
Mixture, named by ``source_key``; none when the count is 0) to the events it commits. The
counts of a run's committed checkpoints sum to the occurrences in the tokens delivered up to
its last one, crashes and resumes included::

    SELECT run_id, step, detail->>'source_key' AS source,
           CAST(detail->>'count' AS BIGINT) AS eos_in_documents
    FROM events WHERE event = 'eos_in_documents'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lakeckpt_tables.ledger import CheckpointRecord, LedgerEvent
from lakeckpt_tables.mixture.state import is_reader_state, reader_states
from lakeckpt_tables.reader import decode_state
from lakeckpt_tables.reader.state import KEY_EOS_INSIDE

__all__ = ["EOS_EVENT", "eos_events"]

EOS_EVENT = "eos_in_documents"


def eos_events(before: CheckpointRecord | None,
               after: Mapping[str, Any] | None) -> list[LedgerEvent]:
    """The eos counts the merged reader state ``after`` adds to ``before`` (the checkpoint
    this job committed or restored last; None: the run's start), per reader (NOTE [ eos
    counted in the ledger ]). Read from the states' JSON: the commit needs only the counts."""
    now = _readers(after) if after else {}
    if not now:  # no packing reader: nothing to count, nothing decoded
        return []
    was = _readers(decode_state(before.reader_state)) if before and before.reader_state else {}
    events = []
    for key, state in now.items():
        total = _total(state)
        prior = _total(was[key]) if key in was else 0
        count = total - prior if total >= prior else total  # below: a pass begun afresh
        if count:
            pack = state["config"].get("pack") or {}
            detail: dict[str, Any] = {"count": count, "total": total,
                                      "eos_id": pack.get("eos_id"),
                                      "table": state["table"]["location"]}
            if key is not None:
                detail["source_key"] = key
            events.append(LedgerEvent(EOS_EVENT, detail))
    return events


def _readers(state: Mapping[str, Any]) -> dict[str | None, Mapping[str, Any]]:
    """The packing reader states of a checkpoint's merged state, by Mixture source key (None
    for a lone reader); a source of another kind counts nothing."""
    return {key: s for key, s in reader_states(state).items()
            if is_reader_state(s) and "pack" in s["config"]}


def _total(state: Mapping[str, Any]) -> int:
    """The eos ids found inside delivered documents, over every slice the state holds
    (``ReaderState.eos_total`` of the state as JSON)."""
    return sum(n for n in state.get(KEY_EOS_INSIDE, ()) if n is not None)
