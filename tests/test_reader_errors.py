"""Bad input is refused with a typed error that says what is wrong (Guarantee 8).

Unknown tables, versions and columns; tables whose rows cannot be read from data files alone;
reader state of another table, version or configuration, or damaged; bad arguments.
"""

from __future__ import annotations

import base64
import copy
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import (
    Table,
    flat,
    loader_for,
    raised_in_workers,
    rows_table,
    sql_catalog,
    take,
    write_delta,
    write_iceberg,
)
from deltalake import write_deltalake

from lakeckpt_tables import DeltaSource, IcebergSource, LakeDataset
from lakeckpt_tables.errors import (
    EmptySourceError,
    LakeckptError,
    SourceNotFoundError,
    StateMismatchError,
    UnknownColumnError,
    UnsupportedTableError,
)
from lakeckpt_tables.reader import decode_state, encode_state, merge_states, states_from_loader

# ------------------------------------------------------------------------------ sources


def test_a_path_without_a_delta_table_is_not_found(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-table"
    with pytest.raises(SourceNotFoundError, match=r"no Delta table at .*no-such-table"):
        LakeDataset(DeltaSource(str(missing)))
    (tmp_path / "plain-dir").mkdir()
    with pytest.raises(SourceNotFoundError, match="plain-dir"):
        LakeDataset(DeltaSource(str(tmp_path / "plain-dir")))


@pytest.mark.timeout(60)  # delta-rs 1.6 alone does not return for 2**31 (a damaged state's)
@pytest.mark.parametrize("version", [7, -1, 2**31, 2**62])
def test_an_unknown_delta_version_is_not_found_and_the_latest_is_named(
    tmp_path: Path, version: int
) -> None:
    uri = str(tmp_path / "t")
    write_delta(uri, [(0, 30), (30, 60)])  # versions 0 and 1
    with pytest.raises(SourceNotFoundError) as info:
        LakeDataset(DeltaSource(uri), version=version)
    assert f"no version {version}" in str(info.value)
    if version > 0:
        assert "latest is 1" in str(info.value)


def test_an_unknown_iceberg_table_or_snapshot_is_not_found(tmp_path: Path) -> None:
    catalog = sql_catalog(tmp_path)
    with pytest.raises(SourceNotFoundError, match=r"no Iceberg table 'ns\.nope'"):
        LakeDataset(IcebergSource("ns.nope", catalog=catalog))
    write_iceberg(catalog, "ns.t", [(0, 30)])
    with pytest.raises(SourceNotFoundError, match="no snapshot 12345"):
        LakeDataset(IcebergSource("ns.t", catalog=catalog), version=12345)


def test_unknown_columns_are_named_with_the_columns_there_are(source: Table) -> None:
    with pytest.raises(UnknownColumnError) as info:
        source.dataset(columns=["id", "label", "x"])
    message = str(info.value)
    assert "['label']" in message
    assert "'tokens'" in message  # the columns that exist
    with pytest.raises(TypeError, match="list of names"):
        LakeDataset(source.make_source(), columns="id")  # type: ignore[arg-type]


def test_an_empty_delta_table_is_refused(tmp_path: Path) -> None:
    uri = str(tmp_path / "empty")
    write_deltalake(uri, rows_table(0, 0))
    with pytest.raises(EmptySourceError, match="holds no rows"):
        LakeDataset(DeltaSource(uri))


def test_an_iceberg_table_never_written_is_refused_as_empty(tmp_path: Path) -> None:
    catalog = sql_catalog(tmp_path)
    catalog.create_namespace("ns")
    catalog.create_table("ns.empty", schema=rows_table(0, 1).schema)
    with pytest.raises(EmptySourceError, match="holds no rows"):
        LakeDataset(IcebergSource("ns.empty", catalog=catalog))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"batch_size": 0}, "batch_size must be a positive int"),
    ({"batch_size": -3}, "batch_size must be a positive int"),
    ({"epochs": 0}, "epochs must be a positive int"),
    ({"epochs": True}, "epochs must be a positive int"),
    ({"shuffle_window": 0}, "shuffle_window must be a positive int"),
    ({"rank": 2, "world_size": 2}, "rank 2 is outside world_size 2"),
    ({"rank": -1, "world_size": 2}, "rank -1 is outside world_size 2"),
    ({"rank": 0, "world_size": 0}, "outside world_size 0"),
])
def test_bad_reader_arguments_are_value_errors_saying_which(
    delta_table: Table, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        delta_table.dataset(**kwargs)


# Issue 24 item 2: every argument of LakeDataset refused by the name the user wrote, before any
# table is touched (the source below does not exist), never by an internal class's name.
ARGUMENTS: list[tuple[str, Any, type[Exception]]] = [
    ("columns", "id", TypeError), ("columns", [1, 2], TypeError),
    ("batch_size", 0, ValueError), ("batch_size", 1.5, ValueError),
    ("batch_size", "8", ValueError), ("shuffle", "yes", TypeError), ("seed", 1.5, ValueError),
    ("seed", None, ValueError), ("version", "3", ValueError), ("epochs", 0, ValueError),
    ("rank", "0", ValueError), ("world_size", "2", ValueError), ("world_size", 0, ValueError),
    ("drop_last", 1, TypeError), ("shuffle_window", 0, ValueError),
    ("transform", 5, TypeError), ("follow", "yes", TypeError), ("poll_interval", 0, ValueError),
    ("poll_interval", "1", ValueError), ("max_idle", -1, ValueError),
    ("until_version", 1.5, ValueError), ("on_change", "ignore", ValueError),
    ("min_segment_rows", 0, ValueError), ("refresh", "step", ValueError),
    ("output", "numpy", ValueError), ("nulls", "drop", ValueError),
    ("decimals", "float32", ValueError), ("filter", "x > 1", TypeError),
    ("unit_rows", 0, ValueError), ("read_ahead", -1, ValueError),
]


@pytest.mark.parametrize(("name", "value", "error"), ARGUMENTS,
                         ids=[f"{n}={v!r}" for n, v, _ in ARGUMENTS])
def test_every_bad_argument_is_named_as_the_user_wrote_it(
        tmp_path: Path, name: str, value: Any, error: type[Exception]) -> None:
    explicit = {"rank": 0, "world_size": 1}  # no process group asked
    if name == "rank":
        explicit = {"world_size": 1}
    with pytest.raises(error) as info:
        LakeDataset(DeltaSource(str(tmp_path / "no-table")), **{**explicit, name: value})
    message = str(info.value)
    assert name in message and "PlanPolicy" not in message and "ReaderOptions" not in message
    assert not isinstance(info.value, LakeckptError)  # not a SourceNotFoundError: no I/O yet


@pytest.mark.parametrize("kind", ["str", "Path", "uri"])
def test_a_path_where_a_source_belongs_is_a_type_error_naming_the_source_classes(
        tmp_path: Path, kind: str) -> None:
    path = tmp_path / "rows"
    given = {"str": str(path), "Path": path, "uri": f"s3://bucket/{path.name}"}[kind]
    with pytest.raises(TypeError) as info:
        LakeDataset(given, rank=0, world_size=1)  # type: ignore[arg-type]
    message = str(info.value)
    assert f"DeltaSource({str(given)!r})" in message
    assert "IcebergSource('namespace.table')" in message
    with pytest.raises(TypeError, match="source must be a DeltaSource or IcebergSource"):
        LakeDataset({"uri": str(path)}, rank=0, world_size=1)  # type: ignore[arg-type]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("loader_batch", "workers", "output", "stateful"), [
    (None, 0, "torch", True),  # the loader's default batch_size=1
    (4, 0, "torch", True),
    (2, 1, "torch", True),  # collated in the worker, re-raised in the main process
    (3, 0, "torch", False),  # torch's own DataLoader
    (2, 0, "arrow", True),
])
def test_a_loader_that_batches_the_batches_again_is_refused_on_its_first_batch(
        delta_table: Table, loader_batch: int | None, workers: int, output: str,
        stateful: bool) -> None:
    from torch.utils.data import DataLoader
    from torchdata.stateful_dataloader import StatefulDataLoader

    dataset = delta_table.dataset(columns=["id", "tokens"], batch_size=8, output=output)
    kind = StatefulDataLoader if stateful else DataLoader
    loader = kind(dataset, num_workers=workers,
                  **({} if loader_batch is None else {"batch_size": loader_batch}))
    with raised_in_workers(TypeError, match=r"Build the loader with batch_size=None"):
        next(iter(loader))
    # the batches themselves are unchanged, and a loader built as told reads them all
    assert sorted(flat(take(loader_for(delta_table.dataset(columns=["id"], batch_size=8),
                                       workers)))) == delta_table.ids.tolist()


