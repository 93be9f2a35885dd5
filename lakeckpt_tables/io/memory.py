"""The memory pool of the ledger commit's large, short-lived Arrow buffers.

NOTE [ commit memory ]
pyarrow's default pool (mimalloc in its wheels) returns a freed block of several MB to the
operating system soon after, so every save faulted in afresh the tens of MB its commit builds
(columns of 262,000-523,000 consumption rows, their Parquet pages): at 256 ranks x 8 workers
that was a quarter of rank 0's commit. glibc's allocator keeps such blocks for reuse. The
ledger passes :data:`COMMIT_POOL` to the pyarrow calls of a commit that take a pool; the
process's default pool, which the user may have chosen, is left as it is.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

__all__ = ["COMMIT_POOL"]

COMMIT_POOL: Final = pa.system_memory_pool()
"""The pool of a commit's buffers (NOTE [ commit memory ])."""
