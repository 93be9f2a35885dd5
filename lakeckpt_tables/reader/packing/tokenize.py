"""Text tokenized as it is read: ``pack_tokens`` over a string column with a Hugging Face
``tokenizers.Tokenizer``.

NOTE [ text tokenized on the fly ]
A row group's documents are tokenized when the row group is read (in the DataLoader worker
that reads it, on the read-ahead threads: ``encode_batch`` runs in Rust, outside the GIL) and
packed exactly as a token column's would be: the reader sees a list<int64> column of the
same rows. So everything a packing reader guarantees holds unchanged (lockstep by sequences,
a position per slice, exact resume): they rest on the token plan, which needs the stream
size of every row group before the pass starts.

Those sizes are what a Parquet footer gives a token column for free; text must be tokenized
once to know them. So they are computed once per (table, version, column, tokenizer) and kept
in a cache directory (``token_cache=``, by default ``$LAKECKPT_HOME/token-counts``, else
``~/.lakeckpt/token-counts``), one JSON file per key holding each row group's tokens and
whether the eos id occurs in its documents: a resume, another rank, a second run over the same
snapshot read the file and tokenize nothing to plan. A file whose row groups are not the
snapshot's is not used (computed again).

The tokenizer's identity is a hash of its serialized form (``Tokenizer.to_str()``): it is part
of the reader's configuration, so a state resumes only into a reader with the same tokenizer
(another one is refused by name), and it keys the cache. Documents are encoded without the
tokenizer's own special tokens (``add_special_tokens=False``): the packer appends ``eos_id``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from lakeckpt_tables.errors import PackingError
from lakeckpt_tables.types import Unit

__all__ = ["TextTokens", "default_cache", "text_stream_sizes"]


class TextTokens:
    """A tokenizer as a packing reader uses it: documents (a string array) to a list<int64>
    array of their token ids, and its identity.

    Raises:
        PackingError: ``tokenizer`` is not a ``tokenizers.Tokenizer``.
    """

    def __init__(self, tokenizer: Any) -> None:
        if not callable(getattr(tokenizer, "encode_batch", None)) or not callable(
                getattr(tokenizer, "to_str", None)):
            raise PackingError(f"tokenizer={tokenizer!r}: pass a tokenizers.Tokenizer (the "
                               "Hugging Face tokenizers package), e.g. "
                               "Tokenizer.from_file('tokenizer.json')")
        self.tokenizer = tokenizer
        self.identity = hashlib.sha256(tokenizer.to_str().encode()).hexdigest()[:32]
        self.encoded_rows = 0  # rows this process tokenized (the cache spares planning's)

    def encode(self, texts: pa.Array | pa.ChunkedArray, where: str) -> pa.ListArray:
        """Each document's token ids, as a list<int64> array of the same rows.

        Raises:
            PackingError: a null document.
        """
        if texts.null_count:
            raise PackingError(f"{where}: {texts.null_count} null document(s) in the text "
                               "column: a null has no tokens; fill or filter them")
        docs = texts.to_pylist()
        # the ids only: encode_batch_fast (tokenizers >= 0.21) tracks no character offsets
        encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        encodings = encode(docs, add_special_tokens=False)
        self.encoded_rows += len(docs)
        ids = [e.ids for e in encodings]
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64,
                             count=int(offsets[-1]))
        return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers get the tokenizer as JSON
        return {"json": self.tokenizer.to_str(), "identity": self.identity}

    def __setstate__(self, state: dict[str, Any]) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_str(state["json"])
        self.identity, self.encoded_rows = state["identity"], 0


def default_cache() -> str:
    """``$LAKECKPT_HOME/token-counts``, else ``~/.lakeckpt/token-counts``."""
    home = os.environ.get("LAKECKPT_HOME") or os.path.join(os.path.expanduser("~"), ".lakeckpt")
    return os.path.join(home, "token-counts")


def text_stream_sizes(reader: Any, units: Sequence[Unit], column: str, text: TextTokens,
                      eos_id: int, *, cache: str, key: dict[str, Any], where: str
                      ) -> tuple[list[int], list[bool]]:
    """Each unit's stream elements (tokens + one eos per row) and whether its documents are
    free of ``eos_id``: from the cache file of ``key`` when it names these units, else by
    tokenizing every unit once and writing the file (NOTE [ text tokenized on the fly ])."""
    path = Path(cache) / (hashlib.sha256(json.dumps(
        {**key, "column": column, "tokenizer": text.identity, "eos_id": eos_id},
        sort_keys=True).encode()).hexdigest()[:40] + ".json")
    names = [[u.path, u.row_group, u.rows] for u in units]
    try:
        kept = json.loads(path.read_text())
        if kept["units"] == names:
            return [t + u.rows for t, u in zip(kept["tokens"], units, strict=True)], \
                [not e for e in kept["eos"]]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or not these units: computed again
    tokens, eos = [], []
    for unit in units:
        ids = text.encode(reader.read(unit, [column]).column(column), where)
        tokens.append(len(ids.values))
        eos.append(bool(len(ids.values)) and bool(np.any(ids.values.to_numpy() == eos_id)))
    _write(path, {"key": key, "tokenizer": text.identity, "column": column, "units": names,
                  "tokens": tokens, "eos": eos})
    return [t + u.rows for t, u in zip(tokens, units, strict=True)], [not e for e in eos]


def _write(path: Path, value: dict[str, Any]) -> None:
    """Write the file whole or not at all (another rank may write the same one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as out:
        json.dump(value, out)
    os.replace(tmp, path)
