"""The faults ``lakeckpt chaos`` injects into a run, and the repair a named error asks for."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

__all__ = ["damage", "flip_bits", "repair_ledger"]


def repair_ledger(root: Path, damaged: str | None) -> None:
    """The way out LedgerCorruptError names: move the file it blames (``damaged``, its
    ``file``) and any file pyarrow cannot read aside, then repair the log. A flipped bit in a
    footer's schema can leave a file pyarrow reads but the ledger cannot: only the error
    names that one."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    ledger = root / "_ledger"
    for path in ledger.glob("*.parquet"):
        if str(path) != damaged:
            try:
                pq.read_table(path, page_checksum_verification=True)
                continue
            except Exception:
                pass
        path.rename(root / f"aside-{path.name}")
    DeltaTable(str(ledger)).repair()


def flip_bits(path: Path, rng: random.Random, flips: int) -> None:
    """Flip ``flips`` random bits of the file at ``path``."""
    data = bytearray(path.read_bytes())
    for _ in range(flips):
        k = rng.randrange(len(data))
        data[k] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def damage(scenario: str, rng: random.Random, root: Path, newest: Any) -> str:
    """Damage the newest checkpoint as ``scenario`` says; what was done, in words."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if scenario == "model-bitflip":
        files = sorted(p for p in (root / newest.model_location).iterdir() if p.is_file())
        target = rng.choice(files)
        flip_bits(target, rng, rng.randint(1, 4))
        return f"bits flipped in {target.name}"
    if scenario == "ledger-bitflip":
        files = sorted((root / "_ledger").glob("*.parquet"))
        target = rng.choice(files)
        flip_bits(target, rng, rng.randint(1, 8))
        return f"bits flipped in ledger file {files.index(target)}"
    # tampered-state: a validly written file whose newest reader state says otherwise
    for path in (root / "_ledger").glob("*.parquet"):
        rows = pq.read_table(path)
        ids = rows["checkpoint_id"].to_pylist()
        kinds = rows["record"].to_pylist()
        states = rows["reader_state"].to_pylist()
        changed = False
        for k, (cid, kind) in enumerate(zip(ids, kinds, strict=True)):
            if cid == newest.checkpoint_id and kind == "checkpoint" and states[k]:
                text = states[k]
                i = rng.randrange(len(text))
                states[k] = text[:i] + ("A" if text[i] != "A" else "B") + text[i + 1:]
                changed = True
        if changed:
            col = rows.schema.get_field_index("reader_state")
            pq.write_table(rows.set_column(col, rows.schema.field(col),
                                           pa.array(states, pa.string())), path)
            return f"reader state of step {newest.step} rewritten"
    return "nothing to damage"
