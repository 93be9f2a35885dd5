"""Checksums of what a checkpoint wrote, and their verification on restore."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["checksum_files", "verify_manifest"]

Manifest = dict[str, dict[str, int | str]]
_CHUNK = 1 << 20


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def checksum_files(directory: str, names: Iterable[str]) -> Manifest:
    """``{name: {"sha256": ..., "bytes": ...}}`` for files under ``directory``."""
    out: Manifest = {}
    for name in sorted(names):
        path = os.path.join(directory, name)
        out[name] = {"sha256": _sha256(path), "bytes": os.path.getsize(path)}
    return out


def verify_manifest(directory: str, manifest: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Problems found (missing, resized or altered files); empty when the checkpoint verifies."""
    problems = []
    for name, expected in sorted(manifest.items()):
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            problems.append(f"{path} is missing")
        elif os.path.getsize(path) != expected["bytes"]:
            problems.append(f"{path} has {os.path.getsize(path)} bytes, "
                            f"{expected['bytes']} were written")
        elif _sha256(path) != expected["sha256"]:
            problems.append(f"{path} does not match its sha256 {expected['sha256']}")
    return problems
