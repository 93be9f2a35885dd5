"""``lakeckpt chaos``: attack a scratch training run and count what went wrong.

Every trial trains a small job (``lakeckpt_tables.checkpoint._chaos_job``) from a scratch Delta
table into a fresh checkpoint root, attacks it with one randomly chosen fault, then resumes
until the job finishes (or gives up), and checks what trained the final model:

- ``kill``: SIGKILL at a random crash point of the two-phase commit (``LAKECKPT_CRASH_AT``)
  and save, one process; ``kill-torchrun``: the same in a random rank of a 2-rank torchrun job;
- ``model-bitflip``: bits flipped in the newest checkpoint's model files (restore must fall
  back); ``ledger-bitflip``: bits flipped in a random ledger file (a named error with the way
  out, which the campaign then takes); ``tampered-state``: the newest reader state rewritten in
  the ledger (the record's checksum must catch it);
- ``concurrent``: two jobs of the same run at once (one is fenced by name).

Printed per campaign: trials, duplicated and skipped rows (from the trained-id logs and from
the ledger's consumption records of the committed chain), named and unnamed errors, stuck runs
(a process that outlived ``--timeout``), undetected damage.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["register", "run"]

SCENARIOS = ("kill", "kill-torchrun", "model-bitflip", "ledger-bitflip", "tampered-state",
             "concurrent")
_POINTS = ("prepare:before_write", "prepare:mid_write", "prepare:after_write", "commit:before",
           "commit:after")
_ROWS = 240
_BATCH = 16
_ATTEMPTS = 5


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=30, help="number of attacked runs")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault choices")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated subset of {', '.join(SCENARIOS)}")
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="seconds after which a job counts as stuck")
    parser.add_argument("--output", choices=("table", "json"), default="table")


@dataclass
class Trial:
    """What one attacked run came to."""

    scenario: str
    fault: str
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

    def __init__(self, table: Path, root: Path, out: Path, timeout: float) -> None:
        self.table, self.root, self.out, self.timeout = table, root, out, timeout

    def start(self, *, nproc: int = 1, crash: str | None = None, out: Path | None = None,
              pause: float = 0.0) -> subprocess.Popen[bytes]:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        env.pop("LAKECKPT_CRASH_AT", None)
        if crash:
            env["LAKECKPT_CRASH_AT"] = crash
        args = ["--table", str(self.table), "--root", str(self.root),
                "--out", str(out or self.out), "--batch", str(_BATCH), "--pause", str(pause)]
        module = ["-m", "lakeckpt_tables.checkpoint._chaos_job"]
        if nproc == 1:
            cmd = [sys.executable, *module, *args]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={nproc}", "--max-restarts=0", *module, *args]
        (out or self.out).mkdir(parents=True, exist_ok=True)
        for old in (out or self.out).glob("outcome*.txt"):
            old.unlink()
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)

    def wait(self, proc: subprocess.Popen[bytes], trial: Trial, *, crash: bool,
             out: Path | None = None) -> bool:
        """Wait for a job; record its errors; True when every rank finished."""
        trial.attempts += 1
        try:
            proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            trial.stuck += 1
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return False
        outcomes = [p.read_text().strip() for p in sorted((out or self.out).glob("outcome*"))]
        for text in outcomes:
            kind, _, rest = text.partition(" ")
            if kind == "named":
                trial.named.append(rest.split(" ", 1)[0])
            elif kind == "unnamed":
                trial.unnamed.append(rest[:200])
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
                _repair_ledger(self.root)


def _repair_ledger(root: Path) -> None:
    """The way out LedgerCorruptError names: move unreadable files aside, repair the log."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    ledger = root / "_ledger"
    for path in ledger.glob("*.parquet"):
        try:
            pq.read_table(path, page_checksum_verification=True)
        except Exception:
            path.rename(root / f"aside-{path.name}")
    DeltaTable(str(ledger)).repair()


def _flip_bits(path: Path, rng: random.Random, flips: int) -> None:
    data = bytearray(path.read_bytes())
    for _ in range(flips):
        k = rng.randrange(len(data))
        data[k] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def _events(root: Path, name: str) -> int:
    from lakeckpt_tables.ledger import DeltaLedger

    rows = DeltaLedger(str(root / "_ledger")).to_arrow()
    return sum(1 for e in rows["event"].to_pylist() if e == name)


def _newest(root: Path) -> Any:
    from lakeckpt_tables.ledger import DeltaLedger

    records = DeltaLedger(str(root / "_ledger")).checkpoints("run")
    return records[-1] if records else None


