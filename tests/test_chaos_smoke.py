"""``lakeckpt chaos`` in its short form: a kill inside a save and a rewritten reader state, and a
campaign that accumulates across runs in one ``--dir``."""

from __future__ import annotations

import fcntl
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from lakeckpt_tables.cli import main
from lakeckpt_tables.tools.chaos.campaign import _kill_spec, _trial_rng
from lakeckpt_tables.tools.chaos.faults import repair_ledger

_CLI = "import sys; from lakeckpt_tables.cli import main; sys.exit(main())"


def _chaos(work: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _CLI, "chaos", "--scenarios", "kill,tampered-state", "--seed",
         "3", "--dir", str(work), "--output", "json", "--timeout", "100", *args],
        capture_output=True, text=True, timeout=250)
    result: dict[str, Any] = json.loads(done.stdout)
    assert done.returncode == 0, (result["summary"], done.stderr[-2000:])
    return result


def _figures(summary: dict[str, Any]) -> tuple[int, ...]:
    return (summary["trials"], summary["finished"], summary["duplicated_rows"],
            summary["skipped_rows"], summary["unnamed_errors"], summary["stuck_runs"],
            summary["undetected_damage"], summary["resumed"])


@pytest.mark.slow
@pytest.mark.timeout(300)  # ~35 s idle (124 s at load 15-20): 3 trials, jobs forked
def test_a_short_chaos_campaign_finds_nothing_wrong_and_resumes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = _chaos(tmp_path, "--trials", "2", "--jobs", "2")
    assert _figures(first["summary"]) == (2, 2, 0, 0, 0, 0, 0, 0)
    assert first["summary"]["by_scenario"] == {"kill": 1, "tampered-state": 1}
    kill, tampered = first["trials"]
    assert kill["attempts"] >= 2 and tampered["attempts"] >= 2
    assert "reader state of step" in tampered["fault"]
    # each job's output is kept: the restart said what it skipped and why
    restart = (tmp_path / "trial-0001" / "job2.log").read_text()
    assert "fails its checksum and is ignored" in restart
    # trial k's faults follow from (seed, k) alone, whoever runs it and whenever
    assert kill["fault"] == _kill_spec(_trial_rng(3, 0), 1)

    # the campaign goes on: the 2 recorded trials are counted, not run again; trial 2 runs
    second = _chaos(tmp_path, "--trials", "3")
    assert _figures(second["summary"]) == (3, 3, 0, 0, 0, 0, 0, 2)
    assert second["summary"]["by_scenario"] == {"kill": 2, "tampered-state": 1}
    assert second["trials"][:2] == first["trials"]
    assert [t["index"] for t in second["trials"]] == [0, 1, 2]
    assert second["trials"][2]["fault"] == _kill_spec(_trial_rng(3, 2), 1)
    assert all(t["code"] for t in second["trials"])  # which commit ran each trial
    lines = (tmp_path / "trials.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["index"] for line in lines) == [0, 1, 2]
    # --report reads the same figures back without running a trial
    assert main(["chaos", "--dir", str(tmp_path), "--report", "--output", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert _figures(report["summary"]) == (3, 3, 0, 0, 0, 0, 0, 3)
    assert report["trials"] == second["trials"]


def test_a_campaign_directory_takes_only_its_own_trials(tmp_path: Path) -> None:
    base = ["chaos", "--trials", "0", "--launch", "exec", "--dir", str(tmp_path)]
    with pytest.raises(SystemExit, match=r"--report reads trials\.jsonl"):
        main(["chaos", "--dir", str(tmp_path), "--report"])
    before = signal.getsignal(signal.SIGTERM)
    assert main([*base, "--seed", "3"]) == 0
    # its SIGTERM handler ends with the campaign: later work (tests, forked workers) keeps its own
    assert signal.getsignal(signal.SIGTERM) is before
    with pytest.raises(SystemExit, match="campaign with seed 3 and scenarios kill,"):
        main([*base, "--seed", "4"])
    # a trial line cut short by a killed campaign is run again, and the next line stays whole
    (tmp_path / "trials.jsonl").write_text('{"scenario": "kill", "fault": "x", "ind')
    assert main([*base, "--seed", "3"]) == 0
    assert (tmp_path / "trials.jsonl").read_text().endswith('"ind\n')
    with open(tmp_path / ".lock", "wb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(SystemExit, match="another campaign is running in"):
            main([*base, "--seed", "3"])


def _jobs_in(work: Path, campaign: int) -> list[int]:
    """Processes other than the campaign whose command line names ``work``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != campaign:
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if str(work).encode() in cmdline:
                found.append(int(entry.name))
    return found


@pytest.mark.timeout(120)
def test_a_stopped_campaign_leaves_no_job_behind(tmp_path: Path) -> None:
    campaign = subprocess.Popen(
        [sys.executable, "-c", _CLI, "chaos", "--trials", "1", "--scenarios", "concurrent",
         "--launch", "exec", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    while len(_jobs_in(tmp_path, campaign.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)  # both jobs of the trial running, each in a session of its own
    assert len(_jobs_in(tmp_path, campaign.pid)) == 2
    campaign.send_signal(signal.SIGTERM)
    assert campaign.wait(timeout=60) == 130
    assert _jobs_in(tmp_path, campaign.pid) == []
    assert (tmp_path / "trials.jsonl").read_text() == ""  # the trial cut short runs again


def test_the_campaign_takes_the_way_out_on_the_file_the_error_names(tmp_path: Path) -> None:
    """The damaged ledger file travels as ``LedgerCorruptError.file`` (no message parsing), and
    the campaign moves that file aside even when pyarrow reads it: a flipped bit in a footer's
    schema can leave a file pyarrow reads but the ledger cannot (trial 753 of the seed-3
    campaign: timestamp[ns] where an int32 was)."""
    import pyarrow.parquet as pq
    import torch
    from deltalake import DeltaTable

    from lakeckpt_tables.checkpoint import CheckpointManager
    from lakeckpt_tables.errors import LedgerCorruptError

    manager = CheckpointManager(tmp_path, "run")
    first, second = (manager.save(s, model=torch.nn.Linear(2, 1)).checkpoint_id for s in (1, 2))
    ledger = tmp_path / "_ledger"
    files = {cid: p for p in ledger.glob("*.parquet")
             for cid in pq.read_table(p)["checkpoint_id"].to_pylist()}
    named, kept = files[second], files[first]
    named.write_bytes(named.read_bytes()[:100])
    with pytest.raises(LedgerCorruptError) as caught:
        CheckpointManager(tmp_path, "run").restore(model=torch.nn.Linear(2, 1))
    assert caught.value.file == str(named)
    named.write_bytes(kept.read_bytes())  # readable by pyarrow now
    repair_ledger(tmp_path, caught.value.file)  # moved aside all the same
    assert (tmp_path / f"aside-{named.name}").exists() and kept.exists()
    assert [Path(f).name for f in DeltaTable(str(ledger)).file_uris()] == [kept.name]
    assert CheckpointManager(tmp_path, "run").restore(model=torch.nn.Linear(2, 1)) == 1
