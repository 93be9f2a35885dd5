"""``lakeckpt chaos``: attack a scratch training run and count what went wrong.

Every trial trains a small job (``lakeckpt_tables.tools.chaos.job``) from a scratch Delta
table into a fresh checkpoint root, attacks it with one randomly chosen fault, then resumes
until the job finishes (or gives up), and checks what trained the final model:

- ``kill``: SIGKILL at a random crash point of the two-phase commit and save
  (``LAKECKPT_CRASH_AT``; ``ledger:prepared`` leaves an orphan ledger file), one process;
  ``kill-torchrun``: the same in a random rank of a 2-rank torchrun job;
- ``model-bitflip``: bits flipped in the newest checkpoint's model files (restore must fall
  back); ``ledger-bitflip``: bits flipped in a random ledger file (a named error with the way
  out, which the campaign then takes); ``tampered-state``: the newest reader state rewritten in
  the ledger (the record's checksum must catch it);
- ``concurrent``: two jobs of the same run at once (one is fenced by name).

Printed per campaign: trials, duplicated and skipped rows (from the trained-id logs and from
the ledger's consumption records of the committed chain), named and unnamed errors, stuck runs
(a process that outlived ``--timeout``), undetected damage.

A campaign accumulates: ``--dir D`` keeps one JSON line per finished trial in ``D/trials.jsonl``,
trial k's scenario and faults follow from ``(seed, k)`` alone, and a rerun skips the trials
already there, so ``--trials 1000`` can run in pieces and the summary counts them all.
Single-process jobs are forked from a server that imported torch and deltalake once
(``--launch fork``, see :mod:`.job`); ``--launch exec`` starts each in a fresh interpreter.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any

from lakeckpt_tables.tools.chaos.faults import damage, repair_ledger
from lakeckpt_tables.tools.chaos.launcher import Launcher, Proc

__all__ = ["register", "run"]

SCENARIOS = ("kill", "kill-torchrun", "model-bitflip", "ledger-bitflip", "tampered-state",
             "concurrent")
_POINTS = ("prepare:before_write", "prepare:mid_write", "prepare:after_write", "commit:before",
           "ledger:prepared", "commit:after")
_ROWS = 240
_BATCH = 16
_ATTEMPTS = 5
_RESULTS = "trials.jsonl"  # one line per finished trial, in the order they finished
_CAMPAIGN = "campaign.json"  # the seed and scenarios the trials of a --dir belong to


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=30, help="number of attacked runs")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault choices")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated subset of {', '.join(SCENARIOS)}")
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="seconds after which a job counts as stuck")
    parser.add_argument("--output", choices=("table", "json"), default="table")
    parser.add_argument("--jobs", type=int, default=1, help="trials run at once")
    parser.add_argument("--launch", choices=("fork", "exec"), default="fork",
                        help="start single-process jobs forked from a pre-imported server "
                             "(fork) or each in a fresh interpreter (exec)")
    parser.add_argument("--report", action="store_true",
                        help="print the summary of the trials recorded in --dir, run none "
                             "(also while a campaign runs there)")


@dataclass
class Trial:
    """What one attacked run came to."""

    scenario: str
    fault: str
    index: int = -1
    seconds: float = 0.0
    code: str = ""  # the commit of lakeckpt_tables that ran the trial
    attempts: int = 0
    finished: bool = False
    named: list[str] = field(default_factory=list)
    unnamed: list[str] = field(default_factory=list)
    stuck: int = 0
    duplicated: int = 0
    skipped: int = 0
    ledger_duplicated: int = 0
    ledger_skipped: int = 0
    undetected_damage: int = 0


class _Job:
    """Runs the chaos job (alone or under torchrun) against one root and output directory."""

    def __init__(self, launcher: Launcher, table: Path, root: Path, out: Path,
                 timeout: float) -> None:
        self.launcher = launcher
        self.starts = 0
        self.table, self.root, self.out, self.timeout = table, root, out, timeout
        self.damaged: str | None = None  # the ledger file the last LedgerCorruptError blamed

    def start(self, *, nproc: int = 1, crash: str | None = None, out: Path | None = None,
              pause: float = 0.0) -> Proc:
        args = ["--table", str(self.table), "--root", str(self.root),
                "--out", str(out or self.out), "--batch", str(_BATCH), "--pause", str(pause)]
        (out or self.out).mkdir(parents=True, exist_ok=True)
        for old in [*(out or self.out).glob("outcome*.txt"),
                    *(out or self.out).glob("damaged*.txt")]:
            old.unlink()
        self.starts += 1
        log = (out or self.out).parent / f"job{self.starts}.log"
        return self.launcher.start(args, nproc=nproc, crash=crash, log=log)

    def wait(self, proc: Proc, trial: Trial, *, crash: bool, out: Path | None = None) -> bool:
        """Wait for a job; record its errors; True when every rank finished."""
        trial.attempts += 1
        if not proc.wait(self.timeout):
            trial.stuck += 1
            proc.kill()
            return False
        outcomes = [p.read_text().strip() for p in sorted((out or self.out).glob("outcome*"))]
        for text in outcomes:
            kind, _, rest = text.partition(" ")
            if kind == "named":
                trial.named.append(rest.split(" ", 1)[0])
            elif kind == "unnamed":
                trial.unnamed.append(rest[:200])
        blamed = [p.read_text().strip() for p in sorted((out or self.out).glob("damaged*"))]
        self.damaged = blamed[-1] if blamed else None
        done = bool(outcomes) and all(t.startswith("done") for t in outcomes)
        if not outcomes and not crash:
            trial.unnamed.append(f"exit {proc.returncode} without an outcome")
        return done and proc.returncode == 0

    def run(self, trial: Trial, *, nproc: int = 1, crash: str | None = None) -> bool:
        return self.wait(self.start(nproc=nproc, crash=crash), trial, crash=crash is not None)

    def finish(self, trial: Trial, *, nproc: int = 1) -> None:
        """Resume until the job finishes, taking the way out a named ledger error gives."""
        for _ in range(_ATTEMPTS):
            if self.run(trial, nproc=nproc):
                trial.finished = True
                return
            if trial.named and trial.named[-1] == "LedgerCorruptError":
                repair_ledger(self.root, self.damaged)


def _events(root: Path, name: str) -> int:
    from lakeckpt_tables.ledger import DeltaLedger

    rows = DeltaLedger(str(root / "_ledger")).to_arrow()
    return sum(1 for e in rows["event"].to_pylist() if e == name)


def _newest(root: Path) -> Any:
    from lakeckpt_tables.ledger import DeltaLedger

    records = DeltaLedger(str(root / "_ledger")).checkpoints("run")
    return records[-1] if records else None


def _trial(scenario: str, rng: random.Random, table: Path, work: Path, timeout: float,
           launcher: Launcher) -> Trial:
    root, out = work / "ckpt", work / "out"
    job = _Job(launcher, table, root, out, timeout)
    if scenario in ("kill", "kill-torchrun"):
        nproc = 2 if scenario == "kill-torchrun" else 1
        crash = _kill_spec(rng, nproc)
        trial = Trial(scenario, crash)
        job.run(trial, nproc=nproc, crash=crash)
        job.finish(trial, nproc=nproc)
    elif scenario == "concurrent":
        trial = Trial(scenario, "two jobs of one run")
        # each job "trains" 0.3 s a step (~5 s in all), so the second overlaps the first
        first = job.start(out=out, pause=0.3)
        time.sleep(rng.uniform(0.0, 2.0))
        second = job.start(out=work / "out2", pause=0.3)
        job.wait(first, trial, crash=False, out=out)
        job.wait(second, trial, crash=False, out=work / "out2")
        job.finish(trial)
    else:
        crash = f"commit:before#{rng.randint(2, 4)}"
        trial = Trial(scenario, crash)
        job.run(trial, crash=crash)
        newest = _newest(root)
        if newest is not None:
            trial.fault = f"{trial.fault}, {damage(scenario, rng, root, newest)}"
        retired_before = _safe_events(root, "retired") if newest is not None else 0
        job.finish(trial)
        detected = bool(trial.named) or _safe_events(root, "retired") > retired_before
        if newest is not None and not detected and scenario != "ledger-bitflip":
            trial.undetected_damage += 1
    _check(trial, table, root, [out])
    return trial


def _kill_spec(rng: random.Random, nproc: int) -> str:
    """Where a kill trial dies: ``LAKECKPT_CRASH_AT`` (point, rank, which save)."""
    point = rng.choice(_POINTS)
    rank = rng.randrange(nproc) if point.startswith("prepare") else 0  # rank 0 commits
    return f"{point}@{rank}#{rng.randint(1, 3)}"


def _trial_rng(seed: int, k: int) -> random.Random:
    """Trial ``k``'s random choices: a function of ``(seed, k)``, not of the trials before."""
    return random.Random(f"lakeckpt-chaos/{seed}/{k}")


