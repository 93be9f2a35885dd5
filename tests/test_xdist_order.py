"""The suite's files start slow ones first under ``--dist loadfile`` (tests/xdist_order.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from xdist_order import pytest_xdist_make_scheduler, slow_files_first


def test_files_holding_a_slow_test_start_first_then_the_most_tests_first(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "few_slow.py").write_text("@pytest.mark.slow\ndef test_a(): ...\n")
    (tmp_path / "t" / "many.py").write_text("def test_a(): ...\n")
    (tmp_path / "t" / "more_slow.py").write_text("pytestmark = pytest.mark.slow\n")
    files = {"t/many.py": ["t/many.py::a", "t/many.py::b", "t/many.py::c"],
             "t/few_slow.py": ["t/few_slow.py::a"],
             "t/more_slow.py": ["t/more_slow.py::a", "t/more_slow.py::b"],
             "t/gone.py": ["t/gone.py::a", "t/gone.py::b"]}
    assert slow_files_first(files, tmp_path) == ["t/more_slow.py", "t/few_slow.py",
                                                 "t/many.py", "t/gone.py"]


def test_the_order_applies_to_loadfile_only(pytestconfig: pytest.Config,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pytestconfig.option, "dist", "load", raising=False)
    assert pytest_xdist_make_scheduler(pytestconfig, None) is None
