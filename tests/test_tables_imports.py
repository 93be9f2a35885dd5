"""The sources package reads like layers: its modules import each other without a circle, and it
uses other lakeckpt packages through their public names only."""

from __future__ import annotations

import ast
from pathlib import Path

import lakeckpt_tables.sources

_SOURCES = Path(lakeckpt_tables.sources.__file__).parent


def _imports() -> dict[str, set[str]]:
    """Module of sources/ -> the lakeckpt_tables modules it imports (anywhere in it)."""
    out: dict[str, set[str]] = {}
    for path in sorted(_SOURCES.glob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        out[f"lakeckpt_tables.sources.{path.stem}"] = {
            n for n in names if n.startswith("lakeckpt_tables")}
    return out


def test_the_modules_of_sources_import_each_other_without_a_circle() -> None:
    imports = _imports()
    graph = {m: {n for n in deps if n in imports} for m, deps in imports.items()}
    graph.pop("lakeckpt_tables.sources.__init__", None)
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for dep in graph.get(module, ()):
            visit(dep, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())
    assert "lakeckpt_tables.sources.commits" in done


def test_sources_use_no_private_module_of_another_package() -> None:
    private = sorted(
        (module, dep) for module, deps in _imports().items() for dep in deps
        if not dep.startswith("lakeckpt_tables.sources")
        and any(part.startswith("_") for part in dep.split(".")[1:]))
    assert private == []
