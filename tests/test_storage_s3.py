"""Tables on S3: every byte through the storage options, against a real S3 server on loopback.

The server (moto's server mode behind a counting front, ``tests/_s3server.py``) is contacted
over HTTP exactly as S3 is. A shadow server named by the environment's ``AWS_*`` variables
holds a different table under the same bucket and key: reading it would give other ids, and
its request log must stay empty whenever options are given.
"""

from __future__ import annotations

import pickle
import re
from typing import Any

import _s3server
import numpy as np
import pyarrow as pa
import pytest
from _s3server import S3Server
from conftest import ROW_GROUP_ROWS, file_ranges, loader_for, rows_table, write_delta

from lakeckpt_tables import DeltaSource, IcebergSource, LakeDataset
from lakeckpt_tables.errors import DataFileError, StorageError, StoreUnavailableError
from lakeckpt_tables.io import Storage
from lakeckpt_tables.io.prefetch import DEFAULT_PREFETCH
from lakeckpt_tables.reader.readahead import PLAIN_PIECE_UNITS
from lakeckpt_tables.sources import footers

s3 = _s3server.s3  # the fixtures of the module
shadow_s3 = _s3server.shadow_s3
shadow_env = _s3server.shadow_env

RANGES = file_ranges()
IDS = list(range(RANGES[0][0], RANGES[-1][1]))
SHADOW_RANGES = [(10_000, 10_050)]


def write_s3_delta(uri: str, ranges: list[tuple[int, int]], server: S3Server) -> None:
    """Append to a Delta table on ``server`` whatever the environment names."""
    write_delta(uri, ranges, storage_options=Storage(uri, server.options()).delta_options())


def ids_of(dataset: LakeDataset, workers: int = 0) -> list[int]:
    return [i for batch in loader_for(dataset, workers) for i in batch["id"].tolist()]


@pytest.fixture(scope="module")
def delta_on_s3(s3: S3Server, shadow_s3: S3Server) -> str:
    """A Delta table on the server and, at the same URI, another one on the shadow server."""
    bucket = s3.bucket("delta")
    uri = f"s3://{bucket}/rows"
    write_s3_delta(uri, RANGES, s3)
    shadow_s3_bucket(shadow_s3, bucket)
    write_s3_delta(uri, SHADOW_RANGES, shadow_s3)
    return uri


def shadow_s3_bucket(server: S3Server, name: str) -> None:
    import boto3

    boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=server.key,
                 aws_secret_access_key=server.secret, region_name="us-east-1"
                 ).create_bucket(Bucket=name)


# ---------------------------------------------------------------------------- Storage


def test_storage_operations_on_s3(s3: S3Server) -> None:
    store = Storage(f"s3://{s3.bucket()}/root", s3.options())
    assert store.list() == [] and not store.exists("a/one")
    store.put("a/one", b"0123456789")
    store.put("a/two", b"xy")
    assert store.read_bytes("a/one") == b"0123456789"
    assert store.read_bytes("a/one", 3, 4) == b"3456"
    assert store.list("a") == ["one", "two"] and store.list() == ["a"]
    assert store.size("a/one") == 10 and store.exists("a") and store.exists("a/two")
    store.put("a/one", b"new")  # replaced whole
    assert store.read_bytes(f"{store.uri}/a/one") == b"new"
    store.delete("a/two")
    assert store.list("a") == ["one"]
    store.delete("a")
    assert not store.exists("a/one") and store.list() == []
    store.delete("a")  # absent: nothing to do
    with pytest.raises(FileNotFoundError):
        store.read_bytes("a/one")


def test_a_storage_crosses_processes_without_its_filesystem_or_secrets_in_view(
        s3: S3Server) -> None:
    store = Storage(f"s3://{s3.bucket()}/root", s3.options())
    store.put("f", b"data")
    assert s3.secret not in repr(store) and s3.key not in repr(store)
    copy = pickle.loads(pickle.dumps(store))
    assert copy._fs is None and copy == store
    assert copy.read_bytes("f") == b"data"


