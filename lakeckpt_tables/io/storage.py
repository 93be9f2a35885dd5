"""One store, built from a URI and storage options: every byte the library reads or writes.

NOTE [ storage options ]
Options are what the user hands a source or a ``CheckpointManager``: delta-rs / object_store
keys (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ... in any case) or pyiceberg FileIO keys
(``s3.access-key-id``, ``s3.endpoint``, ...). When options are given they are the whole
configuration: the filesystem is built from them explicitly, a missing endpoint becomes AWS's
regional one and missing credentials mean anonymous access, so an ``AWS_*`` variable of the
environment (another account, another endpoint) is never read. Without options (None) the
store is configured the usual way, from the environment.

NOTE [ backing ]
S3 goes through pyarrow's native ``S3FileSystem``: Parquet row groups are fetched with
pre-buffering, which coalesces a row group's column chunks into one or two ranged GETs
(measured: 1-2 requests per row group read, where fsspec's s3fs reads through a readahead
cache that issues more, smaller requests). Other URIs (gs://, abfs://, ...) go through fsspec,
wrapped for pyarrow, with the options passed to fsspec as they are.

A ``Storage`` is picklable: the filesystem is not pickled but rebuilt lazily in the process
that uses it (DataLoader workers, other ranks), and credentials never appear in its repr or in
the errors it raises.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from lakeckpt_tables.errors import StorageError

__all__ = ["Storage", "iceberg_storage", "s3_settings"]

_CHUNK = 1 << 20

# canonical S3 setting -> the option names that give it (lower-cased)
_S3_KEYS: dict[str, tuple[str, ...]] = {
    "key": ("aws_access_key_id", "access_key_id", "s3.access-key-id", "key"),
    "secret": ("aws_secret_access_key", "secret_access_key", "s3.secret-access-key", "secret"),
    "token": ("aws_session_token", "session_token", "aws_token", "token", "s3.session-token"),
    "region": ("aws_region", "region", "aws_default_region", "s3.region"),
    "endpoint": ("aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint",
                 "aws_endpoint_url_s3", "s3.endpoint"),
    "allow_http": ("aws_allow_http", "allow_http"),
    "connect_timeout": ("connect_timeout", "s3.connect-timeout"),
    "request_timeout": ("request_timeout", "timeout", "s3.request-timeout"),
    "max_attempts": ("max_attempts", "max_retries", "s3.max-attempts"),
}
_SECRET_SETTINGS = ("key", "secret", "token")

# delta-rs / object_store option names -> the fsspec implementation's keyword (gcsfs, adlfs);
# fsspec keywords given as they are pass through.
_GCS_NAMES = {"google_service_account": "token", "google_service_account_path": "token",
              "service_account": "token", "service_account_path": "token",
              "google_application_credentials": "token", "google_service_account_key": "token",
              "service_account_key": "token", "google_project_id": "project"}
_AZURE_NAMES = {"azure_storage_account_name": "account_name",
                "azure_storage_account_key": "account_key",
                "azure_storage_access_key": "account_key", "access_key": "account_key",
                "azure_storage_sas_token": "sas_token",
                "azure_storage_sas_key": "sas_token", "azure_client_id": "client_id",
                "azure_storage_client_id": "client_id", "azure_client_secret": "client_secret",
                "azure_storage_client_secret": "client_secret", "azure_tenant_id": "tenant_id",
                "azure_storage_tenant_id": "tenant_id"}
_FSSPEC_NAMES = {"gs": _GCS_NAMES, "gcs": _GCS_NAMES, "abfs": _AZURE_NAMES,
                 "abfss": _AZURE_NAMES, "az": _AZURE_NAMES}
# fsspec keywords that take a bool: options are strings ("false" would be truthy)
_FSSPEC_BOOLS = frozenset({"anon", "requester_pays", "version_aware", "use_ssl"})

# pyiceberg FileIO properties of GCS and ADLS -> the gcsfs / adlfs keyword pyiceberg's own
# fsspec FileIO gives them (pyiceberg/io/fsspec.py, _gs and _adls)
_ICEBERG_GCS = {"gcs.project-id": "project", "gcs.oauth2.token": "token",
                "gcs.service.host": "endpoint_url", "gcs.access": "access",
                "gcs.requester-pays": "requester_pays", "gcs.version-aware": "version_aware"}
_ICEBERG_ADLS = {"adls.account-name": "account_name", "adls.account-key": "account_key",
                 "adls.sas-token": "sas_token", "adls.tenant-id": "tenant_id",
                 "adls.client-id": "client_id", "adls.client-secret": "client_secret",
                 "adls.connection-string": "connection_string",
                 "adls.account-host": "account_host", "adls.anon": "anon"}
_ICEBERG_NAMES = {"gs": _ICEBERG_GCS, "gcs": _ICEBERG_GCS, "abfs": _ICEBERG_ADLS,
                  "abfss": _ICEBERG_ADLS, "az": _ICEBERG_ADLS}


def _fsspec_names(options: Mapping[str, str], names: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in options.items():
        name = names.get(key.lower(), key)
        if name == "token" and value.lstrip().startswith("{"):
            out[name] = json.loads(value)  # a service account key given inline
        elif name in _FSSPEC_BOOLS and value.lower() in ("true", "false"):
            out[name] = value.lower() == "true"
        else:
            out[name] = value
    return out


def s3_settings(options: Mapping[str, str]) -> dict[str, str]:
    """The S3 settings in ``options`` under canonical names (key, secret, token, region,
    endpoint, allow_http, connect_timeout, request_timeout, max_attempts)."""
    lowered = {k.lower(): str(v) for k, v in options.items()}
    out: dict[str, str] = {}
    for name, aliases in _S3_KEYS.items():
        for alias in aliases:
            if alias in lowered:
                out[name] = lowered[alias]
                break
    region = out.setdefault("region", "us-east-1")
    out.setdefault("endpoint", f"https://s3.{region}.amazonaws.com")
    if "://" not in out["endpoint"]:
        scheme = "http" if out.get("allow_http", "").lower() == "true" else "https"
        out["endpoint"] = f"{scheme}://{out['endpoint']}"
    return out


class Storage:
    """A file system or object store rooted at ``uri``.

    Keys given to the methods are either relative to the root or absolute (a URI of the same
    store, or an absolute local path).

    Args:
        uri: root, a local path, ``file://``, ``s3://bucket/prefix`` or another fsspec URI.
        options: storage options (NOTE [ storage options ]); None for the environment's.
    """

    def __init__(self, uri: str | os.PathLike[str], options: Mapping[str, str] | None = None
                 ) -> None:
        text = os.fspath(uri)
        parsed = urlparse(text)
        if parsed.scheme in ("", "file") or len(parsed.scheme) == 1:  # 1: a Windows drive
            self.scheme = ""
            self.uri = os.path.abspath(unquote(parsed.path) if parsed.scheme else text)
        else:
            self.scheme = parsed.scheme.lower()
            self.uri = text.rstrip("/")
        self._options = None if options is None else {str(k): str(v) for k, v in
                                                      options.items()}
        self._fs: pafs.FileSystem | None = None
        self._pid: int | None = None

    # ------------------------------------------------------------------ identity, pickling

    @property
    def is_local(self) -> bool:
        return self.scheme == ""

    @property
    def has_options(self) -> bool:
        return self._options is not None

    def __repr__(self) -> str:
        given = "none" if self._options is None else f"{len(self._options)} given, hidden"
        return f"Storage({self.uri!r}, options: {given})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fs"] = None  # rebuilt lazily where it is used
        state["_pid"] = None
        return state

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Storage) and (self.uri, self._options) == (other.uri,
                                                                          other._options)

    def __hash__(self) -> int:
        return hash(self.uri)

    def child(self, key: str) -> Storage:
        """The same store rooted at ``key``."""
        return Storage(self.url(key), self._options)

    # ----------------------------------------------------------------------------- paths

    def url(self, key: str = "") -> str:
        """``key`` as a full path or URI."""
        if not key:
            return self.uri
        if self.is_local:
            if key.startswith("file://"):
                return unquote(urlparse(key).path)
            return key if os.path.isabs(key) else os.path.join(self.uri, key)
        if "://" in key:
            return key
        return f"{self.uri}/{key.lstrip('/')}"

    def fs_path(self, key: str) -> str:
        """``key`` as a path of :attr:`filesystem` (no scheme)."""
        return self._inner(key)

    def _inner(self, key: str) -> str:
        url = self.url(key)
        if self.is_local:
            return url
        scheme, sep, rest = url.partition("://")
        if not sep or scheme.lower() != self.scheme:
            raise StorageError(f"{url} is not in the store of {self.uri}")
        return rest

    # ------------------------------------------------------------------------ filesystem

    @property
    def filesystem(self) -> pafs.FileSystem:
        """This process's pyarrow filesystem (built on first use in each process)."""
        if self._fs is None or self._pid != os.getpid():
            self._fs = self._build()
            self._pid = os.getpid()
        return self._fs

    def _build(self) -> pafs.FileSystem:
        if self.is_local:
            return pafs.LocalFileSystem()
        if self.scheme in ("s3", "s3a") and self._options is not None:
            return _arrow_s3(s3_settings(self._options))
        if self._options is None and self.scheme in ("s3", "s3a", "gs", "gcs"):
            fs, _ = pafs.FileSystem.from_uri(self.uri.replace("s3a://", "s3://", 1))
            return fs
        import fsspec

        fs_spec = fsspec.filesystem(self.scheme, **self.fsspec_options())
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs_spec))

    def fsspec_options(self) -> dict[str, Any]:
        """The options as fsspec keyword arguments (s3fs for S3, as given for other stores)."""
        if self._options is None:
            return {}
        if self.scheme in _FSSPEC_NAMES:
            return _fsspec_names(self._options, _FSSPEC_NAMES[self.scheme])
        if self.scheme not in ("s3", "s3a"):
            return dict(self._options)
        s3 = s3_settings(self._options)
        config: dict[str, Any] = {"connect_timeout": float(s3.get("connect_timeout", 5)),
                                  "read_timeout": float(s3.get("request_timeout", 30))}
        if "max_attempts" in s3:
            config["retries"] = {"max_attempts": int(s3["max_attempts"]), "mode": "standard"}
        out: dict[str, Any] = {"endpoint_url": s3["endpoint"], "config_kwargs": config,
                               "client_kwargs": {"region_name": s3["region"]}}
        if "key" in s3:
            out.update(key=s3["key"], secret=s3.get("secret"), token=s3.get("token"))
        else:
            out["anon"] = True
        return out

    def delta_options(self) -> dict[str, str] | None:
        """The options for delta-rs, with every setting explicit (no environment fallback).

        A commit on S3 needs an atomic "create if absent": S3's conditional PUT is used unless
        the options choose another way (a locking provider, or unsafe renames).
        """
        if self._options is None or self.scheme not in ("s3", "s3a"):
            return None if self._options is None else dict(self._options)
        s3 = s3_settings(self._options)
        out = {k: v for k, v in self._options.items()
               if k.lower() not in {a for aliases in _S3_KEYS.values() for a in aliases}}
        # delta-rs prefers an AWS_ENDPOINT_URL_S3 of the environment to AWS_ENDPOINT_URL
        out.update(AWS_REGION=s3["region"], AWS_ENDPOINT_URL=s3["endpoint"],
                   AWS_ENDPOINT_URL_S3=s3["endpoint"])
        if s3["endpoint"].startswith("http://"):
            out["AWS_ALLOW_HTTP"] = "true"
        if "key" in s3:
            out.update(AWS_ACCESS_KEY_ID=s3["key"], AWS_SECRET_ACCESS_KEY=s3.get("secret", ""))
            if "token" in s3:
                out["AWS_SESSION_TOKEN"] = s3["token"]
        else:
            out["AWS_SKIP_SIGNATURE"] = "true"
        lowered = {k.lower() for k in out}
        if not lowered & {"aws_s3_locking_provider", "aws_s3_allow_unsafe_rename",
                          "conditional_put", "aws_conditional_put"}:
            out["conditional_put"] = "etag"
        return out

    # ------------------------------------------------------------------------ operations

    @contextmanager
    def _errors(self, action: str, key: str) -> Iterator[None]:
        try:
            yield
        except FileNotFoundError:
            raise
        except (StorageError, pa.ArrowInvalid):
            raise  # a named error already, or bad content (not Parquet): the caller names the file
        except (OSError, ValueError) as exc:
            if _not_found(exc):
                raise FileNotFoundError(2, "no such file", self.url(key)) from exc
            if self.is_local and isinstance(exc, OSError):
                raise  # a local file's own error (permissions, a directory): callers name it
            raise StorageError(
                f"could not {action} {self.url(key)}: {self.redact(str(exc))}. Check that the "
                "store is reachable and the storage options (endpoint, credentials) are "
                "right, then retry"
            ) from exc

    def redact(self, text: str) -> str:
        """``text`` with every credential of the options replaced by ``***``."""
        for secret in self._secrets():
            text = text.replace(secret, "***")
        return text

    def _secrets(self) -> list[str]:
        if not self._options:
            return []
        s3 = s3_settings(self._options) if self.scheme in ("s3", "s3a") else {}
        values = [s3[k] for k in _SECRET_SETTINGS if k in s3]
        values += [v for k, v in self._options.items()
                   if any(w in k.lower() for w in ("secret", "token", "key", "password",
                                                   "credential", "sas", "connection"))
                   and not k.lower().endswith(("region", "endpoint"))]
        return [v for v in values if len(v) >= 4]

    def read_bytes(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        """Bytes ``[start, start + length)`` of a file (to its end when ``length`` is None).

        Raises:
            FileNotFoundError: no such file.
            StorageError: the store failed.
        """
        with self._errors("read", key):
            if start == 0 and length is None:
                with self.filesystem.open_input_stream(self._inner(key)) as stream:
                    data: bytes = stream.read()
                    return data
            with self.filesystem.open_input_file(self._inner(key)) as handle:
                out: bytes = handle.read_at(handle.size() - start if length is None else length,
                                            start)
                return out

    def open_parquet(self, key: str, *,
                     metadata: pq.FileMetaData | None = None) -> pq.ParquetFile:
        """A Parquet file whose row group reads are coalesced ranged requests.

        ``metadata`` (a cached footer) saves the footer read. Opening costs one HEAD request
        on S3 (pyarrow's binding takes no known size), once per file and reader.
        """
        with self._errors("open", key):
            handle = self.filesystem.open_input_file(self._inner(key))
            # INT96 (Spark's timestamps) as microseconds, the one timestamp unit of every
            # reader: pyarrow's nanosecond default overflows past 2262.
            return _ParquetFile(handle, metadata=metadata, pre_buffer=not self.is_local,
                                coerce_int96_timestamp_unit="us",
                                errors=lambda: self._errors("read", key))

    def list(self, key: str = "") -> list[str]:
        """Names directly under ``key`` (files and directories), sorted; [] when absent."""
        with self._errors("list", key):
            selector = pafs.FileSelector(self._inner(key), allow_not_found=True)
            infos = self.filesystem.get_file_info(selector)
            return sorted(info.base_name for info in infos)

    def exists(self, key: str) -> bool:
        """Whether a file or directory (a non-empty prefix, on object stores) is at ``key``."""
        with self._errors("look up", key):
            info = self.filesystem.get_file_info(self._inner(key))
            return bool(info.type != pafs.FileType.NotFound)

    def size(self, key: str) -> int:
        """Size of a file in bytes.

        Raises:
            FileNotFoundError: no such file.
        """
        with self._errors("look up", key):
            info = self.filesystem.get_file_info(self._inner(key))
            if info.type == pafs.FileType.NotFound:
                raise FileNotFoundError(2, "no such file", self.url(key))
            return int(info.size)

    def put(self, key: str, data: bytes) -> None:
        """Write a whole file atomically: readers see the old file, or all of ``data``.

        Local files are written aside and renamed; an object store PUT is atomic already.
        """
        with self._errors("write", key):
            path = self._inner(key)
            if self.is_local:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
                with open(tmp, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, path)
                return
            with self.filesystem.open_output_stream(path) as stream:
                stream.write(data)

    def delete(self, key: str) -> None:
        """Remove a file or a directory tree; nothing happens when it is absent."""
        with self._errors("delete", key):
            path = self._inner(key)
            info = self.filesystem.get_file_info(path)
            if info.type == pafs.FileType.Directory:
                self.filesystem.delete_dir(path)
            elif info.type == pafs.FileType.File:
                self.filesystem.delete_file(path)

    def sha256(self, key: str) -> tuple[str, int]:
        """SHA-256 hex digest and size of a file, streamed.

        Raises:
            FileNotFoundError: no such file.
        """
        digest = hashlib.sha256()
        size = 0
        with self._errors("read", key), self.filesystem.open_input_stream(
                self._inner(key)) as stream:
            while block := stream.read(_CHUNK):
                digest.update(block)
                size += len(block)
        return digest.hexdigest(), size


class _ParquetFile(pq.ParquetFile):  # type: ignore[misc]
    """A Parquet file whose reads raise :class:`StorageError` when the store fails.

    Reads are thread-safe (NOTE [ prefetch ] in :mod:`lakeckpt_tables.io.prefetch`): a thread
    other than the opener's reads through its own ``ParquetFile`` over the same open handle
    (positional reads, thread-safe) and footer, so no request is repeated.
    """

    def __init__(self, source: Any, *, errors: Any, **kwargs: Any) -> None:
        super().__init__(source, **kwargs)
        self._store_errors = errors
        self.size_bytes: int = source.size()  # known from opening: no extra request
        self._source = source
        self._kwargs = {k: v for k, v in kwargs.items() if k != "metadata"}
        self._opener = threading.get_ident()
        self._local = threading.local()

    def _here(self) -> pq.ParquetFile | None:
        """This thread's file: None for the opener's thread (``self``), a clone elsewhere."""
        if threading.get_ident() == self._opener:
            return None
        clone: pq.ParquetFile | None = getattr(self._local, "file", None)
        if clone is None:
            clone = self._local.file = pq.ParquetFile(self._source, metadata=self.metadata,
                                                      **self._kwargs)
        return clone

    def read_row_group(self, *args: Any, **kwargs: Any) -> Any:
        with self._store_errors():
            clone = self._here()
            if clone is not None:
                return clone.read_row_group(*args, **kwargs)
            return super().read_row_group(*args, **kwargs)

    def read_row_groups(self, *args: Any, **kwargs: Any) -> Any:
        with self._store_errors():
            clone = self._here()
            if clone is not None:
                return clone.read_row_groups(*args, **kwargs)
            return super().read_row_groups(*args, **kwargs)

    def read(self, *args: Any, **kwargs: Any) -> Any:
        with self._store_errors():
            clone = self._here()
            if clone is not None:
                return clone.read(*args, **kwargs)
            return super().read(*args, **kwargs)

    def iter_batches(self, *args: Any, **kwargs: Any) -> Any:
        with self._store_errors():
            clone = self._here()
            yield from (clone.iter_batches(*args, **kwargs) if clone is not None
                        else super().iter_batches(*args, **kwargs))


def _not_found(exc: BaseException) -> bool:
    text = str(exc)
    return "NoSuchKey" in text or "Path does not exist" in text or "NOT_FOUND" in text


def _arrow_s3(s3: Mapping[str, str], *, allow_bucket_creation: bool = False
              ) -> pafs.S3FileSystem:
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


def iceberg_storage(location: str, properties: Mapping[str, str]) -> Storage:
    """The store of an Iceberg table, from its FileIO properties (the catalog's and table's).

    ``s3.*`` properties configure S3 explicitly (NOTE [ storage options ]), ``gcs.*`` and
    ``adls.*`` ones GCS and Azure (as the gcsfs / adlfs keywords pyiceberg's fsspec FileIO
    gives them); a table without them is read with the environment's configuration, as
    pyiceberg's own FileIO would.
    """
    scheme = urlparse(location).scheme.lower()
    s3 = {k: str(v) for k, v in properties.items() if k.startswith("s3.")}
    if s3 and scheme in ("s3", "s3a"):
        return Storage(location, s3)
    names = _ICEBERG_NAMES.get(scheme, {})
    given = {names[k]: str(v) for k, v in properties.items() if k in names}
    return Storage(location, given) if given else Storage(location)