def test_the_refusal_says_how_many_batches_of_how_many_rows(delta_table: Table) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(delta_table.dataset(batch_size=8, seed=3), batch_size=4)
    with pytest.raises(TypeError) as info:
        next(iter(loader))
    assert "collating 4 LakeDataset batch(es) of 8 rows" in str(info.value)
    assert "leading dimension of 4" in str(info.value)


def test_every_deliberate_error_is_a_lakeckpt_error() -> None:
    for error in (SourceNotFoundError, UnsupportedTableError, EmptySourceError,
                  UnknownColumnError, StateMismatchError):
        assert issubclass(error, LakeckptError)


# ------------------------------------------------------------------------ reader state

ARGS: dict[str, Any] = {"batch_size": 16, "seed": 1, "shuffle_window": 2}


def state_after(table: Table, steps: int = 3, **kwargs: Any) -> dict[str, Any]:
    loader = loader_for(table.dataset(**{**ARGS, **kwargs}), 0)
    take(loader, steps)
    state: dict[str, Any] = loader.state_dict()
    return state


def refused(table: Table, state: Any, **kwargs: Any) -> str:
    dataset = table.dataset(**{**ARGS, **kwargs})
    with pytest.raises(StateMismatchError) as info:
        dataset.load_state_dict(state)
    return str(info.value)


