"""One store, built from a URI and storage options: every byte the library reads or writes.

NOTE [ backing ] in :mod:`lakeckpt_tables.io.filesystems` says which client serves which store.

A ``Storage`` is picklable: the filesystem is not pickled but rebuilt lazily in the process
that uses it (DataLoader workers, other ranks), and credentials never appear in its repr or in
the errors it raises.
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from lakeckpt_tables.errors import StorageError
from lakeckpt_tables.io import options as opts
from lakeckpt_tables.io.failures import (
    TRANSIENT,
    classify,
    client_failure,
    retry_seconds,
    retrying,
    store_error,
)
from lakeckpt_tables.io.filesystems import build_filesystem, release_at_exit
from lakeckpt_tables.io.options import s3_settings

__all__ = ["Storage", "iceberg_storage", "s3_settings", "storage_from_cli"]

_CHUNK = 1 << 20
T = TypeVar("T")

class StoreAddress:
    """Where a store is and how it is reached: its root URI and storage options, the paths
    under it, the options in each client's dialect, and this process's filesystem for it.
    :class:`Storage` adds the operations."""

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
        self.retry_seconds = retry_seconds(self._options)
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

    def elsewhere(self, uri: str) -> Storage:
        """The store at ``uri`` with these options when it is in the same kind of store
        (same scheme), else with the environment's configuration."""
        other = Storage(uri)
        return Storage(uri, self._options) if other.scheme == self.scheme else other

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
        head, slash, tail = rest.partition("/")
        if "@" in head and self.scheme in opts.AZURE_SCHEMES:
            rest = head.split("@", 1)[0] + slash + tail  # container@account.dfs...: container
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
        fs = build_filesystem(self.scheme, self.uri, self._options)
        if isinstance(fs, pafs.S3FileSystem):
            release_at_exit(self)
        return fs

    def fsspec_client(self) -> Any:
        """This process's fsspec filesystem under :attr:`filesystem`; None when that is
        pyarrow's own (local disks, S3)."""
        fs = self.filesystem
        return fs.handler.fs if isinstance(fs, pafs.PyFileSystem) else None

    def fsspec_options(self) -> dict[str, Any]:
        """The options as fsspec keyword arguments (s3fs for S3, as given for other stores)."""
        return opts.fsspec_kwargs(self.scheme, self._options, self.uri)

    def delta_options(self) -> dict[str, str] | None:
        """The options for delta-rs, every setting explicit (no environment fallback)."""
        return opts.delta_kwargs(self.scheme, self._options, self.retry_seconds, self.uri)

    def iceberg_properties(self) -> dict[str, str]:
        """The options as pyiceberg FileIO properties; {} without options."""
        return {} if self._options is None else opts.iceberg_properties(
            self.scheme, self._options, self.uri)

    # ------------------------------------------------------------------------ operations