def _trial(scenario: str, rng: random.Random, table: Path, work: Path,
           timeout: float) -> Trial:
    root, out = work / "ckpt", work / "out"
    job = _Job(table, root, out, timeout)
    if scenario in ("kill", "kill-torchrun"):
        nproc = 2 if scenario == "kill-torchrun" else 1
        point = rng.choice(_POINTS)
        rank = rng.randrange(nproc) if not point.startswith("commit") else 0
        crash = f"{point}@{rank}#{rng.randint(1, 3)}"
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
            _damage(scenario, rng, root, newest, trial)
        retired_before = _safe_events(root, "retired") if newest is not None else 0
        job.finish(trial)
        detected = bool(trial.named) or _safe_events(root, "retired") > retired_before
        if newest is not None and not detected and scenario != "ledger-bitflip":
            trial.undetected_damage += 1
    _check(trial, table, root, [out])
    return trial


def _safe_events(root: Path, name: str) -> int:
    try:
        return _events(root, name)
    except Exception:
        return 0


def _damage(scenario: str, rng: random.Random, root: Path, newest: Any, trial: Trial) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if scenario == "model-bitflip":
        files = sorted(p for p in (root / newest.model_location).iterdir() if p.is_file())
        target = rng.choice(files)
        _flip_bits(target, rng, rng.randint(1, 4))
        trial.fault = f"{trial.fault}, bits flipped in {target.name}"
    elif scenario == "ledger-bitflip":
        files = sorted((root / "_ledger").glob("*.parquet"))
        target = rng.choice(files)
        _flip_bits(target, rng, rng.randint(1, 8))
        trial.fault = f"{trial.fault}, bits flipped in ledger file {files.index(target)}"
    else:  # tampered-state: a validly written file whose newest reader state says otherwise
        for path in (root / "_ledger").glob("*.parquet"):
            rows = pq.read_table(path)
            ids = rows["checkpoint_id"].to_pylist()
            kinds = rows["record"].to_pylist()
            states = rows["reader_state"].to_pylist()
            changed = False
            for k, (cid, kind) in enumerate(zip(ids, kinds, strict=True)):
                if cid == newest.checkpoint_id and kind == "checkpoint" and states[k]:
                    text = states[k]
                    i = rng.randrange(len(text))
                    states[k] = text[:i] + ("A" if text[i] != "A" else "B") + text[i + 1:]
                    changed = True
            if changed:
                col = rows.schema.get_field_index("reader_state")
                pq.write_table(rows.set_column(col, rows.schema.field(col),
                                               pa.array(states, pa.string())), path)
                trial.fault = f"{trial.fault}, reader state of step {newest.step} rewritten"


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


def _summary(trials: list[Trial], seconds: float) -> dict[str, Any]:
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
        "seconds": round(seconds, 1),
    }


def run(args: argparse.Namespace) -> int:
    """Run the campaign; exit 0 when nothing went wrong, 1 otherwise."""
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown or not scenarios:
        raise SystemExit(f"lakeckpt chaos: unknown scenarios {sorted(unknown)}; "
                         f"choose among {', '.join(SCENARIOS)}")
    rng = random.Random(args.seed)
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="lakeckpt-chaos-"))
    base.mkdir(parents=True, exist_ok=True)
    table = base / "table"
    if not table.exists():
        _scratch_table(table)
    t0 = time.monotonic()
    trials = []
    for k in range(args.trials):
        work = base / f"trial-{k:04d}"
        shutil.rmtree(work, ignore_errors=True)
        trial = _trial(scenarios[k % len(scenarios)] if k < len(scenarios)
                       else rng.choice(scenarios), rng, table, work, args.timeout)
        trials.append(trial)
        if args.output == "table":
            print(f"trial {k:4d} {trial.scenario:15s} finished={trial.finished!s:5s} "
                  f"attempts={trial.attempts} named={trial.named} unnamed={trial.unnamed} "
                  f"dup={trial.duplicated}+{trial.ledger_duplicated} "
                  f"skip={trial.skipped}+{trial.ledger_skipped} stuck={trial.stuck} "
                  f"({trial.fault})", flush=True)
    summary = _summary(trials, time.monotonic() - t0)
    if args.output == "json":
        print(json.dumps({"summary": summary, "trials": [asdict(t) for t in trials]}))
    else:
        for key, value in summary.items():
            print(f"{key:18s} {value}")
    bad = (summary["duplicated_rows"] or summary["skipped_rows"] or summary["unnamed_errors"]
           or summary["stuck_runs"] or summary["undetected_damage"]
           or summary["finished"] != summary["trials"])
    return 1 if bad else 0
