"""``lakeckpt bench mixture`` end to end at a tiny size: structure, not timings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lakeckpt_tables.cli import main


@pytest.mark.timeout(60)
def test_bench_mixture_reports_both_ratios_as_json(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "mixture", "--docs", "1500", "--rounds", "1", "--min-seconds", "0",
                 "--dir", str(tmp_path), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == (0 if report["passed"] else 1)
    names = [f["name"] for f in report["figures"]]
    assert names == ["packed / unpacked token read", "mixture of two / one source"]
    assert all(f["value"] > 0 and f["target"] == ">= 0.9x" for f in report["figures"])
    assert set(report["rates"]) == {"unpacked", "packed", "mixture"}
    assert (tmp_path / "tokens-1500" / "_delta_log").exists()  # kept for later runs