@pytest.fixture(scope="module")
def other_delta(tmp_path_factory: pytest.TempPathFactory) -> Table:
    uri = str(tmp_path_factory.mktemp("other") / "rows")
    write_delta(uri, [(0, 200), (200, 387)])  # versions 0 and 1
    return Table("delta", lambda: DeltaSource(uri), np.arange(387), uri)


def test_a_state_of_another_table_is_refused_naming_both_tables(
    delta_table: Table, other_delta: Table, iceberg_table: Table
) -> None:
    state = state_after(delta_table)
    message = refused(other_delta, state)
    assert "table: state is of delta table" in message
    assert delta_table.location in message and other_delta.location in message
    message = refused(iceberg_table, state)
    assert "this reader reads iceberg table" in message
    # another table's version means nothing here: no "pass version=..." to follow (issue 24)
    assert "version" not in message.split("this reader reads")[1]
    assert "version=" not in refused(other_delta, state)


def test_a_state_of_another_version_than_an_explicit_version_is_refused_naming_it(
    other_delta: Table,
) -> None:
    state = state_after(other_delta, version=0)
    message = refused(other_delta, state, version=1)
    assert "version: state pinned 0, this reader pinned 1 (pass version=0)" in message
    dataset = other_delta.dataset(**ARGS, version=0)
    dataset.load_state_dict(state)  # as the message says


def test_a_reader_built_without_a_version_pins_the_version_its_state_pinned(
    other_delta: Table,
) -> None:
    """Issue 8 item 6: the loaded state decides; the latest version only without a state."""
    full = take(loader_for(other_delta.dataset(**ARGS, version=0), 0))
    loader = loader_for(other_delta.dataset(**ARGS, version=0), 0)
    head = take(loader, 3)
    dataset = other_delta.dataset(**ARGS)  # the latest: version 1
    assert dataset.snapshot.version == 1
    dataset.load_state_dict(loader.state_dict())
    assert dataset.snapshot.version == 0
    rest = take(loader_for(dataset, 0))
    assert head + rest == full
    assert sorted(flat(head + rest)) == list(range(200))


@pytest.mark.parametrize(("change", "named"), [
    ({"seed": 2}, "seed: state has 1, this reader 2"),
    ({"shuffle": False}, "shuffle: state has True, this reader False"),
    ({"shuffle_window": 3}, "shuffle_window: state has 2, this reader 3"),
    ({"epochs": 2}, "epochs: state has 1, this reader 2"),
    ({"drop_last": True}, "drop_last"),
    ({"columns": ["id", "x"]}, "columns: state has ['id'], this reader ['id', 'x']"),
])
def test_a_state_of_another_run_configuration_is_refused_naming_what_differs(
    delta_table: Table, change: dict[str, Any], named: str
) -> None:
    state = state_after(delta_table)
    assert named in refused(delta_table, state, **change)


