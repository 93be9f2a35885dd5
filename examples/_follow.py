"""The parent side of ``follow_delta.py`` and ``follow_iceberg.py``: run and check.

The parent starts the writer, waits until it is about to append, starts the trainer, SIGKILLs
it once it is training appended rows (between two checkpoints), restarts it, waits for both,
and proves from the ids and from the ledger that every row was trained exactly once.

Writer progress lines: ``ready``, ``append <version> <first id> <end id>``,
``nonappend <version> <operation>`` (a commit follow mode must skip), ``done <last version>``.
Trainer progress lines: see :func:`_common.run_trainer`; ``step <n> <max id of the batch>``.
"""

from __future__ import annotations

import itertools
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from _common import (
    Attempt,
    LineReader,
    check_ids,
    delivered_ids,
    ledger_coverage,
    ledger_events,
    ok,
    redelivered_identically,
    run_trainer,
)

__all__ = ["FollowSetup", "prove_follow", "run_follow"]


@dataclass
class FollowSetup:
    """What the parent knows about the run it checks."""

    work: Path
    run_id: str
    initial_rows: int  # ids [0, initial_rows) are in the pinned version
    appended_rows: int  # the writer appends ids [initial_rows, initial_rows + appended_rows)
    pinned: int  # the pinned version / snapshot id
    open_ledger: Callable[[], Any]  # the run's ledger, opened once the children are done
    skip_text: str  # what the reason of the writer's non-append commit says
    checkpoint_every: int


@dataclass
class WriterLog:
    """What the writer reported."""

    appends: list[tuple[int, int, int]]  # (version, first id, end id)
    nonappends: list[tuple[int, str]]  # (version, operation)
    last: int | None  # the last version it committed


def _writer_log(lines: Sequence[str]) -> WriterLog:
    log = WriterLog([], [], None)
    for line in lines:
        kind, *values = line.split()
        if kind == "append":
            log.appends.append((int(values[0]), int(values[1]), int(values[2])))
        elif kind == "nonappend":
            log.nonappends.append((int(values[0]), values[1]))
        elif kind == "done":
            log.last = int(values[0])
    return log