def test_a_server_that_is_down_gives_a_named_error_without_secrets_and_a_retry_works(
        s3: S3Server) -> None:
    store = Storage(f"s3://{s3.bucket()}/root", s3.options(max_attempts="1",
                                                           lakeckpt_retry_seconds="0.5"))
    store.put("f", b"kept")
    with s3.down(), pytest.raises(StoreUnavailableError) as caught:
        store.read_bytes("f")
    message = str(caught.value)
    assert f"{store.uri}/f" in message and caught.value.uri == f"{store.uri}/f"
    assert message.startswith("store unavailable") and caught.value.kind == "unavailable"
    assert "HTTP status 503" in message  # the client's words follow
    assert "<" not in message and "\x1b[" not in message
    assert s3.secret not in message and s3.key not in message
    with s3.down(), pytest.raises(StorageError):
        store.put("g", b"lost")
    assert store.read_bytes("f") == b"kept"  # nothing lost, the retry succeeds
    assert not store.exists("g")


def test_options_given_never_read_the_environment(s3: S3Server, shadow_env: S3Server
                                                  ) -> None:
    bucket = s3.bucket()
    shadow_s3_bucket(shadow_env, bucket)
    Storage(f"s3://{bucket}", shadow_env.options()).put("k", b"shadow")
    shadow_env.reset()
    store = Storage(f"s3://{bucket}", s3.options())
    store.put("k", b"real")
    assert store.read_bytes("k") == b"real"
    assert shadow_env.requests() == []
    # without options the environment is the configuration: it names the shadow server
    assert Storage(f"s3://{bucket}").read_bytes("k") == b"shadow"


def test_options_without_credentials_are_anonymous_not_the_environments(
        s3: S3Server, shadow_env: S3Server) -> None:
    store = Storage(f"s3://{s3.bucket()}", {"AWS_ENDPOINT_URL": s3.endpoint,
                                            "AWS_ALLOW_HTTP": "true"})
    assert store.fsspec_options()["anon"] is True
    delta = store.delta_options()
    assert delta is not None and delta["AWS_SKIP_SIGNATURE"] == "true"
    assert "AWS_ACCESS_KEY_ID" not in delta and delta["AWS_ENDPOINT_URL"] == s3.endpoint
    store.exists("anything")
    assert shadow_env.requests() == []


# ---------------------------------------------------------------------- Delta on S3


@pytest.mark.parametrize("workers", [0, 2])
def test_a_delta_table_on_s3_is_read_through_its_options_only(
        delta_on_s3: str, s3: S3Server, shadow_env: S3Server, workers: int) -> None:
    dataset = LakeDataset(DeltaSource(delta_on_s3, storage_options=s3.options()),
                          columns=["id", "x"], batch_size=24, seed=3)
    assert sorted(ids_of(dataset, workers)) == IDS
    assert shadow_env.requests() == []


def test_a_delta_row_group_read_costs_at_most_two_requests_and_no_footer(
        delta_on_s3: str, s3: S3Server) -> None:
    source = DeltaSource(delta_on_s3, storage_options=s3.options())
    dataset = LakeDataset(source, columns=["id", "x"], batch_size=24, seed=3)
    units = dataset.snapshot.units
    files = {u.path for u in units}
    s3.reset()
    assert sorted(ids_of(dataset)) == IDS
    data = [r for r in s3.requests() if r[1].endswith(".parquet")]
    gets = [r for r in data if r[0] == "GET"]
    heads = [r for r in data if r[0] == "HEAD"]
    assert len(heads) <= len(files)  # one open per file and process (shared by readers)
    assert len(units) <= len(gets) <= 2 * len(units)
    sizes = {path: Storage(f"s3:/{path}", s3.options()).size("") for path in {r[1] for r in gets}}
    # the footer (and its length and magic) ends the file: no read reaches its last byte
    assert all(int(r[2].rsplit("-", 1)[1]) < sizes[r[1]] - 1 for r in gets)
    # a second source in the same process reads no footer again
    reads = footers.footer_reads()
    s3.reset()
    again = DeltaSource(delta_on_s3, storage_options=s3.options()).snapshot()
    assert len(again.units) == len(units) and footers.footer_reads() == reads
    assert [r for r in s3.requests() if r[1].endswith(".parquet")] == []
    # a second reader of the same files in this process opens none of them again
    s3.reset()
    assert sorted(ids_of(LakeDataset(source, columns=["id"], batch_size=24))) == IDS
    assert [r for r in s3.requests() if r[0] == "HEAD" and r[1].endswith(".parquet")] == []