def _safe_events(root: Path, name: str) -> int:
    try:
        return _events(root, name)
    except Exception:
        return 0


def _check(trial: Trial, table: Path, root: Path, outs: list[Path]) -> None:
    """Rows trained twice or never: from the ranks' logs, and from the ledger's chain."""
    if not trial.finished:
        return
    trained: Counter[int] = Counter()
    for out in outs:
        for path in out.glob("rank*.log"):
            for line in path.read_text().splitlines():
                trained.update(int(i) for i in line.split(" ", 1)[1].split(","))
    from lakeckpt_tables import DeltaSource
    from lakeckpt_tables.ledger import DeltaLedger

    units = DeltaSource(str(table)).snapshot().units
    if trial.scenario != "concurrent":  # two jobs' logs overlap by design; the ledger decides
        trial.duplicated = sum(n - 1 for n in trained.values() if n > 1)
        trial.skipped = len(set(range(_ROWS)) - set(trained))

    ledger = DeltaLedger(str(root / "_ledger"))
    chain = _lineage(ledger)
    consumed: Counter[tuple[str, int]] = Counter()
    for rec in ledger.consumption(run_id="run").to_pylist():
        if rec["checkpoint_id"] in chain:
            consumed[(rec["file"], rec["row_group"])] += rec["rows"]
    expected: Counter[tuple[str, int]] = Counter()
    for unit in units:
        expected[(unit.path, unit.row_group)] += unit.rows
    if trial.scenario == "ledger-bitflip" and list(root.glob("aside-*")):
        return  # records of the files moved aside are gone with them, by the way out taken
    for key in expected.keys() | consumed.keys():
        diff = consumed[key] - expected[key]
        trial.ledger_duplicated += max(diff, 0)
        trial.ledger_skipped += max(-diff, 0)


