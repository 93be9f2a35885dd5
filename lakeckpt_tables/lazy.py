"""Names a package loads on first use, so that importing it pulls in nothing heavy (torch,
pyiceberg) until one of those names is asked for."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, homes: Mapping[str, str], public: list[str]
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``, whose names ``homes`` maps
    to the modules that define them."""

    def getattr_(name: str) -> Any:
        if name in homes:
            return getattr(importlib.import_module(homes[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        return sorted([*importlib.import_module(package).__dict__, *public])

    return getattr_, dir_