class Storage(StoreAddress):
    """A file system or object store rooted at ``uri``.

    Keys given to the methods are either relative to the root or absolute (a URI of the same
    store, or an absolute local path).

    Args:
        uri: root, a local path, ``file://``, ``s3://bucket/prefix`` or another fsspec URI.
        options: storage options (NOTE [ storage options ] in
            :mod:`lakeckpt_tables.io.options`); None for the environment's.

    Every operation is retried while the store fails transiently, for at most the retry
    budget (NOTE [ retry budget ] in :mod:`lakeckpt_tables.io.failures`), and fails with a
    :class:`~lakeckpt_tables.errors.StorageError` that names the URI and the kind.
    """

    @contextmanager
    def _errors(self, action: str, key: str) -> Iterator[None]:
        """Store failures as named errors (NOTE [ store failures ]); a missing file as
        FileNotFoundError, unless its bucket is what is missing."""
        try:
            yield
        except (StorageError, pa.ArrowInvalid):
            raise  # a named error already, or bad content (not Parquet): the caller names the file
        except Exception as exc:
            if not client_failure(exc):
                raise
            not_found = isinstance(exc, FileNotFoundError) or _not_found(exc) or (
                classify(exc) == "not found")
            if self.is_local and isinstance(exc, OSError):
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # named on every write path
                    raise store_error(self.url(key), action, exc, redact=self.redact,
                                      kind="store full") from exc
                raise  # a local file's own error (permissions, a directory): callers name it
            if not_found and not self._bucket_missing():
                if isinstance(exc, FileNotFoundError):
                    raise
                raise FileNotFoundError(2, "no such file", self.url(key)) from exc
            raise store_error(self.url(key), action, exc, redact=self.redact,
                              kind="bucket missing" if not_found else None) from exc

    def _bucket_missing(self) -> bool:
        """Whether the root's bucket is missing (asked once a file was not found)."""
        if self.is_local or self.scheme not in (*opts.S3_SCHEMES, *opts.GCS_SCHEMES,
                                                *opts.AZURE_SCHEMES):
            return False
        bucket = self._inner("").split("/", 1)[0]
        try:
            return bool(self.filesystem.get_file_info(bucket).type == pafs.FileType.NotFound)
        except Exception as exc:
            if not client_failure(exc):
                raise
            return False

    def call(self, action: str, key: str, fn: Callable[[], T], *,
             budget: float | None = None) -> T:
        """``fn()`` under the store's error naming and retry budget (``budget`` seconds
        instead, if given)."""
        def attempt() -> T:
            with self._errors(action, key):
                return fn()
        if self.is_local:
            return attempt()
        return retrying(attempt, budget=self.retry_seconds if budget is None else budget,
                        uri=self.url(key), action=action,
                        redact=self.redact,
                        transient=lambda e: isinstance(e, StorageError)
                        and e.kind in TRANSIENT)

    def redact(self, text: str) -> str:
        """``text`` with every credential of the options replaced by ``***``."""
        for secret in opts.secrets(self.scheme, self._options):
            text = text.replace(secret, "***")
        return text

    def read_bytes(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        """Bytes ``[start, start + length)`` of a file (to its end when ``length`` is None).

        Raises:
            FileNotFoundError: no such file.
            StorageError: the store failed.
        """
        def read() -> bytes:
            if start == 0 and length is None:
                with self.filesystem.open_input_stream(self._inner(key)) as stream:
                    data: bytes = stream.read()
                    return data
            with self.filesystem.open_input_file(self._inner(key)) as handle:
                out: bytes = handle.read_at(handle.size() - start if length is None else length,
                                            start)
                return out
        return self.call("read", key, read)

    def open_parquet(self, key: str, *,
                     metadata: pq.FileMetaData | None = None) -> pq.ParquetFile:
        """A Parquet file whose row group reads are coalesced ranged requests.

        ``metadata`` (a cached footer) saves the footer read. Opening costs one HEAD request
        on S3 (pyarrow's binding takes no known size), once per file and reader.
        """
        def open_() -> pq.ParquetFile:
            handle = self.filesystem.open_input_file(self._inner(key))
            # INT96 (Spark's timestamps) as microseconds, the one timestamp unit of every
            # reader: pyarrow's nanosecond default overflows past 2262.
            return _ParquetFile(handle, metadata=metadata, pre_buffer=not self.is_local,
                                coerce_int96_timestamp_unit="us",
                                call=lambda fn: self.call("read", key, fn),
                                errors=lambda: self._errors("read", key))
        return self.call("open", key, open_)

    def list(self, key: str = "") -> list[str]:
        """Names directly under ``key`` (files and directories), sorted; [] when absent."""
        def list_() -> list[str]:
            base = self._inner(key).rstrip("/")
            infos = self.filesystem.get_file_info(pafs.FileSelector(base, allow_not_found=True))
            # direct children only: some fsspec stores (adlfs) list deeper than asked
            return sorted({info.path[len(base):].lstrip("/").split("/", 1)[0]
                           if info.path.startswith(base) else info.base_name
                           for info in infos})
        return self.call("list", key, list_)

    def files(self, key: str) -> list[str]:
        """Every file at or under ``key``, by its path relative to ``key``, sorted: ``[""]``
        when ``key`` is a file, [] when absent."""
        def files_() -> list[str]:
            inner = self._inner(key)
            info = self.filesystem.get_file_info(inner)
            if info.type == pafs.FileType.File:
                return [""]
            if info.type != pafs.FileType.Directory:
                return []
            selector = pafs.FileSelector(inner, recursive=True, allow_not_found=True)
            base = inner.rstrip("/") + "/"
            return sorted(i.path.removeprefix(base) for i in
                          self.filesystem.get_file_info(selector)
                          if i.type == pafs.FileType.File)
        return self.call("list", key, files_)

    def exists(self, key: str) -> bool:
        """Whether a file or directory (a non-empty prefix, on object stores) is at ``key``."""
        return self.call("look up", key, lambda: bool(
            self.filesystem.get_file_info(self._inner(key)).type != pafs.FileType.NotFound))

    def size(self, key: str) -> int:
        """Size of a file in bytes.

        Raises:
            FileNotFoundError: no such file.
        """
        def size_() -> int:
            info = self.filesystem.get_file_info(self._inner(key))
            if info.type == pafs.FileType.NotFound:
                raise FileNotFoundError(2, "no such file", self.url(key))
            return int(info.size)
        return self.call("look up", key, size_)

    def put(self, key: str, data: bytes) -> None:
        """Write a whole file atomically: readers see the old file, or all of ``data``.

        Local files are written aside and renamed; an object store PUT is atomic already
        (so a retried PUT is harmless).
        """
        def put_() -> None:
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
        self.call("write", key, put_)

    def delete(self, key: str, *, retry: bool = True) -> None:
        """Remove a file or a directory tree; nothing happens when it is absent.

        ``retry=False``: one try (a best-effort cleanup that gc repeats later)."""
        def delete_() -> None:
            path = self._inner(key)
            info = self.filesystem.get_file_info(path)
            if info.type == pafs.FileType.Directory:
                self.filesystem.delete_dir(path)
            elif info.type == pafs.FileType.File:
                self.filesystem.delete_file(path)
        self.call("delete", key, delete_, budget=None if retry else 0)

    def sha256(self, key: str) -> tuple[str, int]:
        """SHA-256 hex digest and size of a file, streamed.

        Raises:
            FileNotFoundError: no such file.
        """
        def digest_() -> tuple[str, int]:
            digest = hashlib.sha256()
            size = 0
            with self.filesystem.open_input_stream(self._inner(key)) as stream:
                while block := stream.read(_CHUNK):
                    digest.update(block)
                    size += len(block)
            return digest.hexdigest(), size
        return self.call("read", key, digest_)


class _ParquetFile(pq.ParquetFile):  # type: ignore[misc]
    """A Parquet file whose reads are retried and raise :class:`StorageError` when the store
    fails (``call`` is :meth:`Storage.call` for the file).

    Reads are thread-safe (NOTE [ prefetch ] in :mod:`lakeckpt_tables.io.prefetch`): a thread
    other than the opener's reads through its own ``ParquetFile`` over the same open handle
    (positional reads, thread-safe) and footer, so no request is repeated.
    """

    def __init__(self, source: Any, *, call: Any, errors: Any, **kwargs: Any) -> None:
        super().__init__(source, **kwargs)
        self._call = call
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

    def _retried(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``ParquetFile.<name>(*args, **kwargs)`` on this thread's file, retried."""
        def run() -> Any:
            clone = self._here()
            if clone is not None:
                return getattr(clone, name)(*args, **kwargs)
            return getattr(super(_ParquetFile, self), name)(*args, **kwargs)
        return self._call(run)

    def read_row_group(self, *args: Any, **kwargs: Any) -> Any:
        return self._retried("read_row_group", *args, **kwargs)

    def read_row_groups(self, *args: Any, **kwargs: Any) -> Any:
        return self._retried("read_row_groups", *args, **kwargs)

    def read(self, *args: Any, **kwargs: Any) -> Any:
        return self._retried("read", *args, **kwargs)

    def iter_batches(self, *args: Any, **kwargs: Any) -> Any:
        with self._store_errors():
            clone = self._here()
            yield from (clone.iter_batches(*args, **kwargs) if clone is not None
                        else super().iter_batches(*args, **kwargs))  # not retried: a stream


def _not_found(exc: BaseException) -> bool:
    text = str(exc)
    return "NoSuchKey" in text or "Path does not exist" in text or "NOT_FOUND" in text


def iceberg_storage(location: str, properties: Mapping[str, str]) -> Storage:
    """The store of an Iceberg table, from its FileIO properties (the catalog's and table's).

    ``s3.*`` properties configure S3 explicitly (NOTE [ storage options ]), ``gcs.*`` and
    ``adls.*`` ones GCS and Azure; a table without them is read with the environment's
    configuration, as pyiceberg's own FileIO would.
    """
    scheme = urlparse(location).scheme.lower()
    return Storage(location, opts.iceberg_store_options(scheme, properties))


def storage_from_cli(uri: str | os.PathLike[str], text: str | None = None) -> Storage:
    """The store of ``uri`` with the options of a ``--storage-options`` argument: a JSON
    object or ``@file.json``; with no text, the ``LAKECKPT_STORAGE_OPTIONS`` variable; the
    environment's configuration when neither is given.

    Raises:
        StorageOptionsError: the options cannot be parsed (no value is ever echoed).
    """
    return Storage(uri, opts.parse_storage_options(text))