def _lineage(ledger: Any) -> set[str]:
    """Ids of the newest committed checkpoint and its ancestors: what trained the final model.

    Followed through every checkpoint row, damaged ones included: a record that fails its
    checksum is ignored by restore, but when it is an ancestor of the newest checkpoint its
    training was not lost, and its (intact) consumption records count.
    """
    import pyarrow.compute as pc

    committed = ledger.checkpoints("run")
    if not committed:
        return set()
    rows = ledger.to_arrow().filter(pc.field("record") == "checkpoint")
    parents = dict(zip(rows["checkpoint_id"].to_pylist(), rows["parent_id"].to_pylist(),
                       strict=True))
    chain: set[str] = set()
    current: str | None = committed[-1].checkpoint_id
    while current is not None and current not in chain:
        chain.add(current)
        current = parents.get(current)
    return chain


def _scratch_table(path: Path) -> None:
    import numpy as np
    import pyarrow as pa
    from deltalake import WriterProperties, write_deltalake

    props = WriterProperties(max_row_group_size=40)
    for start in range(0, _ROWS, 80):
        ids = np.arange(start, start + 80, dtype=np.int64)
        write_deltalake(str(path), pa.table({"id": ids}), mode="append",
                        writer_properties=props)


def _summary(trials: list[Trial], seconds: float, resumed: int) -> dict[str, Any]:
    return {
        "trials": len(trials),
        "finished": sum(t.finished for t in trials),
        "duplicated_rows": sum(t.duplicated + t.ledger_duplicated for t in trials),
        "skipped_rows": sum(t.skipped + t.ledger_skipped for t in trials),
        "named_errors": dict(Counter(n for t in trials for n in t.named)),
        "unnamed_errors": sum(len(t.unnamed) for t in trials),
        "stuck_runs": sum(t.stuck for t in trials),
        "undetected_damage": sum(t.undetected_damage for t in trials),
        "by_scenario": dict(Counter(t.scenario for t in trials)),
        "by_code": dict(Counter(t.code for t in trials)),
        "resumed": resumed,
        "seconds": round(seconds, 1),
        "trial_seconds": round(sum(t.seconds for t in trials), 1),
    }


