"""``lakeckpt chaos`` in its short form: a kill inside a save and a rewritten reader state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

_CLI = "import sys; from lakeckpt_tables.cli import main; sys.exit(main())"


@pytest.mark.slow
@pytest.mark.timeout(420)  # ~40 s on an idle machine; 4 short jobs
def test_a_short_chaos_campaign_finds_nothing_wrong(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CLI, "chaos", "--trials", "2", "--scenarios",
         "kill,tampered-state", "--dir", str(tmp_path), "--output", "json", "--timeout", "100"],
        capture_output=True, text=True, timeout=400)
    result = json.loads(done.stdout)
    summary = result["summary"]
    assert done.returncode == 0, (summary, done.stderr[-2000:])
    assert (summary["trials"], summary["finished"], summary["duplicated_rows"],
            summary["skipped_rows"], summary["unnamed_errors"], summary["stuck_runs"],
            summary["undetected_damage"]) == (2, 2, 0, 0, 0, 0, 0)
    assert summary["by_scenario"] == {"kill": 1, "tampered-state": 1}
    kill, tampered = result["trials"]
    assert kill["attempts"] >= 2 and tampered["attempts"] >= 2
    assert "reader state of step" in tampered["fault"]
