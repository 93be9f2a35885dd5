"""The reader's options: every bad value and combination refused in one place, with its
reason, before any table is touched (``lakeckpt_tables.reader.options``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from lakeckpt_tables import DeltaSource, LakeDataset
from lakeckpt_tables.reader.options import ReaderOptions

BAD: list[tuple[dict[str, Any], str]] = [
    ({"epochs": 0}, "epochs must be a positive int"),
    ({"epochs": True}, "epochs must be a positive int"),
    ({"batch_size": 0}, "batch_size must be a positive int"),
    ({"shuffle_window": 0}, "shuffle_window must be a positive int"),
    ({"unit_rows": 0}, "unit_rows must be a positive int"),
    ({"read_ahead": -1}, "read_ahead must be a non-negative int"),
    ({"rank": 2, "world_size": 2}, "rank 2 is outside world_size 2"),
    ({"output": "numpy"}, "output must be one of"),
    ({"nulls": "drop"}, "nulls must be one of"),
    ({"decimals": "float32"}, "decimals must be one of"),
    ({"refresh": "step"}, "refresh must be one of"),
    ({"filter": pc.field("x") > 1, "follow": True}, "take no filter"),
    ({"filter": pc.field("x") > 1, "refresh": "epoch"}, "take no filter"),
    ({"refresh": "epoch", "epochs": 2}, "takes neither follow=True nor epochs"),
    ({"refresh": "epoch", "follow": True}, "takes neither follow=True nor epochs"),
    ({"follow": True, "epochs": 2}, "follow mode has no epochs"),
    ({"follow": True, "max_idle": 1.0, "world_size": 2}, "with several ranks use until_version"),
    ({"follow": True, "poll_interval": 0}, "poll_interval must be > 0"),
    ({"follow": True, "min_segment_rows": 0}, "min_segment_rows must be a positive int"),
    ({"follow": True, "on_change": "ignore"}, "on_change must be one of"),
]


@pytest.mark.parametrize(("options", "reason"), BAD, ids=[r for _, r in BAD])
def test_every_bad_option_is_refused_with_its_reason(options: dict[str, Any],
                                                      reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        ReaderOptions(**options)


@pytest.mark.parametrize(("options", "reason"), BAD[:3] + BAD[11:16], ids=str)
def test_the_dataset_refuses_bad_options_before_it_touches_the_table(
        tmp_path: Path, options: dict[str, Any], reason: str) -> None:
    # no table there: a SourceNotFoundError would mean the table was read first
    source = DeltaSource(str(tmp_path / "no-table"))
    with pytest.raises(ValueError, match=reason):
        LakeDataset(source, **{"rank": 0, "world_size": 1, **options})


def test_options_are_frozen_and_keep_a_copy_of_the_columns() -> None:
    columns = ["id", "x"]
    options = ReaderOptions(columns=columns, follow=True, world_size=2, batch_size=8)
    columns.append("y")
    assert options.columns == ("id", "x")
    with pytest.raises(AttributeError):
        options.seed = 1  # type: ignore[misc]
    policy = options.follow_policy()
    assert policy is not None and policy.min_segment_rows == 16  # world size x batch size
    assert ReaderOptions().follow_policy() is None


def test_a_string_is_not_a_list_of_columns() -> None:
    with pytest.raises(TypeError, match="not a string"):
        ReaderOptions(columns="id")