def _campaign(base: Path, seed: int, scenarios: list[str]) -> IO[bytes]:
    """Bind ``base`` to one campaign: its trials are only counted with the same settings.

    Returns:
        The open lock file: one campaign at a time runs in ``base``.
    """
    lock = open(base / ".lock", "wb")  # noqa: SIM115 (held until the campaign ends)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise SystemExit(f"lakeckpt chaos: another campaign is running in {base}; wait for "
                         "it to end, or choose another --dir") from None
    path = base / _CAMPAIGN
    settings = {"seed": seed, "scenarios": scenarios}
    if not path.exists():
        path.write_text(json.dumps(settings) + "\n")
        return lock
    held = json.loads(path.read_text())
    if held != settings:
        lock.close()
        raise SystemExit(f"lakeckpt chaos: {base} holds the trials of a campaign with seed "
                         f"{held['seed']} and scenarios {','.join(held['scenarios'])}; rerun "
                         "with those settings to add to it, or choose another --dir")
    return lock


def _finished(base: Path) -> dict[int, Trial]:
    """The trials recorded in ``base``; a line cut short by a killed campaign is run again."""
    path = base / _RESULTS
    known = {f.name for f in fields(Trial)}
    done: dict[int, Trial] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            trial = Trial(**{k: v for k, v in record.items() if k in known})
            done[trial.index] = trial
    return done


def _end_line(path: Path) -> None:
    """Keep a line that a killed campaign cut short apart from the lines appended next."""
    if path.exists() and path.stat().st_size:
        with open(path, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")


def _code_version() -> str:
    """The git commit of this package (``+`` when its files differ), or ``unknown``."""
    here = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=30, check=True)
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "."],
                               capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def _run_one(k: int, seed: int, scenarios: list[str], base: Path, timeout: float,
             launcher: Launcher, code: str) -> Trial:
    """Trial ``k``: its scenario and every random choice follow from ``(seed, k)`` alone."""
    rng = _trial_rng(seed, k)
    work = base / f"trial-{k:04d}"
    shutil.rmtree(work, ignore_errors=True)
    t0 = time.monotonic()
    trial = _trial(scenarios[k % len(scenarios)], rng, base / "table", work, timeout, launcher)
    trial.index, trial.seconds, trial.code = k, round(time.monotonic() - t0, 1), code
    return trial


