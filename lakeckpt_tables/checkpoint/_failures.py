"""What went wrong in a checkpoint write, said so that an operator knows what to do.

torch.distributed.checkpoint reports a failed write as ``CheckpointException``, a
``BaseException`` whose message is about the writer's bookkeeping ("unexpected pos 704 vs
598") while the cause (a full disk) sits in its per-rank ``failures``. These helpers dig the
cause out.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator

from torch.distributed.checkpoint.api import CheckpointException

from lakeckpt_tables.errors import StorageError

__all__ = ["WRITE_FAILURES", "describe_failure", "is_write_failure"]

WRITE_FAILURES: tuple[type[BaseException], ...] = (Exception, CheckpointException)
"""What a prepare catches: every ordinary error, and DCP's BaseException."""

_ERRNO_WORDS = {
    errno.ENOSPC: "the disk is full (ENOSPC)",
    errno.EDQUOT: "the disk quota is exceeded (EDQUOT)",
    errno.EACCES: "permission denied (EACCES)",
    errno.EROFS: "the file system is read-only (EROFS)",
    errno.EIO: "an I/O error (EIO)",
}


def _causes(exc: BaseException, depth: int = 0) -> Iterator[BaseException]:
    """The exception, what it chains, and the per-rank failures DCP wraps, depth first."""
    if depth > 8:
        return
    yield exc
    if isinstance(exc, CheckpointException):
        for failure in exc.failures.values():
            inner = failure[0] if isinstance(failure, tuple) else failure  # (exc, traceback)
            if isinstance(inner, BaseException):
                yield from _causes(inner, depth + 1)
    for chained in (exc.__cause__, exc.__context__):
        if chained is not None:
            yield from _causes(chained, depth + 1)


def is_write_failure(exc: BaseException) -> bool:
    """True if the failure is the storage's (an OSError anywhere in it, or DCP's)."""
    return any(isinstance(e, (OSError, CheckpointException)) for e in _causes(exc))


def describe_failure(exc: BaseException) -> str:
    """One line: the root cause in words when known (the store's own error, which names the
    URI and the kind of failure; ENOSPC...), then the exception."""
    for cause in _causes(exc):
        if isinstance(cause, StorageError):
            return str(cause)
    for cause in _causes(exc):
        if isinstance(cause, OSError) and cause.errno in _ERRNO_WORDS:
            where = f" writing {cause.filename}" if cause.filename else ""
            return f"{_ERRNO_WORDS[cause.errno]}{where} ({type(cause).__name__}: {cause})"
    for cause in _causes(exc):
        if isinstance(cause, OSError):
            return f"{type(cause).__name__}: {cause}"
    return f"{type(exc).__name__}: {exc}"
