"""The I/O layer on local disk, and how storage options become a store's configuration."""

from __future__ import annotations

import errno
import logging
import os
import pickle
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakeckpt_tables.errors import StorageError, StorageOptionsError, StoreUnavailableError
from lakeckpt_tables.io import (
    OPTIONS_ENV,
    Storage,
    iceberg_storage,
    parse_storage_options,
    s3_settings,
    storage_from_cli,
)
from lakeckpt_tables.io.checkpoint_storage import CheckpointStorage
from lakeckpt_tables.io.failures import classify, store_error
from lakeckpt_tables.sources import footers


def test_local_operations(tmp_path: Path) -> None:
    store = Storage(f"file://{tmp_path}/root")
    assert store.is_local and store.uri == f"{tmp_path}/root"
    assert store.list() == [] and not store.exists("a")
    store.put("a/b/one", b"0123456789")
    assert store.read_bytes("a/b/one") == b"0123456789"
    assert store.read_bytes(f"{tmp_path}/root/a/b/one", 2, 3) == b"234"
    assert store.list("a") == ["b"] and store.list("a/b") == ["one"]
    assert store.size("a/b/one") == 10
    assert store.sha256("a/b/one") == (
        "84d89877f0d4041efb6bf91a16f0248f2fd573e6af05c19f96bedb9f882f7882", 10)
    store.delete("a")
    assert not store.exists("a") and store.list() == []
    with pytest.raises(FileNotFoundError):
        store.read_bytes("a/b/one")
    with pytest.raises(FileNotFoundError):
        store.sha256("a/b/one")


def test_a_put_is_atomic_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    store = Storage(tmp_path)
    store.put("f", b"old")
    store.put("f", b"new contents")
    assert os.listdir(tmp_path) == ["f"] and (tmp_path / "f").read_bytes() == b"new contents"


