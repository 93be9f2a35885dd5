"""What importing costs: the plan is pure and must not pull in torch."""

from __future__ import annotations

import subprocess
import sys


def _modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    return set(out.split())


def test_the_plan_imports_without_torch() -> None:
    loaded = _modules_after("import lakeckpt_tables.plan")
    assert "torch" not in loaded
    assert "deltalake" not in loaded


def test_the_public_names_still_import_from_the_package() -> None:
    loaded = _modules_after("from lakeckpt_tables import LakeDataset, DeltaSource, LakeckptError")
    assert "torch" in loaded and "lakeckpt_tables.reader.dataset" in loaded
    assert "pyiceberg" not in loaded
