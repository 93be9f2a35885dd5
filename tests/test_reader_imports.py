"""The reader and plan packages read like layers (issue 22): their modules import each other
without a circle (lazy and type-checking imports included), they use other lakeckpt packages
through public modules only, and no module or class outgrows what a reader takes in."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import lakeckpt_tables

_ROOT = Path(lakeckpt_tables.__file__).parent
PACKAGES = ("reader", "plan")


def _modules(package: str) -> dict[str, ast.Module]:
    return {("lakeckpt_tables." + package + ("" if p.stem == "__init__" else "." + p.stem)):
            ast.parse(p.read_text()) for p in sorted((_ROOT / package).glob("*.py"))}


def _imported(tree: ast.Module) -> set[str]:
    """The lakeckpt_tables modules (or packages) ``tree`` imports, anywhere in it."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {n for n in names if n.startswith("lakeckpt_tables")}


@pytest.mark.parametrize("package", PACKAGES)
def test_the_modules_of_a_package_import_each_other_without_a_circle(package: str) -> None:
    modules = _modules(package)
    graph = {m: _imported(tree) & set(modules) for m, tree in modules.items()}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for dep in sorted(graph[module]):
            visit(dep, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())
    assert len(done) == len(modules) > 5


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_uses_no_private_module_of_another(package: str) -> None:
    private = sorted(
        (module, dep) for module, tree in _modules(package).items() for dep in _imported(tree)
        if dep.split(".")[1] != package and any(p.startswith("_") for p in dep.split(".")[1:]))
    assert private == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_over_500_lines_and_no_class_over_250(package: str) -> None:
    too_long = []
    for path in sorted((_ROOT / package).glob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > 500:
            too_long.append(f"{path.name}: {len(text.splitlines())} lines")
        too_long.extend(
            f"{path.name}: class {node.name}: {node.end_lineno - node.lineno + 1} lines"
            for node in ast.walk(ast.parse(text)) if isinstance(node, ast.ClassDef)
            and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > 250)
    assert too_long == []