def test_a_key_of_another_store_is_refused(tmp_path: Path) -> None:
    store = Storage("s3://bucket/root", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    with pytest.raises(StorageError, match="gs://other/x is not in the store"):
        store.read_bytes("gs://other/x")


def test_options_are_normalised_from_delta_rs_and_pyiceberg_names() -> None:
    delta = s3_settings({"aws_access_key_id": "AK", "AWS_SECRET_ACCESS_KEY": "SK",
                         "AWS_ENDPOINT_URL": "127.0.0.1:9000", "AWS_ALLOW_HTTP": "true"})
    assert delta == {"key": "AK", "secret": "SK", "endpoint": "http://127.0.0.1:9000",
                     "allow_http": "true", "region": "us-east-1"}
    iceberg = s3_settings({"s3.access-key-id": "AK", "s3.secret-access-key": "SK",
                           "s3.region": "eu-west-1", "s3.session-token": "T"})
    assert iceberg == {"key": "AK", "secret": "SK", "token": "T", "region": "eu-west-1",
                       "endpoint": "https://s3.eu-west-1.amazonaws.com"}


def test_delta_options_leave_nothing_to_the_environment() -> None:
    store = Storage("s3://b/t", {"s3.access-key-id": "AK", "s3.secret-access-key": "SK",
                                 "s3.region": "eu-west-1"})
    assert store.delta_options() == {
        "AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "https://s3.eu-west-1.amazonaws.com",
        "AWS_ENDPOINT_URL_S3": "https://s3.eu-west-1.amazonaws.com",
        "AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "conditional_put": "etag",
        "retry_timeout": "60s"}  # delta-rs retries for the library's budget, not its 180 s
    locked = Storage("s3://b/t", {"AWS_S3_LOCKING_PROVIDER": "dynamodb"}).delta_options()
    assert locked is not None and "conditional_put" not in locked
    assert locked["AWS_S3_LOCKING_PROVIDER"] == "dynamodb"
    assert Storage("s3://b/t").delta_options() is None
    with pytest.raises(StorageOptionsError, match="not an OAuth2 token"):
        Storage("gs://b/t", {"token": "x"}).delta_options()  # delta-rs has no such option


def test_azure_and_gcs_options_are_mapped_once_every_setting_explicit() -> None:
    """delta-rs, adlfs / gcsfs and pyiceberg each get the same store from any naming: the
    account (here from an abfss URI), the endpoint and the credentials, so no AZURE_* or
    GOOGLE_* variable of the environment fills a gap."""
    az = Storage("abfss://c@acct.dfs.core.windows.net/t", {"account_key": "a2V5",
                                                           "lakeckpt_retry_seconds": "5"})
    assert az.delta_options() == {
        "azure_storage_account_name": "acct", "azure_storage_account_key": "a2V5",
        "azure_storage_endpoint": "https://acct.blob.core.windows.net",
        "azure_storage_use_emulator": "false", "retry_timeout": "5s"}
    assert az.fsspec_options() == {"account_name": "acct", "connection_string": (
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=a2V5;"
        "BlobEndpoint=https://acct.blob.core.windows.net;")}
    assert az.iceberg_properties()["adls.blob-storage-authority"] == "acct.blob.core.windows.net"
    emulator = Storage("az://c/t", {"azure_storage_use_emulator": "true"}).delta_options()
    assert emulator is not None and emulator["azure_storage_endpoint"] == (
        "http://127.0.0.1:10000/devstoreaccount1") and emulator["azure_allow_http"] == "true"
    anonymous = Storage("az://c/t", {"azure_storage_account_name": "acct"})
    assert anonymous.fsspec_options()["anon"] is True
    assert (anonymous.delta_options() or {})["azure_skip_signature"] == "true"
    with pytest.raises(StorageOptionsError, match="no account"):
        Storage("az://c/t", {"azure_storage_account_key": "a2V5"}).delta_options()
    gcs = Storage("gs://b/t", {"google_project_id": "p"})
    assert gcs.fsspec_options() == {"endpoint_url": "https://storage.googleapis.com",
                                    "token": "anon", "project": "p"}
    assert gcs.delta_options() == {"google_base_url": "https://storage.googleapis.com",
                                   "google_skip_signature": "true", "retry_timeout": "60s"}


def test_a_gcs_key_that_is_no_key_is_named_without_repeating_it() -> None:
    broken = '{"type": "service_account", "private_key": "not-a-pem-secret"}'
    with pytest.raises(StorageOptionsError) as caught:
        Storage("gs://b/t", {"google_service_account_key": broken}).fsspec_options()
    assert "google_service_account_key is not a usable service account key" in str(
        caught.value)
    assert "not-a-pem-secret" not in str(caught.value)
    assert "refresh_token" not in str(caught.value)  # gcsfs's KeyError, as it was


def test_credentials_are_hidden_from_repr_and_redacted_from_text() -> None:
    store = Storage("s3://b/t", {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
                                 "AWS_SECRET_ACCESS_KEY": "very-secret-value",
                                 "AWS_SESSION_TOKEN": "session-token-value",
                                 "AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    text = repr(store) + repr(CheckpointStorage("s3://b/t", store._options))
    for secret in ("AKIAEXAMPLE", "very-secret-value", "session-token-value"):
        assert secret not in text
    assert store.redact("key AKIAEXAMPLE secret very-secret-value") == "key *** secret ***"
    azure = Storage("abfs://c/t", {"account_name": "acct", "account_key": "azure-key-value"})
    assert azure.redact("azure-key-value for acct") == "*** for acct"


def test_an_unreachable_endpoint_is_a_named_error_without_secrets() -> None:
    store = Storage("s3://b/t", {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
                                 "AWS_SECRET_ACCESS_KEY": "very-secret-value",
                                 "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "max_attempts": "1",
                                 "connect_timeout": "1", "lakeckpt_retry_seconds": "0.5"})
    with pytest.raises(StoreUnavailableError) as caught:
        store.read_bytes("f")
    assert caught.value.uri == "s3://b/t/f" and caught.value.kind == "unavailable"
    assert "s3://b/t/f" in str(caught.value) and "(unreachable)" in str(caught.value)
    assert "lakeckpt_retry_seconds" in str(caught.value)  # what to do
    assert "very-secret-value" not in str(caught.value)
    assert "AKIAEXAMPLE" not in str(caught.value)


def test_a_store_is_picklable_and_rebuilds_its_filesystem(tmp_path: Path) -> None:
    store = Storage(tmp_path)
    store.put("f", b"x")
    assert store.read_bytes("f") == b"x" and store._fs is not None
    copy = pickle.loads(pickle.dumps(store))
    assert copy._fs is None and copy == store and copy.read_bytes("f") == b"x"


def test_iceberg_storage_uses_s3_properties_only_for_s3_tables() -> None:
    props = {"s3.endpoint": "http://127.0.0.1:9", "s3.access-key-id": "AK", "uri": "sqlite://"}
    s3 = iceberg_storage("s3://b/wh/t", props)
    assert s3.has_options and s3.fsspec_options()["key"] == "AK"
    assert s3.fsspec_options()["endpoint_url"] == "http://127.0.0.1:9"
    assert not iceberg_storage("s3://b/wh/t", {"uri": "sqlite://"}).has_options
    assert not iceberg_storage("file:///tmp/wh/t", props).has_options


def test_iceberg_gcs_and_adls_properties_reach_gcsfs_and_adlfs() -> None:
    props = {"uri": "sqlite://", "gcs.project-id": "p", "gcs.oauth2.token": "ya29.tok",
             "adls.account-name": "acct", "adls.sas-token": "sv=2024&sig=abcd",
             "adls.connection-string": "DefaultEndpointsProtocol=https;AccountKey=c2VjcmV0",
             "adls.anon": "false"}
    gcs = iceberg_storage("gs://b/wh/t", props)
    assert gcs.fsspec_options() == {"project": "p", "token": "ya29.tok",
                                    "endpoint_url": "https://storage.googleapis.com"}
    azure = iceberg_storage("abfs://c@acct.dfs.core.windows.net/wh/t", props)
    assert azure.fsspec_options() == {"account_name": "acct", "connection_string": (
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=c2VjcmV0;"
        "BlobEndpoint=https://acct.blob.core.windows.net;")}
    assert not iceberg_storage("gs://b/wh/t", {"uri": "sqlite://"}).has_options
    text = f"{azure!r} failed with {props}"
    assert all(secret not in azure.redact(text) for secret in (
        "sv=2024&sig=abcd", "DefaultEndpointsProtocol=https;AccountKey=c2VjcmV0"))
    assert "ya29.tok" not in gcs.redact(text)


def test_checkpoint_checksums_and_verification(tmp_path: Path) -> None:
    store = CheckpointStorage(str(tmp_path))
    store.store.put("run/step/a", b"aaa")
    store.store.put("run/step/b", b"bb")
    manifest = store.checksums("run/step", ["b", "a"])
    assert list(manifest) == ["a", "b"] and manifest["b"]["bytes"] == 2
    assert store.verify("run/step", manifest) == []
    store.store.put("run/step/a", b"aab")
    store.store.delete("run/step/b")
    assert store.verify("run/step", manifest) == [
        f"{tmp_path}/run/step/a does not match its sha256 {manifest['a']['sha256']}",
        f"{tmp_path}/run/step/b is missing"]


def test_removing_a_checkpoint_is_best_effort(caplog: pytest.LogCaptureFixture) -> None:
    store = CheckpointStorage("s3://b/t", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9",
                                           "max_attempts": "1", "connect_timeout": "1",
                                           "lakeckpt_retry_seconds": "0"})
    with caplog.at_level(logging.WARNING):
        store.delete("run/step-1")
    assert "could not remove s3://b/t/run/step-1" in caplog.text


def test_footers_are_read_once_per_file_and_reused_by_remote_opens(tmp_path: Path) -> None:
    path = str(tmp_path / "f.parquet")
    pq.write_table(pa.table({"id": list(range(100))}), path, row_group_size=10)
    before = footers.footer_reads()
    [footer] = footers.read_footers([path], [None])
    [again] = footers.read_footers([path], [None])
    assert footer is again and footer.row_group_rows == (10,) * 10
    assert footers.footer_reads() == before + 1


def test_gcs_and_azure_options_become_fsspec_keywords(tmp_path: Path) -> None:
    from google.oauth2.credentials import Credentials

    key = tmp_path / "user.json"  # a user's credentials file (gcloud's): no private key
    key.write_text('{"type": "authorized_user", "client_id": "c", "client_secret": "s", '
                   '"refresh_token": "r"}')
    gcs = Storage("gs://b/t", {"google_service_account_path": str(key),
                               "google_project_id": "p"})
    fsspec = gcs.fsspec_options()
    assert isinstance(fsspec["token"], Credentials) and fsspec["project"] == "p"
    assert gcs.delta_options() == {"google_service_account": str(key),
                                   "google_base_url": "https://storage.googleapis.com",
                                   "retry_timeout": "60s"}
    azure = Storage("abfs://c@acct.dfs.core.windows.net/t", {
        "AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_ACCOUNT_KEY": "k",
        "anon": "false"})
    assert azure.fsspec_options() == {"account_name": "acct", "connection_string": (
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=k;"
        "BlobEndpoint=https://acct.blob.core.windows.net;")}


def test_storage_options_from_the_command_line_json_file_or_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OPTIONS_ENV, raising=False)
    assert parse_storage_options(None) is None
    given = '{"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "max_attempts": 2, "x": true}'
    assert parse_storage_options(given) == {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
                                            "max_attempts": "2", "x": "true"}
    path = tmp_path / "s3.json"
    path.write_text('{"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "hunter2-secret"}')
    store = storage_from_cli("s3://b/root", f"@{path}")
    assert store.has_options and store.delta_options()["AWS_SECRET_ACCESS_KEY"] == \
        "hunter2-secret"
    monkeypatch.setenv(OPTIONS_ENV, f"@{path}")
    assert parse_storage_options() == {"AWS_ACCESS_KEY_ID": "AK",
                                       "AWS_SECRET_ACCESS_KEY": "hunter2-secret"}
    for bad in ('{"AWS_SECRET_ACCESS_KEY": "hunter2-secret"', '["hunter2-secret"]',
                '{"AWS_SECRET_ACCESS_KEY": {"v": "hunter2-secret"}}', f"@{tmp_path}/none.json"):
        with pytest.raises(StorageOptionsError) as caught:
            parse_storage_options(bad)
        assert "hunter2" not in str(caught.value)  # never echoed: options hold credentials
        assert "--storage-options" in str(caught.value)


def test_store_failures_are_named_by_kind_in_plain_words() -> None:
    delta_rs = ("Generic S3 error\n \x1b[31m↳\x1b[0m Error performing GET http://h/b?list in "
                "2ms - Server returned non-2xx status code\n \x1b[31m↳\x1b[0m 404 Not Found\n "
                "\x1b[31m↳\x1b[0m <?xml version=\"1.0\" encoding=\"utf-8\"?>\n<Error><Code>"
                "NoSuchBucket</Code><Message>The specified bucket does not exist</Message>"
                "<BucketName>b</BucketName></Error>")
    error = store_error("s3://b/root", "read", OSError(delta_rs))
    assert (error.kind, error.uri) == ("bucket missing", "s3://b/root")
    assert "\x1b[" not in str(error) and "<" not in str(error)
    assert "NoSuchBucket: The specified bucket does not exist" in str(error)
    assert "create it, or fix the bucket name" in str(error)
    for text, kind in (("AWS Error ACCESS_DENIED during GetObject", "access denied"),
                       ("An error occurred (InvalidAccessKeyId)", "access denied"),
                       ("tcp connect error -> Connection refused (os error 111)", "unreachable"),
                       ("AWS Error UNKNOWN (HTTP status 503) during HeadObject", "unavailable"),
                       ("curlCode: 28, Timeout was reached", "unavailable"),
                       ("retry_timeout 180s - Connection refused", "unreachable")):
        assert classify(OSError(text)) == kind, text


# ------------------------------------------------------------------------- a full disk


def _fill(path: Path) -> None:
    """Write ``path`` until its file system is full."""
    handle = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(handle, b"\0" * 1024)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(handle)


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 64 KiB file system (tmpfs), filled: every write fails with ENOSPC."""
    mount = tmp_path / "full"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    _fill(mount / "filler")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_is_named_on_every_write_path(tmp_path: Path, full_disk: Path) -> None:
    """The shared-root probe of a new manager and a restore's claim on the ledger: a
    StorageError of kind "store full" saying what to do, not a bare OSError nor "failed"."""
    import torch

    from lakeckpt_tables.checkpoint import CheckpointManager

    with pytest.raises(StorageError) as probe:
        CheckpointManager(full_disk / "ckpt", "run", ledger=f"delta:{tmp_path / 'ledger'}")
    assert probe.value.kind == "store full" and str(full_disk) in str(probe.value)
    assert "free space or raise the quota" in str(probe.value)
    root = tmp_path / "ckpt"
    (full_disk / "filler").unlink()
    saved = CheckpointManager(root, "run", ledger=f"delta:{full_disk / 'ledger'}")
    saved.save(1, model=torch.nn.Linear(2, 1))
    _fill(full_disk / "filler")
    with pytest.raises(StorageError) as claim:
        CheckpointManager(root, "run", ledger=f"delta:{full_disk / 'ledger'}").restore(
            model=torch.nn.Linear(2, 1))
    assert claim.value.kind == "store full", claim.value
    assert "free space or raise the quota" in str(claim.value)
    (full_disk / "filler").unlink()  # space again: the restore claims the run once
    assert CheckpointManager(root, "run", ledger=f"delta:{full_disk / 'ledger'}").restore(
        model=torch.nn.Linear(2, 1)) == 1
