"""Which checkpoint a restore loads, and the one ledger commit that takes the run over.

A restore is choose, load, claim: :meth:`RestorePolicy.choose` reads the ledger and the
checkpoint files and decides (nothing is written), every rank loads the checkpoint (NOTE
[ restore loads, then claims ] in ``load.py``), and only then :meth:`RestorePolicy.claim`
commits the retirements, the ``restore`` event and the run's ownership in one commit. A restore
that fails before the claim changes nothing; a read-only one never claims.

NOTE [ what restore skips ]
Walking down from the run's newest checkpoint, a checkpoint is skipped when its directory, its
``.metadata`` (DCP's manifest of the checkpoint) or any file its ledger record lists is missing,
or a file fails its checksum. A skipped checkpoint newer than the one restored is *retired*
(a ``retired`` event naming what was missing or wrong), so the run's newest checkpoint is the
one restored, the claim lands, and the skipped step can be saved again. When nothing verifies,
every checkpoint is retired and the run starts over from its beginning (a ``restart`` event):
what the lost checkpoints trained is trained again, never skipped. Asked for a step or tag,
restore loads exactly that checkpoint or fails by name (``removed`` by retention or gc, or
damaged), retiring nothing; a checkpoint older than the run's newest is refused up front to
train on (it would rewind the run: its next save would not come after the newest step): it is
read only, or a new run branches from it.

NOTE [ branched runs ]
``restore(from_run=P, step=...)`` on a manager of a run without checkpoints starts that run
from run P's checkpoint (a warm start, a fine-tune, a recipe change, a rewind): P's checkpoint
is chosen as a read-only restore of P chooses it (nothing of P is retired or claimed), loaded,
and the claim of the new run commits a ``branch`` event naming P, its checkpoint and step, and
whether the new run's reader went on from P's reader state (a dataloader was restored) or
started afresh. The new run's checkpoints then chain among themselves (its first has no
parent_id); audits follow the ``branch`` event from the run's first checkpoint into P's lineage
(``lakeckpt_tables.audit.lineage``). Relaunched with the same call after it saved, the run goes
on from its own newest checkpoint; a run that has checkpoints and another (or no) parent is
refused.
"""

from __future__ import annotations

import itertools
import logging
import re
import socket
import statistics
import time
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass
from datetime import datetime
from typing import Any, Literal

from lakeckpt_tables.checkpoint.progress import Progress
from lakeckpt_tables.errors import CheckpointRestoreError, LedgerCorruptError, RunInUseError
from lakeckpt_tables.io.checkpoint_storage import CheckpointStorage, member
from lakeckpt_tables.ledger import CheckpointRecord, Ledger, LedgerEvent
from lakeckpt_tables.ledger.base import EVENT_RETIRED, RunScan

__all__ = ["DCP_METADATA", "EVENT_BRANCH", "EVENT_LEDGER_REPAIRED", "Choice", "RestorePolicy",
           "Takeover"]

log = logging.getLogger(__name__)

Takeover = Literal["fence", "refuse"]

EVENT_BRANCH = "branch"
"""Event of a run started from another run's checkpoint (NOTE [ branched runs ]):
``{"parent_run", "parent_checkpoint_id", "parent_step", "reader", "owner", "host"}``;
``reader``: ``"continued"`` when the run's reader went on from the parent's reader state,
``"fresh"`` when it started its own."""

EVENT_LEDGER_REPAIRED = "ledger_repaired"
"""Event of a restore that dropped lost ledger data files: ``{"files", "missing", "owner",
"host"}``."""

DCP_METADATA = ".metadata"
"""DCP's manifest of a checkpoint, written last."""

_ATTEMPT = re.compile(r"step-(\d+)-[0-9a-f]+\Z")
_LIVE_FLOOR_S = 60.0
_LIVE_DEFAULT_S = 600.0


@dataclass(frozen=True)
class Choice:
    """What restore decided, before anything is committed.

    Attributes:
        record: the checkpoint to load; None to start fresh.
        events: committed with the claim (retirements, ``restore``/``restart``).
        check_head: the claim lands only while ``record`` is the run's newest checkpoint.
        branch: ``record`` is another run's checkpoint this run starts from (NOTE [ branched
            runs ]): the claim lands only while this run has no checkpoint.
    """

    record: CheckpointRecord | None
    events: tuple[LedgerEvent, ...] = ()
    check_head: bool = True
    branch: bool = False