def run(args: argparse.Namespace) -> int:
    """Run the campaign; exit 0 when nothing went wrong, 1 otherwise."""
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown or not scenarios:
        raise SystemExit(f"lakeckpt chaos: unknown scenarios {sorted(unknown)}; "
                         f"choose among {', '.join(SCENARIOS)}")
    if args.jobs < 1:
        raise SystemExit("lakeckpt chaos: --jobs must be at least 1")
    if args.report:
        if not args.dir or not (Path(args.dir) / _RESULTS).exists():
            raise SystemExit(f"lakeckpt chaos: --report reads {_RESULTS} of a campaign's --dir; "
                             f"{args.dir} has none")
        recorded = _finished(Path(args.dir))
        return _report([recorded[k] for k in sorted(recorded)], 0.0, len(recorded), args.output)
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="lakeckpt-chaos-"))
    base.mkdir(parents=True, exist_ok=True)
    lock = _campaign(base, args.seed, scenarios)
    table = base / "table"
    if not (table / "_delta_log").exists():
        shutil.rmtree(table, ignore_errors=True)
        _scratch_table(table)
    done = {k: t for k, t in _finished(base).items() if k < args.trials}
    resumed = len(done)
    todo = iter([k for k in range(args.trials) if k not in done])
    launcher = Launcher(args.launch)
    code = _code_version()
    t0 = time.monotonic()
    _end_line(base / _RESULTS)
    # SIGTERM (as SIGINT) ends the campaign cleanly: its jobs are killed, its trials kept
    # (restored after: a campaign run inside another program, a test, leaves its handler be)
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with lock, ThreadPoolExecutor(args.jobs) as pool, open(base / _RESULTS, "a") as results:
            running: set[Future[Trial]] = set()
            try:
                while True:
                    for k in todo:
                        running.add(pool.submit(_run_one, k, args.seed, scenarios, base,
                                                args.timeout, launcher, code))
                        if len(running) >= args.jobs:
                            break
                    if not running:
                        break
                    ended, running = wait(running, return_when=FIRST_COMPLETED)
                    for future in ended:
                        trial = future.result()  # a failure of the campaign itself stops it
                        done[trial.index] = trial
                        results.write(json.dumps(asdict(trial)) + "\n")
                        results.flush()
                        if args.output == "table":
                            _print(trial)
                            if len(done) % 25 == 0:
                                _tally(list(done.values()))
            except BaseException:
                launcher.stop()
                raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    return _report([done[k] for k in sorted(done)], time.monotonic() - t0, resumed, args.output)


def _report(trials: list[Trial], seconds: float, resumed: int, output: str) -> int:
    """Print the summary; 0 when nothing went wrong, 1 otherwise."""
    summary = _summary(trials, seconds, resumed)
    if output == "json":
        print(json.dumps({"summary": summary, "trials": [asdict(t) for t in trials]}))
    else:
        for key, value in summary.items():
            print(f"{key:18s} {value}")
    bad = (summary["duplicated_rows"] or summary["skipped_rows"] or summary["unnamed_errors"]
           or summary["stuck_runs"] or summary["undetected_damage"]
           or summary["finished"] != summary["trials"])
    return 1 if bad else 0


def _tally(trials: list[Trial]) -> None:
    s = _summary(trials, 0.0, 0)
    print(f"so far: {s['trials']} trials, {s['finished']} finished, {s['duplicated_rows']} "
          f"duplicated rows, {s['skipped_rows']} skipped rows, {s['unnamed_errors']} unnamed "
          f"errors, {s['stuck_runs']} stuck runs, {s['undetected_damage']} undetected damage",
          flush=True)


def _print(trial: Trial) -> None:
    print(f"trial {trial.index:4d} {trial.scenario:15s} finished={trial.finished!s:5s} "
          f"attempts={trial.attempts} named={trial.named} unnamed={trial.unnamed} "
          f"dup={trial.duplicated}+{trial.ledger_duplicated} "
          f"skip={trial.skipped}+{trial.ledger_skipped} stuck={trial.stuck} "
          f"{trial.seconds:.1f}s ({trial.fault})", flush=True)