def test_row_group_reads_on_s3_are_in_flight_together_and_still_read_once(
        delta_on_s3: str, s3: S3Server) -> None:
    """NOTE [ prefetch ]: with latency per request, the reader keeps several row group reads
    in flight (pyarrow.dataset does the same), each row group still fetched once, and the rows
    delivered are those of a reader without read-ahead, in the same order."""
    def dataset(read_ahead: int) -> LakeDataset:
        return LakeDataset(DeltaSource(delta_on_s3, storage_options=s3.options()),
                           columns=["id", "x"], batch_size=24, seed=3, read_ahead=read_ahead)

    sequential, ahead = dataset(0), dataset(2)  # pinned: delta-rs reads the log concurrently
    row_groups = {(u.path, u.row_group) for u in sequential.snapshot.units}
    s3.reset()
    s3.faults(latency_ms=150)
    try:
        expected = ids_of(sequential)
        alone = s3.peak()
        s3.reset()
        got = ids_of(ahead)
        together = s3.peak()
    finally:
        s3.faults()
    gets = [r for r in s3.requests() if r[0] == "GET" and r[1].endswith(".parquet")]
    assert got == expected and sorted(got) == IDS
    # pyarrow's I/O thread pool (8 threads) sends the GETs: no more are in flight than that
    assert (alone, together) == (1, min(DEFAULT_PREFETCH, pa.io_thread_count(),
                                        len(row_groups)))
    assert len(row_groups) <= len(gets) <= 2 * len(row_groups)
    assert len(set(gets)) == len(gets)  # no range fetched twice


def test_a_delta_table_on_a_server_that_is_down_fails_by_name_and_a_retry_reads_it(
        delta_on_s3: str, s3: S3Server, shadow_env: S3Server) -> None:
    source = DeltaSource(delta_on_s3, storage_options=s3.options(
        max_attempts="1", lakeckpt_retry_seconds="0.5"))
    with s3.down(), pytest.raises(StorageError) as caught:
        LakeDataset(source, columns=["id"])
    assert delta_on_s3 in str(caught.value) and s3.secret not in str(caught.value)
    assert sorted(ids_of(LakeDataset(source, columns=["id"]))) == IDS
    assert shadow_env.requests() == []


def test_a_row_group_read_on_a_server_that_is_down_fails_by_name_and_resumes(
        delta_on_s3: str, s3: S3Server) -> None:
    # one unit per window and no read-ahead: the batches after the first need reads the
    # server, once down, cannot serve
    dataset = LakeDataset(DeltaSource(delta_on_s3, storage_options=s3.options(
        max_attempts="1", lakeckpt_retry_seconds="0.5")), columns=["id"], batch_size=24,
        seed=1, shuffle_window=1, read_ahead=0)
    loader = loader_for(dataset, 0)
    batches = iter(loader)
    seen = next(batches)["id"].tolist()
    state = loader.state_dict()
    with s3.down(), pytest.raises(DataFileError) as caught:  # as the README promises
        for batch in batches:
            seen.extend(batch["id"].tolist())
    message = str(caught.value)
    assert re.search(rf"delta table {delta_on_s3} .*at version \d+: data file \S+\.parquet",
                     message)
    assert isinstance(caught.value, StorageError) and caught.value.kind == "unavailable"
    assert "store unavailable" in message and s3.secret not in message
    fresh = loader_for(LakeDataset(DeltaSource(delta_on_s3, storage_options=s3.options()),
                                   columns=["id"], batch_size=24, seed=1, shuffle_window=1), 0)
    fresh.load_state_dict(state)
    rest = [i for batch in fresh for i in batch["id"].tolist()]
    assert sorted(seen[:24] + rest) == IDS


def test_follow_mode_polls_the_delta_log_on_s3(delta_on_s3: str, s3: S3Server,
                                               shadow_env: S3Server) -> None:
    uri = delta_on_s3.replace("/rows", "/followed")
    first, later = (0, 40), (40, 90)
    write_s3_delta(uri, [first], s3)
    dataset = LakeDataset(DeltaSource(uri, storage_options=s3.options()), columns=["id"],
                          batch_size=10, shuffle=False, follow=True, poll_interval=0.05,
                          max_idle=0.6, min_segment_rows=1)
    seen: list[int] = []
    for batch in loader_for(dataset, 0):
        seen.extend(batch["id"].tolist())
        if len(seen) == 40 and len(seen) < 90:
            write_s3_delta(uri, [later], s3)
    assert sorted(seen) == list(range(90))
    assert any("_delta_log/00000000000000000001.json" in r[1] for r in s3.requests())
    assert shadow_env.requests() == []


# -------------------------------------------------------------------- Iceberg on S3


