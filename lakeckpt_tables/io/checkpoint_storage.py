"""The checkpoint root as a store: model files, checksums, retention and gc, on any URI.

A ``CheckpointManager`` keeps every checkpoint under ``<root>/<location>``; this module is all
it does with the root. Model files go through torch.distributed.checkpoint's fsspec writer and
reader (local paths, ``s3://`` through s3fs, ``gs://``, ``abfs://``... given the same storage
options); checksums, listings and deletions through :class:`~lakeckpt_tables.io.Storage`.

NOTE [ model files on object stores ]
DCP's fsspec writer makes the checkpoint "directory" first, and s3fs's ``makedirs`` *creates
the bucket* whenever its HEAD of the bucket fails: during a 503 storm a save tried
CreateBucket ("location-constraint is not valid"). Object stores have no directories, so on
them the writer's file system (:class:`_ObjectStoreFiles`) makes none, and nothing here ever
creates a bucket. Each file is spooled (in memory up to 64 MB, then on local disk) and uploaded
in one retried step, so a store that fails for a while is retried within the retry budget
(NOTE [ retry budget ] in :mod:`lakeckpt_tables.io.failures`) and then named.

NOTE [ one root for all ranks ]
Ranks on different nodes must see the same root: a per-node local directory lets every rank's
save "succeed" while no node holds a whole checkpoint. :meth:`CheckpointStorage.prove_shared`
makes rank 0 write a nonce that every rank must read back when the manager is created, before
any training step; :meth:`CheckpointStorage.check_visible` makes every rank check, before any rank
loads, that it sees every file of the checkpoint it is about to restore.
"""

from __future__ import annotations

import builtins
import io
import logging
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from torch.distributed.checkpoint._fsspec_filesystem import FileSystem as _DcpFileSystem

from lakeckpt_tables.errors import StorageError, StorageRootNotSharedError
from lakeckpt_tables.io.failures import client_failure, retrying, store_error
from lakeckpt_tables.io.storage import Storage

__all__ = ["CheckpointStorage", "member"]

log = logging.getLogger(__name__)

Manifest = dict[str, dict[str, int | str]]
T = TypeVar("T")

_NONCE_DIR = "_nodes"


class _World(Protocol):
    rank: int
    size: int

    def gather(self, value: T) -> list[T]: ...

    def broadcast(self, value: T) -> T: ...

    def barrier(self) -> None: ...


