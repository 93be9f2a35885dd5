"""The order in which ``pytest -n N --dist loadfile`` starts the test files: slow files first.

xdist starts the files with the most tests first, so a file of three 40 s tests (the long
examples, the torchrun crashes) started last and ran alone at the end of the suite while the
other workers idled: 200 s of a 16 min run at load 8. Files that hold a test marked ``slow``
(multi-process or crash tests) now start first, the most tests first within each group, and
the many small files fill the workers at the end.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest


def slow_files_first(files: dict[str, Any], root: Path) -> list[str]:
    """The files (node ids of their tests by file name): those marked slow first, then by
    number of tests."""
    def slow(name: str) -> bool:
        path = root / name
        return path.is_file() and "mark.slow" in path.read_text()

    return sorted(files, key=lambda name: (not slow(name), -len(files[name])))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SlowFilesFirst(LoadFileScheduling):
        ordered = False

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # the queue of files is complete: order it once
                order = slow_files_first(self.workqueue, config.rootpath)
                self.workqueue = OrderedDict((name, self.workqueue[name]) for name in order)
                self.ordered = True
            super()._assign_work_unit(node)

    return SlowFilesFirst(config, log)