@dataclass
class RestorePolicy:
    """Rank 0's side of restore for one run (NOTE [ what restore skips ]).

    Args:
        ledger: the run's ledger.
        storage: the checkpoint root.
        run_id: the run.
        owner: this job's owner token.
        takeover: ``"fence"`` takes the run from a job still writing it (that job fails at its
            next save); ``"refuse"`` fails this job instead while the owner is live.
        live_for: seconds since its newest checkpoint during which an owner counts as live for
            ``"refuse"``; None: three of the run's recent save intervals (at least a minute;
            ten minutes before the run has two checkpoints).
        progress: the run's heartbeat, for the step the previous job reached.
    """

    ledger: Ledger
    storage: CheckpointStorage
    run_id: str
    owner: str
    _: KW_ONLY
    keep_last: int
    takeover: Takeover = "fence"
    live_for: float | None = None
    progress: Progress | None = None

    # ---------------------------------------------------------------------------- choose

    def choose(self, step: int | None, tag: str | None, *, require: bool = False,
               read_only: bool = False, from_run: str | None = None,
               continued: bool = False) -> Choice:
        """The checkpoint to restore and the events its claim commits; reads only.

        ``read_only``: for a restore that never claims: a run's owner does not matter, a lost
        ledger file is not dropped from the ledger (a restore that takes the run does that),
        and when no checkpoint verifies the restore fails instead of starting over.

        Raises:
            CheckpointRestoreError: the step/tag asked for is not restorable, the run has no
                checkpoint and ``require`` is set, or the run's directory is gone.
            RunInUseError: ``takeover="refuse"`` and another live job owns the run.
        """
        scan = self.ledger.scan(self.run_id) if read_only else self._scan()
        if not read_only:
            self._refuse_if_owned(scan)
        if from_run is not None:
            branched = self._branch(scan, from_run, step, tag, continued=continued)
            if branched is not None:
                return branched
            step = tag = None  # a relaunch of the branched run: it goes on from its own
        explicit = step is not None or tag is not None
        records = [r for r in scan.committed
                   if (step is None or r.step == step) and (tag is None or tag in r.tags)]
        if explicit and not records:
            raise CheckpointRestoreError(
                f"run {self.run_id} has no committed checkpoint with step={step} tag={tag} in "
                f"{self.ledger.describe()}; its checkpoints: "
                f"{[r.step for r in scan.committed] or 'none'}")
        if not scan.committed and not scan.damaged:
            self._fresh(require)
            return Choice(None, (LedgerEvent("claim", {"owner": self.owner, "head": None,
                                                       **_host()}),))
        # the run's directory: <run_id> for the manager's checkpoints, the root itself for
        # a trainer's (NOTE [ someone else's checkpoint ] in run_ledger.py)
        home = records[-1].model_location.rpartition("/")[0] if records else ""
        if records and not explicit and not self.storage.exists(home):
            raise CheckpointRestoreError(
                f"run {self.run_id}: its directory {self.storage.url(home)} does not "
                f"exist, yet the ledger {self.ledger.describe()} holds {len(records)} "
                "checkpoint(s) of it: is the checkpoint root right (mounted, same bucket)? "
                "Nothing was changed")
        if explicit and not read_only and records[-1] is not scan.committed[-1]:
            self._refuse_rewind(records[-1], scan.committed[-1])
        skipped: list[dict[str, Any]] = []
        for record in reversed(records):
            missing, problems = self._inspect(record)
            if not problems:
                return self._restore(record, skipped, scan, explicit)
            if explicit:
                raise CheckpointRestoreError(self._not_restorable(record, missing, problems))
            log.warning("checkpoint %s (step %d) of run %s %s: %s", record.checkpoint_id,
                        record.step, self.run_id,
                        "has lost files" if missing else "fails verification",
                        "; ".join(problems))
            skipped.append({"checkpoint_id": record.checkpoint_id, "step": record.step,
                            "missing": missing, "problems": problems})
        if require or read_only:
            raise CheckpointRestoreError(self._none_restorable(skipped, scan) + (
                "; a read-only restore does not start over" if read_only else
                "; restore(require=True) does not start over"))
        return self._start_over(skipped, scan)

    def _scan(self) -> RunScan:
        """The run's records; a ledger data file that no longer exists is dropped from the
        ledger first (its records, a checkpoint's among them, are lost with it: restore falls
        back to the newest checkpoint the ledger still holds), recorded by a
        ``ledger_repaired`` event. A file that exists but is damaged stays a named error."""
        try:
            return self.ledger.scan(self.run_id)
        except LedgerCorruptError as exc:
            dropped = self.ledger.repair_missing()
            if not dropped:
                raise
            log.warning("run %s: ledger %s lost data file(s) %s; dropped from the ledger, their "
                        "records are lost and restore falls back (%s)", self.run_id,
                        self.ledger.describe(), dropped, exc)
            self.ledger.record_events(self.run_id, [LedgerEvent(EVENT_LEDGER_REPAIRED, {
                "files": dropped, "missing": True, "owner": self.owner, **_host()})])
            return self.ledger.scan(self.run_id)

    def _inspect(self, record: CheckpointRecord) -> tuple[list[str], list[str]]:
        """What is missing of a checkpoint, and every problem found (missing or altered)."""
        location = record.model_location
        if not self.storage.exists(location):
            return ["directory"], [f"its directory {self.storage.url(location)} is missing"]
        missing = [name for name in sorted(record.manifest)
                   if not self.storage.exists(member(location, name))]
        problems = [f"{self.storage.url(member(location, name))} is missing"
                    + (" (DCP's manifest of the checkpoint)" if name == DCP_METADATA else "")
                    for name in missing]
        present = {k: v for k, v in record.manifest.items() if k not in missing}
        return missing, problems + self.storage.verify(location, present)

    def _not_restorable(self, record: CheckpointRecord, missing: list[str],
                        problems: list[str]) -> str:
        if missing == ["directory"]:
            return (f"run {self.run_id} step {record.step} (checkpoint {record.checkpoint_id}) "
                    f"is removed: its model files at {self.storage.url(record.model_location)} "
                    f"were deleted by retention (keep_last={self.keep_last}) or gc, so it is not "
                    "restorable; tag checkpoints to keep them (`lakeckpt tag`), or restore "
                    "another step. Nothing was changed")
        return (f"run {self.run_id} step {record.step} (checkpoint {record.checkpoint_id}) is "
                f"not restorable: {'; '.join(problems)}. Nothing was changed")

    def _restore(self, record: CheckpointRecord, skipped: list[dict[str, Any]], scan: RunScan,
                 explicit: bool) -> Choice:
        events = _retired_events(skipped, scan, after_step=record.step)
        if events:
            log.warning("run %s: restoring step %d (%s) instead of newer checkpoints that "
                        "cannot be used, retired: %s", self.run_id, record.step,
                        record.checkpoint_id, [e.detail["step"] for e in events])
            events.append(LedgerEvent("restore_fallback", {
                "restored": record.checkpoint_id, "step": record.step, "skipped": skipped}))
        newest = max([r.step for r in scan.committed] + [d.step for d in scan.damaged])
        heartbeat = self.progress.reached() if self.progress is not None else None
        reached = max([newest, *self._attempted_steps(), *([heartbeat] if heartbeat else [])])
        events.append(LedgerEvent("restore", {
            "checkpoint_id": record.checkpoint_id, "step": record.step, "newest_step": newest,
            "reached_step": reached, "steps_lost": reached - record.step,
            "fallback": bool(skipped), "explicit": explicit, "owner": self.owner, **_host()}))
        return Choice(record, tuple(events))

    def _refuse_rewind(self, record: CheckpointRecord, newest: CheckpointRecord) -> None:
        """A restore of an older checkpoint to train on would fork the run's history: its
        next save is not after the run's newest step. Said now, with the ways out."""
        raise CheckpointRestoreError(
            f"run {self.run_id}: step {record.step} (checkpoint {record.checkpoint_id}) is not "
            f"the run's newest checkpoint (step {newest.step}): training on from it would "
            "rewind the run, whose next save would not come after step "
            f"{newest.step}. To evaluate or inspect it, restore(..., read_only=True); to train "
            "on from it, branch a new run from it: CheckpointManager(root, '<new run id>')"
            f".restore(..., from_run={self.run_id!r}, step={record.step}) (its lineage is "
            "kept); to resume the run, restore() without step= or tag= (it falls back past "
            "newer checkpoints that fail verification, retiring them). Nothing was changed")

    def _branch(self, scan: RunScan, from_run: str, step: int | None, tag: str | None, *,
                continued: bool) -> Choice | None:
        """NOTE [ branched runs ]: the parent's checkpoint and the ``branch`` event, or None
        when this run is that branch relaunched (it has checkpoints of its own)."""
        if from_run == self.run_id:
            raise CheckpointRestoreError(
                f"run {self.run_id} cannot branch from itself: pass restore(step=...) to "
                "resume it, or branch into a new run id")
        recorded = self.ledger.events(self.run_id, EVENT_BRANCH)
        parents = {(e.detail.get("parent_run"), e.detail.get("parent_step")) for e in recorded}
        if scan.committed or scan.damaged:
            if any(run == from_run for run, _ in parents):
                log.info("run %s was branched from run %s already: it goes on from its own "
                         "newest checkpoint", self.run_id, from_run)
                return None
            raise CheckpointRestoreError(
                f"run {self.run_id} already has checkpoints "
                f"({[r.step for r in scan.committed]}), and was not branched from run "
                f"{from_run!r} (its branch: {sorted(parents) or 'none'}): a run branches once, "
                "before its first save. Branch into a new run id. Nothing was changed")
        parent = RestorePolicy(self.ledger, self.storage, from_run, self.owner,
                               keep_last=self.keep_last)
        record = parent.choose(step, tag, require=True, read_only=True).record
        assert record is not None  # require=True
        detail = {"parent_run": from_run, "parent_checkpoint_id": record.checkpoint_id,
                  "parent_step": record.step, "reader": "continued" if continued and
                  record.reader_state else "fresh", "owner": self.owner, **_host()}
        log.info("run %s branches from run %s step %d (checkpoint %s)", self.run_id, from_run,
                 record.step, record.checkpoint_id)
        return Choice(record, (LedgerEvent(EVENT_BRANCH, detail),), branch=True)

    def _attempted_steps(self) -> list[int]:
        """Steps of the run's save attempts on storage: a directory ``step-N-...`` proves the
        previous job trained up to step N, committed or not."""
        return [int(m.group(1)) for name in self.storage.list(self.run_id)
                if (m := _ATTEMPT.match(name))]

    def _start_over(self, skipped: list[dict[str, Any]], scan: RunScan) -> Choice:
        """Nothing can be restored: retire every checkpoint and start the run from its
        beginning, so no row trains a model twice and none is skipped; what the lost
        checkpoints trained is lost, and the ledger says so (``retired``, ``restart``)."""
        events = _retired_events(skipped, scan)
        steps = sorted({int(e.detail["step"]) for e in events})
        log.warning("run %s: %s; they are retired and the run starts over from its beginning",
                    self.run_id, self._none_restorable(skipped, scan))
        events.append(LedgerEvent("restart", {"retired_steps": steps, "owner": self.owner,
                                              **_host()}))
        return Choice(None, tuple(events), check_head=False)

    def _none_restorable(self, skipped: list[dict[str, Any]], scan: RunScan) -> str:
        detail = [f"step {s['step']}: {'; '.join(s['problems'])}" for s in skipped]
        if scan.damaged:
            detail.append(f"steps {sorted(d.step for d in scan.damaged)}: ledger records fail "
                          "their checksum")
        return (f"no checkpoint of run {self.run_id} under {self.storage.root} can be "
                f"restored: {' | '.join(detail)}")

    def _fresh(self, require: bool) -> None:
        """A run with no checkpoint: say which runs the ledger does hold (a typo in run_id
        would otherwise start a second run beside the real one)."""
        others = sorted({r.run_id for r in self.ledger.checkpoints()} - {self.run_id})
        where = f"ledger {self.ledger.describe()}"
        if require:
            raise CheckpointRestoreError(
                f"run {self.run_id!r} has no checkpoint in {where}, and restore(require=True) "
                f"does not start fresh. Runs there: {others or 'none'}; check run_id and the "
                "checkpoint root")
        if others:
            log.warning("run %r has no checkpoint in %s: it starts fresh. Other runs there: %s "
                        "(a typo in run_id? restore(require=True) refuses to start fresh)",
                        self.run_id, where, others)

    def _refuse_if_owned(self, scan: RunScan) -> None:
        """With ``takeover="refuse"``: fail while another job owns the run and is live (it
        committed a checkpoint or a heartbeat within ``live_for``); a silent owner is dead."""
        if self.takeover != "refuse":
            return
        owner = self.ledger.owner(self.run_id)
        if owner is None or owner == self.owner:
            return
        newest = scan.committed[-1] if scan.committed else None
        stamps = [r.committed_at for r in scan.committed[-6:] if r.committed_at is not None]
        seen = [s.timestamp() for s in stamps[-1:]]
        beat = self.progress.last_beat(owner) if self.progress is not None else None
        seen += [beat] if beat is not None else []
        age = time.time() - max(seen) if seen else None
        live_for = self.live_for if self.live_for is not None else _live_for(stamps)
        if age is None or age > live_for:
            log.warning("run %s: its owner job %s is silent (last sign of life %s): taken "
                        "over as a dead job's run", self.run_id, owner,
                        "never" if age is None else f"{age:.0f} s ago > {live_for:.0f} s")
            return
        last = ("no checkpoint yet" if newest is None else
                f"last commit step {newest.step}, last sign of life {age:.0f} s ago")
        raise RunInUseError(
            f"run {self.run_id} in ledger {self.ledger.describe()} is owned by live job {owner} "
            f"({last}; a job counts as live for {live_for:.0f} s after its last checkpoint or "
            "heartbeat), and this manager was created with takeover='refuse': this job stops, "
            "the owner goes on. To take the run over deliberately, stop the owner or create "
            "the manager with takeover='fence' (the owner then fails at its next save); to "
            "train beside it, use another run_id")

    # ----------------------------------------------------------------------------- claim

    def claim(self, choice: Choice) -> None:
        """The one commit of a restore: retirements, the ``restore`` (or ``restart``/
        ``claim``) event, and this job as the run's owner (the previous owner is fenced).

        Raises:
            CommitConflictError: another job committed to the run meanwhile: choose again.
        """
        head = choice.record.checkpoint_id if choice.record is not None and not choice.branch \
            else None
        self.ledger.claim(self.run_id, self.owner, list(choice.events), head=head,
                          check_head=choice.check_head)


def _live_for(stamps: Sequence[datetime]) -> float:
    if len(stamps) < 2:
        return _LIVE_DEFAULT_S
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(stamps)]
    return max(_LIVE_FLOOR_S, 3 * statistics.median(gaps))


def _host() -> dict[str, str]:
    return {"host": socket.gethostname()}


def _retired_events(skipped: list[dict[str, Any]], scan: RunScan,
                    after_step: int | None = None) -> list[LedgerEvent]:
    """``retired`` events for what restore skipped: checkpoints whose files are missing or
    fail verification, and records failing their checksum (only those after ``after_step``)."""
    events = [LedgerEvent(EVENT_RETIRED, {
        "checkpoint_id": s["checkpoint_id"], "step": s["step"], "missing": s["missing"],
        "reason": ("model files missing: " if s["missing"] else
                   "model files fail verification: ") + "; ".join(s["problems"])})
        for s in skipped]
    events += [LedgerEvent(EVENT_RETIRED, {
        "checkpoint_id": d.checkpoint_id, "step": d.step,
        "reason": f"its ledger {d.record} record fails its checksum"})
        for d in scan.damaged
        if d.checkpoint_id and (after_step is None or d.step > after_step)]
    return events