class CheckpointStorage:
    """A checkpoint root and its storage options.

    Args:
        root: local path or URI (``s3://bucket/prefix``, ``gs://...``, ``abfs://...``).
        options: storage options (NOTE [ storage options ] in :mod:`lakeckpt_tables.io.storage`);
            None for the environment's configuration.
    """

    def __init__(self, root: str | Storage, options: Mapping[str, str] | None = None) -> None:
        self.store = root if isinstance(root, Storage) else Storage(root, options)

    def __repr__(self) -> str:
        return f"CheckpointStorage({self.store!r})"

    @property
    def root(self) -> str:
        return self.store.uri

    def url(self, location: str) -> str:
        """Where the checkpoint at ``location`` (relative to the root) lives."""
        return self.store.url(location)

    # -------------------------------------------------------------------- model files

    def fsspec_options(self) -> dict[str, Any]:
        """Keyword arguments for DCP's ``FsspecWriter`` / ``FsspecReader``."""
        return self.store.fsspec_options()

    def reader(self, location: str) -> Any:
        """A torch.distributed.checkpoint storage reader of the checkpoint at ``location``."""
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return self._guarded(FsspecReader(self.url(location), **self.fsspec_options()))

    def writer(self, location: str, factory: Callable[..., T], *args: Any) -> T:
        """``factory(url, *args, **fsspec options)``, a DCP fsspec writer of the checkpoint at
        ``location``, made safe on object stores (NOTE [ model files on object stores ])."""
        return self._guarded(factory(self.url(location), *args, **self.fsspec_options()))

    def _guarded(self, dcp: T) -> T:
        if not self.store.is_local:
            files = _ObjectStoreFiles(self.store)
            # this process's client of the store (gcsfs's core class, NOTE [ backing ]) or,
            # on S3, the s3fs DCP built from the same options
            files.fs = self.store.fsspec_client() or dcp.fs.fs  # type: ignore[attr-defined]
            dcp.fs = files  # type: ignore[attr-defined]
        return dcp

    # ----------------------------------------------------------- files, checksums, retention

    def list(self, location: str) -> list[str]:
        """Names directly under ``location``, sorted; [] when it is absent."""
        return self.store.list(location)

    def exists(self, location: str) -> bool:
        return self.store.exists(location)

    def delete(self, location: str) -> None:
        """Remove a checkpoint's files, best effort: a failure is logged, and what is left
        is an orphan no ledger names, which a later :meth:`CheckpointManager.gc` removes."""
        try:
            self.store.delete(location, retry=False)
        except StorageError as exc:
            log.warning("could not remove %s (gc removes it later): %s",
                        self.url(location), exc)

    def files(self, location: str) -> builtins.list[str]:
        """The files of a checkpoint at ``location`` (a trainer's directory or single file) by
        their path relative to it, sorted: ``[""]`` for a file itself, ``[]`` when absent."""
        return self.store.files(location)

    def checksums(self, location: str, names: Iterable[str]) -> Manifest:
        """``{name: {"sha256": ..., "bytes": ...}}`` for files under ``location`` (the name
        ``""`` is ``location`` itself, a checkpoint that is one file)."""
        out: Manifest = {}
        for name in sorted(names):
            digest, size = self.store.sha256(member(location, name))
            out[name] = {"sha256": digest, "bytes": size}
        return out

    def verify(self, location: str, manifest: Mapping[str, Mapping[str, Any]]
               ) -> builtins.list[str]:
        """Problems found (missing, resized or altered files); empty when all verify."""
        problems = []
        for name, expected in sorted(manifest.items()):
            key = member(location, name)
            path = self.url(key)
            try:
                digest, size = self.store.sha256(key)
            except FileNotFoundError:
                problems.append(f"{path} is missing")
                continue
            if size != expected["bytes"]:
                problems.append(f"{path} has {size} bytes, {expected['bytes']} were written")
            elif digest != expected["sha256"]:
                problems.append(f"{path} does not match its sha256 {expected['sha256']}")
        return problems

    # ------------------------------------------------------------------ several nodes

    def prove_shared(self, world: _World, run_id: str) -> None:
        """Collective: every rank reads back a nonce rank 0 wrote under the root.

        Raises:
            StorageRootNotSharedError: some rank does not see it (on every rank).
            StorageError: the root cannot be written or read.
        """
        nonce = world.broadcast(uuid.uuid4().hex)
        key = f"{_NONCE_DIR}/{run_id}-{nonce}"  # outside the run's directory, which gc sweeps
        failed: StorageError | None = None
        if world.rank == 0:
            try:
                self.store.put(key, nonce.encode())
            except StorageError as exc:
                failed = exc
        failed = world.broadcast(failed)  # a collective: also the barrier before reading
        if failed is not None:
            raise failed
        seen, problem = False, ""
        try:
            seen = self.store.read_bytes(key).decode() == nonce
        except FileNotFoundError:
            pass
        except StorageError as exc:
            problem = str(exc)
        views = world.gather((seen, self.root, problem))
        world.barrier()
        if world.rank == 0:
            self.store.delete(key)
        blind = [(rank, root, problem) for rank, (ok, root, problem) in enumerate(views)
                 if not ok]
        if blind:
            detail = "; ".join(f"rank {rank} (root {root}){': ' + problem if problem else ''}"
                               for rank, root, problem in blind)
            raise StorageRootNotSharedError(
                f"run {run_id}: ranks do not share the checkpoint root {views[0][1]}: a file "
                f"rank 0 wrote there is not visible to {detail}. Per-node local directories "
                "cannot hold a multi-node checkpoint: use a shared file system or an object "
                "store (s3://, gs://, abfs://) with storage_options. Nothing was saved.")

    def check_visible(self, world: _World, run_id: str, step: int, location: str,
                      manifest: Mapping[str, Any]) -> None:
        """Collective: every rank sees every file of the checkpoint at ``location``.

        Raises:
            StorageRootNotSharedError: some rank misses files (raised on every rank, before
                any rank loads anything).
        """
        missing = [name for name in sorted(manifest)
                   if not self.store.exists(member(location, name))]
        views = world.gather((missing, self.root))
        blind = [(rank, root, names) for rank, (names, root) in enumerate(views) if names]
        if blind:
            detail = "; ".join(f"rank {rank} under {root} misses {names[:3]}"
                               f"{'...' if len(names) > 3 else ''}"
                               for rank, root, names in blind)
            raise StorageRootNotSharedError(
                f"run {run_id}: checkpoint step {step} ({location}) cannot be restored: {detail}."
                " Every rank must see the same checkpoint root; no rank loaded anything.")


