"""The pyarrow filesystem of a store, and the release of S3 clients before the process exits.

NOTE [ backing ]
S3 goes through pyarrow's native ``S3FileSystem``: Parquet row groups are fetched with
pre-buffering, which coalesces a row group's column chunks into one or two ranged GETs
(measured: 1-2 requests per row group read, where fsspec's s3fs reads through a readahead
cache that issues more, smaller requests). Azure goes through adlfs and GCS through gcsfs,
wrapped for pyarrow with their files opened uncached (:class:`_ExactReads`), so pre-buffering
coalesces their reads the same way (pyarrow's native ``AzureFileSystem`` was tried: its C++
client aborts the process on a response it cannot parse, ``terminate called ... Failed to
parse xml``, seen against Azurite). Other URIs go through fsspec with the options as given.

NOTE [ one retry budget ]
gcsfs retries a failing request 6 times over up to 63 s, and Azure's SDK (under adlfs) 3 times
with backoff: a store that was down for a whole save kept it retrying for 1-3 minutes whatever
``lakeckpt_retry_seconds`` said, and a read then failed with the client's own exception. Their
clients here try each request once; the library retries within its budget (NOTE [ retry
budget ] in :mod:`lakeckpt_tables.io.failures`) and names the failure.

NOTE [ S3 at exit ]
pyarrow shuts the AWS SDK down in an ``atexit`` hook (``ensure_s3_finalized``). An S3 client
still referenced then (a store's cached filesystem, a dataset or an open file over it) is
destroyed later, during interpreter teardown, after the SDK it needs is gone: the process can
abort (``terminate called without an active exception``, exit 134) after printing its result,
a failure that a CI gate on the exit status cannot tell from a real one. So every store that
built an S3 client is tracked (weakly), and a hook registered after pyarrow's (``atexit`` runs
hooks last-in first-out, so it runs first) drops their clients and collects what referenced
them before pyarrow finalizes.
"""

from __future__ import annotations

import atexit
import gc
import threading
import weakref
from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import urlparse

import pyarrow.fs as pafs

from lakeckpt_tables.io import options as opts
from lakeckpt_tables.io.options import s3_settings

__all__ = ["arrow_s3", "build_filesystem", "fsspec_filesystem",
           "release_at_exit", "release_s3_clients"]


class _HoldsFilesystem(Protocol):
    _fs: Any


_holders: weakref.WeakSet[Any] = weakref.WeakSet()
_hook_lock = threading.Lock()
_hooked = False


def build_filesystem(scheme: str, uri: str, options: Mapping[str, str] | None
                     ) -> pafs.FileSystem:
    """The pyarrow filesystem of the store at ``uri`` (NOTE [ backing ])."""
    if scheme == "":
        return pafs.LocalFileSystem()
    if scheme in opts.S3_SCHEMES and options is not None:
        return arrow_s3(s3_settings(options))
    if options is None and scheme in ("s3", "s3a", "gs", "gcs"):
        fs, _ = pafs.FileSystem.from_uri(uri.replace("s3a://", "s3://", 1))
        return fs
    return pafs.PyFileSystem(_ExactReads(fsspec_filesystem(scheme, uri, options)))


class _ExactReads(pafs.FSSpecHandler):  # type: ignore[misc]
    """fsspec's handler for pyarrow, its files opened without a read-ahead cache: pyarrow
    asks for exactly the ranges it needs (a row group's columns, coalesced), which gcsfs's
    and adlfs's default caches turned into reads of whole 4-5 MB blocks; and one metadata
    request per open, not two (``isfile`` then ``open``)."""

    def open_input_file(self, path: str) -> Any:
        from pyarrow import PythonFile

        return PythonFile(self.fs.open(path, mode="rb", cache_type="none"), mode="r")

    def open_input_stream(self, path: str) -> Any:
        # not fsspec's isfile() first: it answers False for a store that fails, which
        # pyarrow's handler turned into FileNotFoundError (a down store read as a lost file)
        return self.open_input_file(path)


