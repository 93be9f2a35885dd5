"""A pass reads its pinned snapshot, whatever is committed meanwhile (Guarantee 3).

Each test writes its own table (function scope): the tests change the table under the reader.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    FILE_ROWS,
    ICEBERG_IDENTIFIER,
    file_ranges,
    flat,
    loader_for,
    sql_catalog,
    take,
    write_delta,
    write_iceberg,
)
from deltalake import DeltaTable

from lakeckpt_tables import DeltaSource, IcebergSource, LakeDataset
from lakeckpt_tables.errors import PinnedFileMissingError

ARGS: dict[str, Any] = {"columns": ["id"], "batch_size": 20, "seed": 3, "shuffle_window": 2}


@pytest.fixture
def delta_uri(tmp_path: Path) -> str:
    uri = str(tmp_path / "rows")
    write_delta(uri, file_ranges())
    return uri


def rewrite_everything(uri: str) -> None:
    """An append, a delete and an OPTIMIZE: after them no file of version 4 is current."""
    write_delta(uri, [(10_000, 10_050)])
    DeltaTable(uri).delete("id < 100")
    DeltaTable(uri).optimize.compact()


def vacuum(uri: str) -> list[str]:
    return DeltaTable(uri).vacuum(retention_hours=0, enforce_retention_duration=False,
                                  dry_run=False)


def test_an_append_a_delete_and_an_optimize_mid_pass_change_nothing_the_pass_reads(
    delta_uri: str,
) -> None:
    reference = take(loader_for(LakeDataset(DeltaSource(delta_uri), **ARGS), 0))
    pinned = DeltaTable(delta_uri).version()

    batches = iter(loader_for(LakeDataset(DeltaSource(delta_uri), **ARGS), 0))
    head = take(batches, 4)
    rewrite_everything(delta_uri)
    history = [c["operation"] for c in DeltaTable(delta_uri).history()]
    assert {"WRITE", "DELETE", "OPTIMIZE"} <= set(history)
    assert head + take(batches) == reference

    # A fresh pass pinned to the same version, opened after the changes, reads the same rows.
    again = LakeDataset(DeltaSource(delta_uri), version=pinned, **ARGS)
    assert take(loader_for(again, 0)) == reference
    # The latest version is another table now: without 0..99, with the appended rows.
    latest = flat(take(loader_for(LakeDataset(DeltaSource(delta_uri), **ARGS), 0)))
    assert min(latest) == 100 and max(latest) == 10_049


def test_a_resume_after_the_table_changed_continues_the_pinned_version_with_workers(
    delta_uri: str,
) -> None:
    reference = take(loader_for(LakeDataset(DeltaSource(delta_uri), **ARGS), 2))
    pinned = DeltaTable(delta_uri).version()
    loader = loader_for(LakeDataset(DeltaSource(delta_uri), **ARGS), 2)
    head = take(loader, 5)
    saved = json.loads(json.dumps(loader.state_dict()))
    rewrite_everything(delta_uri)
    resumed = LakeDataset(DeltaSource(delta_uri), version=pinned, **ARGS)
    resumed.load_state_dict(saved)
    assert head + take(loader_for(resumed, 2)) == reference


def test_a_vacuum_of_pinned_files_mid_pass_fails_naming_table_version_and_file(
    delta_uri: str,
) -> None:
    pinned = DeltaTable(delta_uri).version()
    dataset = LakeDataset(DeltaSource(delta_uri), **{**ARGS, "shuffle": False,
                                                      "shuffle_window": 1})
    batches = iter(loader_for(dataset, 0))
    first = take(batches, 1)  # opens the first file only
    rewrite_everything(delta_uri)
    removed = vacuum(delta_uri)
    assert removed
    got = []
    with pytest.raises(PinnedFileMissingError) as info:
        for batch in batches:
            got.append(batch["id"].tolist())
    read = flat(first + got)  # unshuffled: the first file in path order, read to its end
    assert read == list(range(read[0], read[0] + len(read)))
    assert any(n - 20 < len(read) <= n for n in FILE_ROWS), "the open file is read on"
    message = str(info.value)
    assert dataset.snapshot.identity.location in message
    assert os.path.realpath(delta_uri) in os.path.realpath(dataset.snapshot.identity.location)
    assert f"version {pinned}" in message
    assert any(Path(name).name in message for name in removed)


def test_pinning_a_version_whose_files_were_vacuumed_fails_naming_table_version_and_file(
    delta_uri: str,
) -> None:
    """Nothing of version 4 was read in this process before the vacuum (no cached footer)."""
    pinned = DeltaTable(delta_uri).version()
    rewrite_everything(delta_uri)
    removed = vacuum(delta_uri)
    with pytest.raises(PinnedFileMissingError) as info:
        take(loader_for(LakeDataset(DeltaSource(delta_uri), version=pinned, **ARGS), 0))
    message = str(info.value)
    assert os.path.realpath(delta_uri) in message or delta_uri in message
    assert f"version {pinned}" in message
    assert any(Path(name).name in message for name in removed)


def test_a_vacuum_that_leaves_the_pinned_files_changes_nothing(delta_uri: str) -> None:
    reference = take(loader_for(LakeDataset(DeltaSource(delta_uri), **ARGS), 0))
    batches = iter(loader_for(LakeDataset(DeltaSource(delta_uri), **ARGS), 0))
    head = take(batches, 3)
    write_delta(delta_uri, [(10_000, 10_050)])  # an append removes nothing
    assert vacuum(delta_uri) == []
    assert head + take(batches) == reference


@pytest.fixture
def iceberg(tmp_path: Path) -> tuple[Any, str]:
    catalog = sql_catalog(tmp_path)
    write_iceberg(catalog, ICEBERG_IDENTIFIER, file_ranges())
    return catalog, ICEBERG_IDENTIFIER


def test_an_iceberg_append_mid_pass_changes_nothing_the_pass_reads(
    iceberg: tuple[Any, str],
) -> None:
    catalog, identifier = iceberg
    reference = take(loader_for(LakeDataset(IcebergSource(identifier, catalog=catalog),
                                            **ARGS), 0))
    pinned = catalog.load_table(identifier).current_snapshot().snapshot_id
    loader = loader_for(LakeDataset(IcebergSource(identifier, catalog=catalog), **ARGS), 0)
    batches = iter(loader)
    head = take(batches, 4)
    saved = loader.state_dict()
    write_iceberg_append(catalog, identifier)
    assert head + take(batches) == reference
    resumed = LakeDataset(IcebergSource(identifier, catalog=catalog), version=pinned, **ARGS)
    resumed.load_state_dict(saved)
    assert head + take(loader_for(resumed, 0)) == reference
    latest = flat(take(loader_for(LakeDataset(IcebergSource(identifier, catalog=catalog),
                                              **ARGS), 0)))
    assert len(latest) == len(flat(reference)) + 40


def write_iceberg_append(catalog: Any, identifier: str) -> None:
    from conftest import rows_table

    catalog.load_table(identifier).append(rows_table(20_000, 20_040))


def test_a_quickstart_restart_after_appends_resumes_on_the_version_of_its_state(
    delta_uri: str, tmp_path: Path,
) -> None:
    """Issue 8 item 6: the README's quickstart has no ``version=``; the table gained versions
    between the crash and the restart, and the restart reads on the state's version."""
    from lakeckpt_tables.checkpoint import CheckpointManager

    def loader() -> Any:
        return loader_for(LakeDataset(DeltaSource(delta_uri), **ARGS), 2)

    reference = take(loader())
    pinned = DeltaTable(delta_uri).version()
    manager = CheckpointManager(str(tmp_path / "ckpt"), run_id="quickstart")
    first = loader()
    assert manager.restore(dataloader=first) is None
    head = take(first, 6)
    manager.save(6, dataloader=first)
    del first
    write_delta(delta_uri, [(10_000, 10_050)])  # the table moves on
    assert DeltaTable(delta_uri).version() == pinned + 1

    again = loader()
    restarted = CheckpointManager(str(tmp_path / "ckpt"), run_id="quickstart")
    assert restarted.restore(dataloader=again) == 6
    assert again.dataset.snapshot.version == pinned
    assert head + take(again) == reference
