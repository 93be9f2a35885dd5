"""What importing costs: the plan is pure and must not pull in torch; the core never pulls in
the tools."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

# What each statement adds to the modules loaded, run one after the other in ONE fresh process
# (a process start, with torch, costs more than the imports checked): each statement is checked
# on everything loaded up to it (the statements that must import neither torch nor pyiceberg
# come first), so an import a statement must not make is caught whichever statement made it.
STEPS = {
    "plan": "import lakeckpt_tables.plan",
    "ledger reading": "from lakeckpt_tables.reader.state import decode_state; "
                      "import lakeckpt_tables.audit.views, lakeckpt_tables.cli.progress",
    "public names": "from lakeckpt_tables import LakeDataset, DeltaSource, LakeckptError",
}
_STEP_CODE = """
import sys, traceback
for name, statement in {steps!r}.items():
    try:
        exec(statement, {{}})
        print("@@step", name.replace(" ", "_"), "ok")
    except BaseException:
        print("@@step", name.replace(" ", "_"), "failed:", repr(traceback.format_exc()))
    print("\\n".join(sys.modules))
"""


@pytest.fixture(scope="module")
def loaded_after() -> dict[str, set[str] | str]:
    """The modules loaded after each of STEPS, then after "core" (every core module imported,
    then no hook installed); a step that raised maps to the error it printed instead."""
    steps = {**STEPS, "core": _core_statement()}
    out = subprocess.run([sys.executable, "-c", _STEP_CODE.format(steps=steps)], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    loaded: dict[str, set[str] | str] = {}
    for chunk in out.split("@@step ")[1:]:
        head, _, rest = chunk.partition("\n")
        name, status = head.split(" ", 1)
        loaded[name.replace("_", " ")] = set(rest.split()) if status == "ok" else status
    assert list(loaded) == list(steps)
    return loaded


def _after(loaded_after: dict[str, set[str] | str], step: str) -> set[str]:
    loaded = loaded_after[step]
    assert isinstance(loaded, set), f"{step}: {loaded}"
    return loaded


def test_the_plan_imports_without_torch(loaded_after: dict[str, set[str] | str]) -> None:
    loaded = _after(loaded_after, "plan")
    assert "lakeckpt_tables.plan" in loaded
    assert "torch" not in loaded
    assert "deltalake" not in loaded


def test_the_public_names_still_import_from_the_package(
        loaded_after: dict[str, set[str] | str]) -> None:
    loaded = _after(loaded_after, "public names")
    assert "torch" in loaded and "lakeckpt_tables.reader.dataset" in loaded
    assert "pyiceberg" not in loaded


def test_reading_a_ledger_and_its_reader_states_imports_without_torch(
        loaded_after: dict[str, set[str] | str]) -> None:
    """`lakeckpt progress` and `verify` decode reader states: importing torch (over a second)
    would be most of what they cost."""
    loaded = _after(loaded_after, "ledger reading")
    assert "lakeckpt_tables.cli.progress" in loaded
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


def _core_statement() -> str:
    """Import every core module, then fail if one of them installed a hook."""
    return "import importlib; from lakeckpt_tables import hooks; " + "; ".join(
        f"importlib.import_module({name!r})" for name in _core_modules()) + \
        "; assert not hooks._hooks, 'a core module installed a hook'"


def test_the_core_imports_nothing_of_the_tools(loaded_after: dict[str, set[str] | str]) -> None:
    core = _core_modules()
    assert "lakeckpt_tables.ledger.base" in core and "lakeckpt_tables.cli" in core
    loaded = _after(loaded_after, "core")
    assert set(core) <= loaded
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