@pytest.fixture(scope="module")
def iceberg_on_s3(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    root = tmp_path_factory.mktemp("iceberg_s3")
    catalog = SqlCatalog("s3cat", uri=f"sqlite:///{root}/catalog.db",
                         warehouse=f"s3://{s3.bucket('ice')}/wh", **s3.iceberg_properties())
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.rows", schema=rows_table(0, 1).schema, properties={
        "write.parquet.row-group-limit": str(ROW_GROUP_ROWS)})
    for lo, hi in RANGES:
        table.append(rows_table(lo, hi))
    return catalog


@pytest.mark.parametrize("workers", [0, 2])
def test_an_iceberg_table_on_s3_is_read_through_its_fileio_properties(
        iceberg_on_s3: Any, s3: S3Server, shadow_env: S3Server, workers: int
) -> None:
    dataset = LakeDataset(IcebergSource("ns.rows", catalog=iceberg_on_s3),
                          columns=["id", "name"], batch_size=24, seed=5)
    assert all(u.path.startswith("s3://") for u in dataset.snapshot.units)
    got = ids_of(dataset, workers)
    assert sorted(got) == IDS
    assert shadow_env.requests() == []


def test_iceberg_data_files_are_read_with_at_most_two_requests_per_row_group(
        iceberg_on_s3: Any, s3: S3Server) -> None:
    dataset = LakeDataset(IcebergSource("ns.rows", catalog=iceberg_on_s3), columns=["id"],
                          batch_size=24)
    units = dataset.snapshot.units
    s3.reset()
    assert np.array_equal(np.sort(ids_of(dataset)), IDS)
    gets = [r for r in s3.requests() if r[0] == "GET" and r[1].endswith(".parquet")]
    assert len(units) <= len(gets) <= 2 * len(units)


def test_the_prefetch_runs_ahead_across_pieces_and_windows_each_row_group_once(
        delta_on_s3: str, s3: S3Server) -> None:
    """NOTE [ prefetch ]: the reader tells the prefetch the whole pass, so with one window
    read ahead (``read_ahead=1``: one piece of 4 row groups, or one shuffle window of 2, being
    read at a time) the requests in flight still reach the prefetch depth; every row group is
    fetched once, and the rows are those of a reader without read-ahead, in the same order."""
    def dataset(read_ahead: int, shuffle: bool) -> LakeDataset:
        return LakeDataset(DeltaSource(delta_on_s3, storage_options=s3.options()),
                           columns=["id"], batch_size=24, seed=5, shuffle=shuffle,
                           shuffle_window=2, read_ahead=read_ahead)

    for shuffle in (False, True):
        sequential, ahead = dataset(0, shuffle), dataset(1, shuffle)
        row_groups = {(u.path, u.row_group) for u in sequential.snapshot.units}
        assert len(row_groups) > min(DEFAULT_PREFETCH, pa.io_thread_count()) > PLAIN_PIECE_UNITS
        expected = ids_of(sequential)
        s3.reset()
        s3.faults(latency_ms=200)
        try:
            got = ids_of(ahead)
        finally:
            s3.faults()
        gets = [r for r in s3.requests() if r[0] == "GET" and r[1].endswith(".parquet")]
        assert got == expected and sorted(got) == IDS
        assert s3.peak() == min(DEFAULT_PREFETCH, pa.io_thread_count())
        assert len(gets) == len(row_groups)  # one coalesced range each
        assert len({(r[1], r[2]) for r in gets}) == len(gets)  # none fetched twice


def test_a_resumed_pass_prefetches_only_the_row_groups_it_still_reads(
        delta_on_s3: str, s3: S3Server) -> None:
    """The sequence told to the prefetch starts at the resume position: a pass resumed
    half-way fetches the row groups holding the rows it delivers, and no earlier one."""
    def dataset() -> LakeDataset:
        return LakeDataset(DeltaSource(delta_on_s3, storage_options=s3.options()),
                           columns=["id"], batch_size=24, shuffle=False, read_ahead=2)

    full = ids_of(dataset())
    assert sorted(full) == IDS
    first = dataset()
    it = iter(first)
    head = [i for _ in range(8) for i in next(it)["id"].tolist()]
    state = first.state_dict()
    it.close()
    resumed = dataset()
    resumed.load_state_dict(state)
    s3.reset()
    rest = [i for batch in resumed for i in batch["id"].tolist()]
    assert head + rest == full
    gets = [r for r in s3.requests() if r[0] == "GET" and r[1].endswith(".parquet")]
    units = resumed.snapshot.units  # in the table's order: an unshuffled pass reads in it
    starts = np.cumsum([0] + [u.rows for u in units])
    needed = sum(1 for i in range(len(units)) if starts[i + 1] > len(head))
    assert len(gets) == needed
