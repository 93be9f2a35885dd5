"""``lakeckpt report``: one self-contained page, checked as a person sees it, in Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from audit_helpers import SimulatedRun, write_table

from lakeckpt_tables.cli import main
from lakeckpt_tables.ledger import DeltaLedger, LedgerEvent

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--hide-scrollbars"]


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("LAKECKPT_REQUIRE_CHROMIUM"):
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium); CI installs it")
    return found


def _browse(page: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    return subprocess.run([_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args,
                           page.as_uri()], capture_output=True, text=True, timeout=90)


@pytest.mark.timeout(240)
def test_the_report_shows_plot_runs_checkpoints_events_and_recoveries_offline(
        tmp_path: Path) -> None:
    table = tmp_path / "t"
    write_table(table)
    ledger = DeltaLedger(str(tmp_path / "ck" / "_ledger"))
    run = SimulatedRun(table, ledger, "run-<b>42</b>", world=2, batch=7, window=3)
    for _ in range(3):
        run.train(5)
        run.checkpoint()
    first = run.run.records[0]
    ledger.record_events(run.run.run_id, [LedgerEvent("restore", {
        "checkpoint_id": first.checkpoint_id, "step": 5, "newest_step": 15, "steps_lost": 10})])
    page = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "ck"), "-o", str(page)]) == 0
    text = page.read_text()
    assert "<script" not in text.lower()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)  # nothing to fetch

    dom = _browse(page, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    # the run id is escaped, never markup
    assert "run-&lt;b&gt;42&lt;/b&gt;" in html and "<b>42</b>" not in html
    for record in run.run.records:
        assert record.checkpoint_id in html
    for section in ("runs-table", "progress-table", "checkpoints-table", "recoveries-table"):
        assert f'id="{section}"' in html
    # newest step, reached step (not recorded), steps lost
    assert re.search(r"<td>15</td>\s*<td></td>\s*<td>10</td>", html)
    assert "<td>restore</td>" in html and 'id="events-table"' in html
    assert "<td>210</td>" in html  # rows consumed by the run (3 x 70)

    shot = tmp_path / "shot.png"
    done = _browse(page, tmp_path, f"--screenshot={shot}", "--window-size=1000,900")
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    import matplotlib.image

    pixels = (matplotlib.image.imread(str(shot))[..., :3] * 255).astype(np.int16)
    # matplotlib's first line colour (#1f77b4) is on screen: the inline plot rendered
    blue = np.abs(pixels - np.array([31, 119, 180])).sum(axis=-1) < 30
    assert blue.sum() > 200
