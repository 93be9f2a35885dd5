"""Compare lakeckpt-tables with deltalake's kernel ``scan()`` (the Delta reference: it applies
column mapping and deletion vectors) on versions of every Delta table under a folder (all
versions up to 4, else the first, middle and last two).

    .venv/bin/python scripts/conformance_real_tables.py /work/shared/real-tables/delta-rs

Prints one line per (table, version) and the counts: right / refused with a named error /
wrong / unwrapped exception / unreadable by deltalake itself.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from conformance import classify_delta


def _tables(root: Path) -> list[Path]:
    found = [p.parent for p in root.rglob("_delta_log") if p.is_dir()]
    return sorted(set(found))


def _versions(table: Path) -> list[int]:
    logs = sorted(int(p.name.split(".")[0]) for p in (table / "_delta_log").glob("*.json")
                  if p.name.split(".")[0].isdigit())
    checkpoints = sorted(int(p.name.split(".")[0]) for p in
                         (table / "_delta_log").glob("*.checkpoint*.parquet"))
    versions = sorted(set(logs) | set(checkpoints))
    if len(versions) > 4:
        versions = [versions[0], versions[len(versions) // 2], versions[-2], versions[-1]]
    return versions or [0]


def main(root: str) -> int:
    counts: collections.Counter[str] = collections.Counter()
    for table in _tables(Path(root)):
        for version in _versions(table):
            outcome, detail = classify_delta(str(table), version)
            counts[outcome] += 1
            print(f"{outcome:16s} {table.relative_to(root)}@{version}: {detail[:300]}")
    print(dict(counts))
    return 1 if counts["wrong"] or counts["unwrapped"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
