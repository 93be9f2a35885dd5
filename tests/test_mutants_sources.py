"""Source properties that injected bugs showed no other test held (issue 8, "the suite as
proof"): real Parquet files on local disk, each test names the bug it stops."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakeckpt_tables.errors import RowCountMismatchError
from lakeckpt_tables.sources._deletes import Deletes
from lakeckpt_tables.sources.base import DataFile, units_from_files
from lakeckpt_tables.types import TableIdentity


def _files(root: Path) -> list[DataFile]:
    out = []
    for name, first in (("c.parquet", 0), ("a.parquet", 100), ("b.parquet", 200)):
        path = str(root / name)
        pq.write_table(pa.table({"id": np.arange(first, first + 10, dtype=np.int64)}), path,
                       row_group_size=4)
        out.append(DataFile(path, None, 10))
    return out


def test_units_are_in_canonical_path_order_whatever_order_the_log_lists_files_in(
        tmp_path: Path) -> None:
    # The plan permutes units by position: the unit list must not depend on the listing
    # order (a log replayed from a checkpoint lists files in another order), or the same seed
    # gives another order and a resumed run repeats and skips rows.
    files = _files(tmp_path)
    identity = TableIdentity("delta", str(tmp_path), "t")
    expected = [(str(tmp_path / n), g) for n in ("a.parquet", "b.parquet", "c.parquet")
                for g in range(3)]
    for order in ([0, 1, 2], [2, 0, 1], [1, 2, 0]):
        units, _ = units_from_files(identity, 0, [files[i] for i in order])
        assert [(u.path, u.row_group) for u in units] == expected
        assert [u.rows for u in units] == [4, 4, 2] * 3


def test_deletes_naming_rows_past_the_end_of_the_file_are_refused_as_corrupt(
        tmp_path: Path) -> None:
    path = str(tmp_path / "f.parquet")
    pq.write_table(pa.table({"id": np.arange(20, dtype=np.int64)}), path, row_group_size=8)
    identity = TableIdentity("delta", str(tmp_path), "t")
    units, _ = units_from_files(identity, 4, [DataFile(path, None, 20,
                                                       Deletes.from_positions([3, 19]))])
    assert [u.rows for u in units] == [7, 8, 3]
    with pytest.raises(RowCountMismatchError,
                       match=r"at version 4: the deletes of data file .*f\.parquet name rows "
                             r"past its 20 rows"):
        units_from_files(identity, 4, [DataFile(path, None, 20,
                                                Deletes.from_positions([3, 20]))])
