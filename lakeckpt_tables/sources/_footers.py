"""Parquet footers: read concurrently, cached by file path.

Data files of Delta and Iceberg tables are immutable once committed, so a footer read for one
snapshot stays valid for every later snapshot that still holds the file. Caching by path (and
size, as a cheap guard) makes re-resolving a table, or following it, cost only the new files.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow.fs as pafs
import pyarrow.parquet as pq

__all__ = ["FileFooter", "open_parquet", "read_footers"]

_MAX_THREADS = 16
_CACHE_LIMIT = 200_000


@dataclass(frozen=True, slots=True)
class FileFooter:
    """Row group sizes and column names of one Parquet data file."""

    path: str
    row_group_rows: tuple[int, ...]
    column_names: tuple[str, ...]

    @property
    def rows(self) -> int:
        return sum(self.row_group_rows)


_cache: dict[tuple[str, int | None], FileFooter] = {}
_cache_lock = threading.Lock()


def open_parquet(path: str) -> pq.ParquetFile:
    """Open a data file given as a local path or a URI pyarrow understands (file://, s3://, ...)."""
    if "://" in path:
        fs, inner = pafs.FileSystem.from_uri(path)
        return pq.ParquetFile(fs.open_input_file(inner))
    return pq.ParquetFile(path)


def _read_footer(path: str) -> FileFooter:
    try:
        meta = open_parquet(path).metadata
    except FileNotFoundError as exc:  # pyarrow leaves ``filename`` unset: callers name the file
        raise FileNotFoundError(errno.ENOENT, "no such data file", path) from exc
    rows = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
    names = tuple(meta.schema.to_arrow_schema().names)
    return FileFooter(path, rows, names)


def _cached(path: str, size: int | None) -> FileFooter:
    key = (path, size)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    footer = _read_footer(path)
    with _cache_lock:
        if len(_cache) >= _CACHE_LIMIT:
            _cache.clear()
        _cache[key] = footer
    return footer


def read_footers(paths: Sequence[str], sizes: Sequence[int | None]) -> list[FileFooter]:
    """Footers of ``paths`` in the same order, read on a thread pool, served from cache.

    Raises:
        FileNotFoundError: a file is missing; callers turn it into a named error.
    """
    if not paths:
        return []
    threads = min(_MAX_THREADS, len(paths))
    if threads == 1:
        return [_cached(p, s) for p, s in zip(paths, sizes, strict=True)]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(_cached, paths, sizes))
