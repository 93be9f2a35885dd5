"""How the command line reaches object storage: ``--storage-options`` and its variable.

One set of storage options serves the ledger, the model files and the Delta source tables, as
``CheckpointManager(storage_options=)`` and ``DeltaSource(storage_options=)`` take them
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``s3.endpoint``... see the README). Given, they are
the whole configuration (no ``AWS_*`` variable is read); not given, the store is configured
from the environment as its client usually is. Their values never appear in any output: errors
about them say where they came from and what is wrong, never what they hold.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Mapping
from typing import Any

from lakeckpt_tables.errors import StorageOptionsError
from lakeckpt_tables.io import OPTIONS_ENV, parse_storage_options

__all__ = ["ENV_STORAGE_OPTIONS", "add_source_catalog", "add_storage_options", "redact",
           "secrets_of", "source_catalog", "storage_options"]

ENV_STORAGE_OPTIONS = OPTIONS_ENV
"""The environment variable read when ``--storage-options`` is not given (same syntax)."""

STORAGE_HELP = (
    "options of the store holding the ledger, checkpoints and Delta source tables: a JSON "
    'object (\'{"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ACCESS_KEY_ID": "...", '
    '"AWS_SECRET_ACCESS_KEY": "..."}\') or @FILE.json holding one; default: the variable '
    f"{ENV_STORAGE_OPTIONS} (same syntax), else the environment's configuration. Values are "
    "never printed")


def add_storage_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--storage-options", default=None, metavar="JSON|@FILE",
                        help=STORAGE_HELP)


def add_source_catalog(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source-catalog", default=None, metavar="NAME|URI",
                        help="pyiceberg catalog (name or SQLAlchemy URI) holding the runs' "
                        "Iceberg source tables, when it is neither the one the ledger records "
                        "for them nor the ledger's (default: search those, then the lakeckpt "
                        "catalog)")


def storage_options(args: argparse.Namespace) -> dict[str, str] | None:
    """The options ``--storage-options`` or ``$LAKECKPT_STORAGE_OPTIONS`` give; None for none.

    Raises:
        StorageOptionsError: not a JSON object of scalars, or its file cannot be read (the
            message names where the options came from, never their values).
    """
    return parse_storage_options(getattr(args, "storage_options", None))


_URI_PASSWORD = re.compile(r"(://[^/\s:@]*:)[^@\s/]+@")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` without credentials (``secrets``, passwords of URIs) and terminal codes."""
    text = _ANSI.sub("", text)
    for secret in sorted(set(secrets), key=len, reverse=True):
        if len(secret) >= 4:
            text = text.replace(secret, "***")
    return _URI_PASSWORD.sub(r"\1***@", text)


def secrets_of(args: argparse.Namespace) -> list[str]:
    """Every credential the command was given: storage option values that are secrets (all
    values of keys naming a key, secret, token, password...), passwords of catalog URIs."""
    out: list[str] = []
    try:
        options = storage_options(args)
    except StorageOptionsError:
        options = None
    if options:
        out += _secret_values(options)
    for name in ("catalog", "source_catalog"):
        value = getattr(args, name, None)
        if isinstance(value, str):
            match = re.search(r"://[^/\s:@]*:([^@\s/]+)@", value)
            if match:
                out.append(match.group(1))
    return out


def _secret_values(options: Mapping[str, str]) -> list[str]:
    from lakeckpt_tables.io import s3_settings

    s3 = s3_settings(options)
    values = [s3[k] for k in ("key", "secret", "token") if k in s3]
    values += [v for k, v in options.items()
               if any(w in k.lower() for w in ("secret", "token", "key", "password",
                                               "credential", "sas", "connection"))]
    return values


def remote(target: Any) -> bool:
    """Whether ``target`` names an object store (``s3://``, ``gs://``...), not a local path."""
    if not isinstance(target, str):
        return False
    text = target.removeprefix("delta:")
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.lower() not in ("file", "")


def source_catalog(args: argparse.Namespace) -> str | None:
    """``--source-catalog``, checked now: a catalog that cannot be loaded is an error even when
    no run turns out to need it (a typo is not silently ignored)."""
    value: str | None = getattr(args, "source_catalog", None)
    if value is not None:
        from lakeckpt_tables.audit.registry import load_catalog

        load_catalog(value)
    return value