def fsspec_filesystem(scheme: str, uri: str, options: Mapping[str, str] | None) -> Any:
    """The fsspec filesystem of the store at ``uri`` with the options (NOTE [ backing ]).

    GCS with options goes through gcsfs's core ``GCSFileSystem``: the class fsspec registers
    for ``gs`` by default (``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT``) first asks Google's storage
    control API whether a bucket is hierarchical, which an emulator or a private endpoint
    lacks: each bucket waited 60 s for the answer.
    """
    import fsspec

    kwargs = opts.fsspec_kwargs(scheme, options, uri)
    if scheme in opts.GCS_SCHEMES and options is not None:
        return _gcs_class()(**kwargs)
    fs = fsspec.filesystem(scheme, **kwargs)
    if scheme in opts.AZURE_SCHEMES and options is not None and "connection_string" in kwargs:
        _azure_tries_once(fs, kwargs["connection_string"])
    return fs


def _gcs_class() -> type:
    """gcsfs's core ``GCSFileSystem`` whose requests are tried once (NOTE [ one retry
    budget ])."""
    from gcsfs.core import GCSFileSystem

    class OnceGCSFileSystem(GCSFileSystem):  # type: ignore[misc]
        _request = GCSFileSystem._request.__wrapped__
        _get_file_request = GCSFileSystem._get_file_request.__wrapped__

    return OnceGCSFileSystem


def _azure_tries_once(fs: Any, connection_string: str) -> None:
    """adlfs's Azure client rebuilt to try each request once (NOTE [ one retry budget ])."""
    from azure.storage.blob.aio import BlobServiceClient
    from fsspec.asyn import sync

    if getattr(fs, "_lakeckpt_once", False):  # fsspec's cached instance, already rebuilt
        return
    built = fs.service_client
    fs.service_client = BlobServiceClient.from_connection_string(
        connection_string, retry_total=0, connection_timeout=10, read_timeout=60)
    fs._lakeckpt_once = True
    sync(fs.loop, built.close)  # its HTTP session, else reported unclosed at exit


def release_at_exit(holder: _HoldsFilesystem) -> None:
    """Drop ``holder._fs`` (an S3 client) before pyarrow finalizes S3 at exit
    (NOTE [ one retry budget ]
gcsfs retries a failing request 6 times over up to 63 s, and Azure's SDK (under adlfs) 3 times
with backoff: a store that was down for a whole save kept it retrying for 1-3 minutes whatever
``lakeckpt_retry_seconds`` said, and a read then failed with the client's own exception. Their
clients here try each request once; the library retries within its budget (NOTE [ retry
budget ] in :mod:`lakeckpt_tables.io.failures`) and names the failure.

NOTE [ S3 at exit ])."""
    global _hooked
    with _hook_lock:
        _holders.add(holder)
        if not _hooked:
            atexit.register(release_s3_clients)  # after pyarrow.fs's own: runs before it
            _hooked = True


def release_s3_clients() -> None:
    """Drop every tracked S3 client and collect what referenced them (NOTE [ one retry budget ]
gcsfs retries a failing request 6 times over up to 63 s, and Azure's SDK (under adlfs) 3 times
with backoff: a store that was down for a whole save kept it retrying for 1-3 minutes whatever
``lakeckpt_retry_seconds`` said, and a read then failed with the client's own exception. Their
clients here try each request once; the library retries within its budget (NOTE [ retry
budget ] in :mod:`lakeckpt_tables.io.failures`) and names the failure.

NOTE [ S3 at exit ])."""
    for holder in list(_holders):
        holder._fs = None
    _holders.clear()
    gc.collect()


def arrow_s3(s3: Mapping[str, str], *, allow_bucket_creation: bool = False
             ) -> pafs.S3FileSystem:
    """pyarrow's S3 client from canonical settings (:func:`~lakeckpt_tables.io.options.
    s3_settings`); it never creates a bucket unless told to (a bench's own bucket)."""
    endpoint = urlparse(s3["endpoint"])
    kwargs: dict[str, Any] = {
        "region": s3["region"],
        "endpoint_override": endpoint.netloc,
        "scheme": endpoint.scheme or "https",
        "connect_timeout": float(s3.get("connect_timeout", 5)),
        "request_timeout": float(s3.get("request_timeout", 30)),
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(int(s3.get("max_attempts", 3))),
        "allow_bucket_creation": allow_bucket_creation,
    }
    if "key" in s3:
        kwargs.update(access_key=s3["key"], secret_key=s3.get("secret", ""),
                      session_token=s3.get("token"))
    else:
        kwargs["anonymous"] = True
    return pafs.S3FileSystem(**kwargs)
