"""The checkpoint root as a store: model files, checksums, retention and gc, on any URI.

A ``CheckpointManager`` keeps every checkpoint under ``<root>/<location>``; this module is all
it does with the root. Model files go through torch.distributed.checkpoint's fsspec writer and
reader (local paths, ``s3://`` through s3fs, ``gs://``, ``abfs://``... given the same storage
options); checksums, listings and deletions through :class:`~lakeckpt_tables.io.Storage`.

NOTE [ one root for all ranks ]
Ranks on different nodes must see the same root: a per-node local directory lets every rank's
save "succeed" while no node holds a whole checkpoint. :meth:`CheckpointStorage.prove_shared`
makes rank 0 write a nonce that every rank must read back before the first checkpoint can be
committed; :meth:`CheckpointStorage.check_visible` makes every rank check, before any rank
loads, that it sees every file of the checkpoint it is about to restore.
"""

from __future__ import annotations

import builtins
import logging
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypeVar

from lakeckpt_tables.errors import StorageError, StorageRootNotSharedError
from lakeckpt_tables.io.storage import Storage

__all__ = ["CheckpointStorage"]

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

    def __init__(self, root: str, options: Mapping[str, str] | None = None) -> None:
        self.store = Storage(root, options)

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

        return FsspecReader(self.url(location), **self.fsspec_options())

    def ledger_options(self) -> dict[str, str] | None:
        """Storage options for a Delta ledger under this root (delta-rs keys, all explicit)."""
        return self.store.delta_options()

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
            self.store.delete(location)
        except StorageError as exc:
            log.warning("could not remove %s (gc removes it later): %s",
                        self.url(location), exc)

    def checksums(self, location: str, names: Iterable[str]) -> Manifest:
        """``{name: {"sha256": ..., "bytes": ...}}`` for files under ``location``."""
        out: Manifest = {}
        for name in sorted(names):
            digest, size = self.store.sha256(f"{location}/{name}")
            out[name] = {"sha256": digest, "bytes": size}
        return out

    def verify(self, location: str, manifest: Mapping[str, Mapping[str, Any]]
               ) -> builtins.list[str]:
        """Problems found (missing, resized or altered files); empty when all verify."""
        problems = []
        for name, expected in sorted(manifest.items()):
            key = f"{location}/{name}"
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
        failed = ""
        if world.rank == 0:
            try:
                self.store.put(key, nonce.encode())
            except StorageError as exc:
                failed = str(exc)
        failed = world.broadcast(failed)  # a collective: also the barrier before reading
        if failed:
            raise StorageError(f"run {run_id}: nothing was saved: {failed}")
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
                   if not self.store.exists(f"{location}/{name}")]
        views = world.gather((missing, self.root))
        blind = [(rank, root, names) for rank, (names, root) in enumerate(views) if names]
        if blind:
            detail = "; ".join(f"rank {rank} under {root} misses {names[:3]}"
                               f"{'...' if len(names) > 3 else ''}"
                               for rank, root, names in blind)
            raise StorageRootNotSharedError(
                f"run {run_id}: checkpoint step {step} ({location}) cannot be restored: {detail}."
                " Every rank must see the same checkpoint root; no rank loaded anything.")
