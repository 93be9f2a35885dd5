"""The wheel ships every package of the library.

pyproject.toml lists the packages by hand (catalog/ lives at the root and ships inside the
package), so a new subpackage missing from that list installs from a checkout in editable mode
(the tests pass) and is absent from a built wheel (``import`` fails for every user).
"""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_directory_is_listed_for_the_wheel() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "lakeckpt_tables").rglob("__init__.py")}
    assert found - listed == set(), "packages missing from pyproject.toml's list"
    assert listed - found == {"lakeckpt_tables.catalog"}, "listed packages that do not exist"
