"""``lakeckpt bench compare``: every ratio that fell more than 10% below the baseline is named,
and the exit status says whether any fell. Crafted reports only: no timing in tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lakeckpt_tables.cli import main
from lakeckpt_tables.tools.bench.compare import BASELINES, compare


def _report(path: Path, ratios: dict[str, float | None], bench: str = "peers") -> str:
    path.write_text(json.dumps({"bench": bench, "shape": "narrow table", "ratios": ratios}))
    return str(path)


def test_a_ratio_that_fell_more_than_ten_percent_fails_and_is_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _report(tmp_path / "base.json", {"a / plain": 1.0, "b / raw": 2.0, "c / hf": 7.0,
                                            "gone": 1.0})
    new = _report(tmp_path / "new.json", {"a / plain": 0.89, "b / raw": 1.82, "c / hf": 9.0,
                                          "added": 3.0})
    assert main(["bench", "compare", new, "--baseline", base]) == 1
    out = capsys.readouterr().out
    assert "1 ratio(s) fell more than 10%: a / plain 1.00x -> 0.89x" in out
    assert "b / raw" in out and "-9%" in out  # within the tolerance, still printed
    assert "only in the baseline" in out and "new" in out
    assert main(["bench", "compare", new, "--baseline", base, "--tolerance", "0.2"]) == 0
    assert "no ratio fell more than 20%" in capsys.readouterr().out


def test_no_fall_passes_and_a_missing_or_unusable_baseline_is_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _report(tmp_path / "base.json", {"a": 1.0, "b": None})
    new = _report(tmp_path / "new.json", {"a": 0.95, "b": 0.5})
    assert main(["bench", "compare", new, "--baseline", base]) == 0
    assert [c.change for c in compare(json.loads(Path(new).read_text()),
                                      json.loads(Path(base).read_text()))] == \
        [pytest.approx(-0.05), None]
    with pytest.raises(SystemExit, match="no committed baseline for bench 'nosuch'"):
        main(["bench", "compare", _report(tmp_path / "x.json", {"a": 1.0}, bench="nosuch")])
    with pytest.raises(SystemExit, match=r"of bench 'workers', .* of bench 'peers'"):
        main(["bench", "compare", _report(tmp_path / "w.json", {"a": 1.0}, bench="workers"),
              "--baseline", base])
    (tmp_path / "bad.json").write_text(json.dumps({"bench": "peers"}))
    with pytest.raises(SystemExit, match="has no 'ratios'"):
        main(["bench", "compare", str(tmp_path / "bad.json"), "--baseline", base])


@pytest.mark.parametrize("bench", ["peers", "workers", "read", "tables"])
def test_each_committed_baseline_is_a_report_of_its_bench_and_the_default(
        bench: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = BASELINES / f"{bench}.json"
    data = json.loads(path.read_text())
    assert data["bench"] == bench and data["shape"]
    assert data["ratios"] and all(v is None or v > 0 for v in data["ratios"].values())
    assert main(["bench", "compare", str(path)]) == 0  # against itself, found by its bench
    assert str(path) in capsys.readouterr().out