def member(location: str, name: str) -> str:
    """The key of file ``name`` of the checkpoint at ``location``; ``""`` names the checkpoint
    itself when it is one file (a Lightning ``.ckpt``)."""
    return f"{location}/{name}" if name else location


class _Spool(tempfile.SpooledTemporaryFile):  # type: ignore[type-arg]
    """A file being written: in memory up to 64 MB, then on local disk. Without a file
    descriptor to give, as an object store's stream (DCP then syncs as it does for those)."""

    def __init__(self) -> None:
        super().__init__(max_size=64 << 20)

    def fileno(self) -> int:
        raise io.UnsupportedOperation("an object store file has no descriptor")

    def close(self) -> None:
        """Nothing: DCP's stream wrappers close the stream they were given, and the upload
        reads it after that (:meth:`discard` frees it)."""

    def discard(self) -> None:
        super().close()


class _ObjectStoreFiles(_DcpFileSystem):
    """DCP's fsspec file system on an object store: no directories, retried uploads
    (NOTE [ model files on object stores ])."""

    def __init__(self, store: Storage) -> None:
        super().__init__()
        self._store = store

    @property
    def _files(self) -> Any:
        assert self.fs is not None  # set by the DCP writer or reader it serves
        return self.fs

    def _retrying(self, action: str, path: Any, call: Callable[[], T]) -> T:
        url = str(path)
        try:
            return retrying(call, budget=self._store.retry_seconds, uri=url, action=action,
                            redact=self._store.redact)
        except Exception as exc:
            if isinstance(exc, FileNotFoundError) or not client_failure(exc):
                raise
            raise store_error(url, action, exc, redact=self._store.redact) from exc

    def mkdir(self, path: Any) -> None:
        """Nothing: an object store has no directories (and never create a bucket)."""

    @contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        if not any(ch in mode for ch in "wa+"):
            with self._retrying("read", path, lambda: self._files.open(path, mode)) as stream:
                yield stream
            return
        spool = _Spool()
        try:
            yield spool

            def upload() -> None:
                spool.seek(0)
                with self._files.open(path, "wb") as out:
                    shutil.copyfileobj(spool, out, 8 << 20)
            self._retrying("write", path, upload)
        finally:
            spool.discard()

    def exists(self, path: Any) -> bool:
        return self._retrying("look up", path, lambda: bool(self._files.exists(path)))

    def rename(self, path: Any, new_path: Any) -> None:
        """A copy, then a delete: what a rename is on an object store (gcsfs first tried a
        move API that emulators lack, and logged its fallback)."""
        self._retrying("write", new_path, lambda: self._files.copy(path, new_path))
        self._retrying("delete", path, lambda: self._files.rm(path))
