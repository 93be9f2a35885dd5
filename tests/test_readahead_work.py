"""Read-ahead never costs more work than reading inline (issue 20 item 3).

Counted, not timed: per pass of a narrow and a token table, with the default read-ahead and
with ``read_ahead=0``, the row group decodes, the hand-offs from the read-ahead threads and the
batches copied out of several reads. Read-ahead may only move decoding onto threads: the same
batches, every row group decoded once, one hand-off per read (a row group or a window, never a
batch), no extra copy.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pytest

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.reader import loop
from lakeckpt_tables.reader.readahead import DEFAULT_DEPTH, ReadAhead
from lakeckpt_tables.tools.bench.shapes import SHAPES, ensure_shape_table

pytestmark = pytest.mark.timeout(60)

ROWS, FILES, ROW_GROUPS, BATCH = 40_000, 2, 8, 1000


class _CountedReadAhead(ReadAhead[Any, Any]):
    handed: ClassVar[Counter[str]] = Counter()

    def __iter__(self) -> Any:
        for result in super().__iter__():
            self.handed["reads"] += 1
            yield result


def _pass(uri: str, shape: str, read_ahead: int, shuffle: bool,
          monkeypatch: pytest.MonkeyPatch) -> tuple[list[list[int]], Counter[str]]:
    counts: Counter[str] = Counter()
    _CountedReadAhead.handed = counts

    def concat(tables: list[pa.Table]) -> pa.Table:
        counts["copies"] += len(tables) > 1
        return real_concat(tables)

    real_concat = loop.concat
    monkeypatch.setattr(loop, "ReadAhead", _CountedReadAhead)
    monkeypatch.setattr(loop, "concat", concat)
    dataset = LakeDataset(DeltaSource(uri), columns=list(SHAPES[shape]), batch_size=BATCH,
                          shuffle=shuffle, read_ahead=read_ahead)
    reader = dataset._reader.row_reader
    read = reader.read

    def decode(unit: Any, columns: Any) -> pa.Table:
        counts["decodes"] += 1
        return read(unit, columns)

    monkeypatch.setattr(reader, "read", decode)
    ids = [batch["id"].tolist() for batch in dataset]
    monkeypatch.undo()
    return ids, counts


@pytest.mark.parametrize("shuffle", [False, True], ids=["in order", "shuffled"])
@pytest.mark.parametrize("shape", ["narrow", "tokens"])
def test_read_ahead_does_no_more_work_per_row_than_reading_inline(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
        shape: str, shuffle: bool) -> None:
    root = Path(tmp_path_factory.getbasetemp()) / "readahead-work"
    table = ensure_shape_table(root, shape, ROWS, files=FILES, row_groups=ROW_GROUPS)
    ahead, ahead_work = _pass(table.uri, shape, DEFAULT_DEPTH, shuffle, monkeypatch)
    inline, inline_work = _pass(table.uri, shape, 0, shuffle, monkeypatch)

    assert ahead == inline and sum(map(len, ahead)) == ROWS
    assert ahead_work["decodes"] == inline_work["decodes"] == table.row_groups
    # handed over a read at a time (a row group, a window), never a batch at a time
    assert ahead_work["reads"] == inline_work["reads"] <= table.row_groups
    assert ahead_work["copies"] == inline_work["copies"]
    if not shuffle:  # batches inside a row group are slices of it: only those across copy
        assert ahead_work["copies"] <= table.row_groups