def run_follow(setup: FollowSetup, writer_cmd: list[str], trainer_cmd: list[str]) -> bool:
    """Run the writer and the trainer (killed once, restarted); then prove. True if it holds."""
    work = setup.work
    with open(work / "writer.stderr", "wb") as writer_err, \
            open(work / "trainer.stderr", "wb") as trainer_err:
        writer_proc = subprocess.Popen(writer_cmd, stdout=subprocess.PIPE, stderr=writer_err,
                                       text=True)
        assert writer_proc.stdout is not None
        writer_out = LineReader(writer_proc.stdout)
        if writer_out.wait_for("ready", timeout=60) is None:
            writer_proc.kill()
            print(f"the writer did not start: {_tail(work / 'writer.stderr')}")
            return False
        start = time.monotonic()
        appended_steps = 0

        def kill_if(line: str) -> bool:
            """Once 3 steps trained appended rows, half-way between two checkpoints."""
            nonlocal appended_steps
            event, _, value = line.partition(" ")
            if event != "step":
                return False
            step, max_id = (int(v) for v in value.split())
            appended_steps += max_id >= setup.initial_rows
            return (appended_steps >= 3
                    and step % setup.checkpoint_every == max(setup.checkpoint_every // 2, 1))

        first = run_trainer([*trainer_cmd, "--step-log", str(work / "attempt-1.steps")],
                            Attempt(1, work / "attempt-1.steps"), kill_if=kill_if,
                            stderr=trainer_err)
        writer_busy = writer_proc.poll() is None
        last_saved = first.committed[-1] if first.committed else "none"
        print(f"trainer attempt 1: trained steps 1..{first.last_step}, "
              f"{'SIGKILLed' if first.sigkilled else f'exit code {first.returncode}'} at "
              f"{time.monotonic() - start:.1f} s; last checkpoint committed: step {last_saved}; "
              f"the writer was {'still appending' if writer_busy else 'done already'}")
        second = run_trainer([*trainer_cmd, "--step-log", str(work / "attempt-2.steps")],
                             Attempt(2, work / "attempt-2.steps"), stderr=trainer_err)
        print(f"trainer attempt 2: restored step {second.resumed_from}, trained to step "
              f"{second.last_step}, exit code {second.returncode}, at "
              f"{time.monotonic() - start:.1f} s")
        writer_code = writer_proc.wait(timeout=120)
        writer = _writer_log(writer_out.join())
    print(f"writer: exit code {writer_code}, {len(writer.appends)} appends, non-append "
          f"commits: {', '.join(f'version {v} ({op})' for v, op in writer.nonappends) or 'none'}")
    if writer_code != 0 or not first.sigkilled or second.returncode != 0:
        print("a child failed or was not killed as planned")
        print(f"trainer stderr: {_tail(work / 'trainer.stderr')}")
        print(f"writer stderr: {_tail(work / 'writer.stderr')}")
        return False
    return prove_follow(setup, [first, second], writer)


def prove_follow(setup: FollowSetup, attempts: Sequence[Attempt], writer: WriterLog) -> bool:
    """Check the run from the ids and from the ledger; print the proof."""
    expected = np.arange(setup.initial_rows + setup.appended_rows, dtype=np.int64)
    ids, lost = delivered_ids(attempts)
    duplicated, missing = check_ids(ids, expected)
    ids_ok = duplicated == 0 and missing == 0 and len(ids) == len(expected)
    redone = all(redelivered_identically(a, b) for a, b in itertools.pairwise(attempts))

    ledger = setup.open_ledger()
    coverage = ledger_coverage(ledger.consumption(run_id=setup.run_id), expected)
    checkpoints = ledger.checkpoints(setup.run_id)
    events = ledger_events(ledger.to_arrow(), setup.run_id)
    segments = [d for _, e, d in events if e == "segment"]
    skipped = [d for _, e, d in events if e == "skipped_commit"]

    print(f"ledger {ledger.describe()}: {len(checkpoints)} checkpoints of run "
          f"{setup.run_id!r} (steps {', '.join(str(c.step) for c in checkpoints)})")
    spans = {d["segment"]: f"({d['from_version']}, {d['to_version']}]" for d in segments}
    width = max([len(s) for s in spans.values()] + [len(f"pinned {setup.pinned}"), 20])
    print(f"  {'segment':>7}  {'versions (from, to]':<{width}}  {'rows':>5}  {'files':>5}  "
          f"{'consumed':>8}")
    print(f"  {0:>7}  {f'pinned {setup.pinned}':<{width}}  {setup.initial_rows:>5}  "
          f"{'':>5}  {coverage.segments.get(0, 0):>8}")
    for d in segments:
        print(f"  {d['segment']:>7}  {spans[d['segment']]:<{width}}  {d['rows']:>5}  "
              f"{d['files']:>5}  {coverage.segments.get(d['segment'], 0):>8}")
    for d in skipped:
        print(f"  skipped commit: version {d['version']} in segment {d['segment']}: "
              f"{d['reason']}")

    # the segments tile the versions after the pinned one, up to the writer's last
    chain = [setup.pinned] + [d["to_version"] for d in segments]
    tiled = (bool(segments) and [d["segment"] for d in segments] == list(
        range(1, len(segments) + 1)) and all(d["from_version"] == chain[i]
                                               for i, d in enumerate(segments))
             and chain[-1] == writer.last)
    segment_rows = sum(d["rows"] for d in segments) == setup.appended_rows and all(
        coverage.segments.get(d["segment"], 0) == d["rows"] for d in segments) and (
        coverage.segments.get(0, 0) == setup.initial_rows)
    skips_ok = (sorted(d["version"] for d in skipped) == sorted(v for v, _ in writer.nonappends)
                and all(setup.skip_text in d["reason"] for d in skipped))
    lost_text = ", ".join(f"steps {a}..{b}" for a, b in lost) or "no step"
    print(f"ids: {len(expected):,} rows ({setup.initial_rows} pinned + {setup.appended_rows} "
          f"appended), {len(ids):,} trained, {duplicated} duplicated, {missing} missing: "
          f"{ok(ids_ok)}")
    print(f"crash: {lost_text} lost with the SIGKILL, trained again identically after the "
          f"restore: {ok(redone)}")
    print(f"ledger consumption: {coverage.rows:,} rows in {coverage.records} records; "
          f"{coverage.row_groups_exact}/{coverage.row_groups} row groups exactly once, "
          f"{coverage.gap_rows} gap rows, {coverage.overlap_rows} overlap rows; their ids are "
          f"exactly the table's: {ok(coverage.exactly_once)}")
    print(f"ledger segments: {len(segments)} segments tile versions ({setup.pinned}, "
          f"{writer.last}] and hold every appended row: {ok(tiled and segment_rows)}")
    print(f"ledger skipped commits: {len(skipped)}, the writer's non-append commit(s) "
          f"exactly: {ok(skips_ok)}")
    proved = ids_ok and redone and coverage.exactly_once and tiled and segment_rows and skips_ok
    if proved:
        print(f"PROOF OK: all {setup.appended_rows} appended rows (and the "
              f"{setup.initial_rows} pinned ones) trained exactly once across a SIGKILL, by "
              f"the ids and by the ledger; {len(segments)} segments, {len(skipped)} commit(s) "
              "skipped")
    else:
        print("PROOF FAILED: see the lines above")
    return proved


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""