def test_a_foreign_state_loaded_through_the_loader_is_refused_too(
    delta_table: Table,
) -> None:
    state = state_after(delta_table, seed=7)
    loader = loader_for(delta_table.dataset(**ARGS), 0)
    loader.load_state_dict(state)
    with pytest.raises(StateMismatchError, match="seed: state has 7, this reader 1"):
        take(loader)


def dataset_state(table: Table) -> dict[str, Any]:
    return merge_states(states_from_loader(state_after(table))).to_dict()


def corrupt(table: Table, path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    state = copy.deepcopy(dataset_state(table))
    node = state
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return state


@pytest.mark.parametrize(("path", "value", "named"), [
    (("format",), "lakeckpt.reader/0", "format is 'lakeckpt.reader/0'"),
    (("format",), None, "format is None"),
    (("slices", 0, 1), -16, "non-negative int, got -16"),
    (("slices", 0, 0), -1, "non-negative int, got -1"),
    (("slices", 0, 1), "48", "non-negative int, got '48'"),
    (("slices",), [[0, 0], [0, 0]], "2 slices for 1 ranks x 1 workers"),
    (("plan", "world_size"), 0, "positive int"),
    (("plan", "batch_size"), -4, "non-negative int"),
    (("format",), "lakeckpt.reader/1", "written by an older lakeckpt-tables"),
    (("policy",), [1], "corrupt"),
    (("layouts",), {"0": [[[[5, 3]], None, 0, 0]]}, "malformed piece"),
    (("layouts",), {"0": [[[[0, 4]], None, 0, 9]]}, "malformed piece"),
    (("slices",), KeyError, "missing keys ['slices']"),
    (("table",), KeyError, "missing keys ['table']"),
    (("plan",), {"world_size": 1}, "corrupt"),
])
def test_a_damaged_state_is_refused_as_corrupt(
    delta_table: Table, path: tuple[Any, ...], value: Any, named: str
) -> None:
    message = refused(delta_table, corrupt(delta_table, path, value))
    assert named in message


@pytest.mark.parametrize("garbage", [{}, {"foo": 1}, [1, 2, 3], "lkr1:abc", None, 42])
def test_garbage_is_refused_as_not_a_reader_state(delta_table: Table, garbage: Any) -> None:
    refused(delta_table, garbage)


def test_a_damaged_encoded_state_is_refused(delta_table: Table) -> None:
    encoded = encode_state(dataset_state(delta_table))
    for bad, named in [(encoded[: len(encoded) // 2], "damaged"),
                       (encoded[:-3], "damaged"),
                       (encoded.replace("lkr1:", "lkr0:"), "not an encoded reader state"),
                       ("lkr1:" + "A" * 40, "damaged"),
                       ("", "not an encoded reader state")]:
        with pytest.raises(StateMismatchError, match=named):
            decode_state(bad)
    array = "lkr1:" + base64.b64encode(zlib.compress(json.dumps([1, 2]).encode())).decode()
    with pytest.raises(StateMismatchError, match="does not hold a JSON object"):
        decode_state(array)


def test_a_loader_state_without_a_lakedataset_state_is_refused(delta_table: Table) -> None:
    with pytest.raises(StateMismatchError, match="holds no LakeDataset state"):
        states_from_loader({"_snapshot": {"_worker_snapshots": {}}})
    with pytest.raises(StateMismatchError, match="holds no LakeDataset state"):
        states_from_loader({"dataset_state": None})


def test_states_of_different_tables_or_runs_do_not_merge(
    delta_table: Table, other_delta: Table
) -> None:
    with pytest.raises(StateMismatchError, match="different table"):
        merge_states([dataset_state(delta_table), dataset_state(other_delta)])
    seeded = merge_states(states_from_loader(state_after(delta_table, seed=4))).to_dict()
    with pytest.raises(StateMismatchError, match="different config"):
        merge_states([dataset_state(delta_table), seeded])
