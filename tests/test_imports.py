"""What importing costs: the plan is pure and must not pull in torch; the core never pulls in
the tools."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path


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


def test_reading_a_ledger_and_its_reader_states_imports_without_torch() -> None:
    """`lakeckpt progress` and `verify` decode reader states: importing torch (over a second)
    would be most of what they cost."""
    loaded = _modules_after("from lakeckpt_tables.reader.state import decode_state; "
                            "import lakeckpt_tables.audit.views, lakeckpt_tables.cli.progress")
    assert "torch" not in loaded
    assert "lakeckpt_tables.reader.dataset" not in loaded
    from lakeckpt_tables import reader

    assert reader.decode_state is not None and "LakeDataset" in dir(reader)


PACKAGE = Path(__file__).resolve().parents[1] / "lakeckpt_tables"
TOOLS = "lakeckpt_tables.tools"
INTEGRATIONS = "lakeckpt_tables.integrations"
TRAINERS = ("lightning", "pytorch_lightning", "transformers", "accelerate", "ray")
"""What the integrations import: optional extras the core never imports."""


def _core_modules() -> list[str]:
    """Every module of the library apart from its tools (benchmarks, chaos, demo, S3 server)
    and its trainer integrations."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[1] in ("tools", "integrations") or parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_the_core_imports_nothing_of_the_tools() -> None:
    core = _core_modules()
    assert "lakeckpt_tables.ledger.base" in core and "lakeckpt_tables.cli" in core
    statement = "import importlib; from lakeckpt_tables import hooks; " + "; ".join(
        f"importlib.import_module({name!r})" for name in core) + \
        "; assert not hooks._hooks, 'a core module installed a hook'"
    loaded = _modules_after(statement)
    assert not {m for m in loaded if m.startswith((TOOLS, INTEGRATIONS))}
    assert not {m for m in loaded if m.split(".")[0] in TRAINERS}
    # nor lazily, inside a function: no import statement of the core names the tools, the
    # integrations or a trainer they integrate
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] in ("tools", "integrations"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                named = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                named = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            assert not [n for n in named if n.startswith((TOOLS, INTEGRATIONS))
                        or n.split(".")[0] in TRAINERS], (path, node.lineno)
