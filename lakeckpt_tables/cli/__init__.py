"""The ``lakeckpt`` command: one module per subcommand, each with ``register`` and ``run``.

Subcommand modules are imported lazily so ``lakeckpt --help`` stays fast and a broken optional
dependency only affects its own command.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from lakeckpt_tables.errors import LakeckptError

__all__ = ["main"]

# name -> (module, one-line help)
_COMMANDS = {
    "demo": ("lakeckpt_tables.tools.demo.cli",
             "train from a synthetic Delta table, SIGKILL it, resume, prove exactly-once"),
    "bench": ("lakeckpt_tables.tools.bench.cli", "measure reader, checkpoint and state figures"),
    "checkpoints": ("lakeckpt_tables.cli.checkpoints",
                    "list the committed checkpoints under a root"),
    "progress": ("lakeckpt_tables.cli.progress",
                 "rows consumed per run and pass, with rate, ETA and state"),
    "audit": ("lakeckpt_tables.cli.audit",
              "which rows trained a checkpoint, who read a file, who saw a row"),
    "verify": ("lakeckpt_tables.cli.verify",
               "prove exactly-once from the ledger; exit 1 naming the first violation"),
    "sql": ("lakeckpt_tables.cli.sql", "run a SQL query over the ledger's views (DuckDB)"),
    "runs": ("lakeckpt_tables.cli.runs", "list the runs registered in a catalog: running, "
             "stale (stopped saving without finishing), finished or failed"),
    "tag": ("lakeckpt_tables.cli.tag", "label a committed checkpoint"),
    "gc": ("lakeckpt_tables.cli.gc", "remove model files no retained checkpoint names"),
    "maintain": ("lakeckpt_tables.cli.maintain", "compact the ledger"),
    "report": ("lakeckpt_tables.cli.report",
               "write a self-contained HTML report: progress plot, runs, checkpoints, events"),
    "chaos": ("lakeckpt_tables.tools.chaos.campaign",
              "attack a scratch run (kills, bit flips, concurrent jobs) and count what breaks"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lakeckpt`` console script.

    Expected failures (the library's named errors, a store or catalog that cannot be reached,
    a file that cannot be written) end in one line on stderr, credentials removed, and exit
    status 2; a bug still shows its traceback.
    """
    parser = argparse.ArgumentParser(prog="lakeckpt", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in _COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    args, rest = parser.parse_known_args(argv)
    module_name, help_text = _COMMANDS[args.command]
    command = importlib.import_module(module_name)
    cmd_parser = argparse.ArgumentParser(prog=f"lakeckpt {args.command}", description=help_text)
    command.register(cmd_parser)
    cmd_args = cmd_parser.parse_args(rest)
    try:
        status = int(command.run(cmd_args) or 0)
        sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not at exit
        return status
    except BrokenPipeError:
        # the reader of our output went away (`| head`): not an error, and no traceback when
        # Python flushes stdout at exit
        _silence_stdout()
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        named = _named(exc, cmd_args)
        if named is None:
            raise
        from lakeckpt_tables.cli._options import redact, secrets_of

        print(f"lakeckpt {args.command}: error: {redact(named, secrets_of(cmd_args))}",
              file=sys.stderr)
        return 2


# modules whose exceptions are expected failures of a store, a catalog or a query
_EXPECTED = ("deltalake", "pyiceberg", "sqlalchemy", "duckdb", "pyarrow", "botocore", "s3fs",
             "fsspec", "aiobotocore", "psycopg")


def _named(exc: Exception, args: argparse.Namespace) -> str | None:
    """The one line an expected failure is told in; None for a bug (it keeps its traceback)."""
    if _ledger_scan_failed(exc):
        from lakeckpt_tables.audit.target import damage_error

        return str(damage_error(getattr(args, "target", None), exc))
    module = type(exc).__module__.lstrip("_").split(".")[0]
    if isinstance(exc, LakeckptError):
        text = " ".join(str(exc).split())
    elif isinstance(exc, OSError) or module in _EXPECTED:
        text = f"{type(exc).__name__}: {_summary(str(exc))}"
    else:
        return None
    if len(text) > 600:
        text = text[:600] + " [...]"
    hint = _hint(exc, args)
    return f"{hint}: {text}" if hint.startswith("no storage") else text + hint


def _summary(text: str) -> str:
    """A store client's message on one line: its first causes (delta-rs chains them with
    '↳'), the S3 error code of an XML body instead of the body."""
    import re

    code = re.search(r"<Code>([^<]+)</Code>", text)
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", re.sub(r"<\?xml.*", "", text, flags=re.S))
    causes = [" ".join(c.split()).rstrip(" .") for c in text.split("↳") if c.strip()]
    out = ": ".join(causes[:3])
    return f"{out} (S3 error {code.group(1)})" if code else out


def _hint(exc: Exception, args: argparse.Namespace) -> str:
    """How to pass storage options, when a store failed and none were given."""
    from lakeckpt_tables.cli._options import ENV_STORAGE_OPTIONS, remote, storage_options
    from lakeckpt_tables.errors import (
        AuditError,
        LedgerCorruptError,
        LedgerError,
        StorageError,
        StorageOptionsError,
    )

    target = getattr(args, "target", None)
    if isinstance(exc, AuditError | LedgerCorruptError | StorageOptionsError) or \
            not remote(target):
        return ""
    if not isinstance(exc, StorageError | LedgerError | OSError) and \
            type(exc).__module__.split(".")[0] not in ("deltalake", "botocore", "s3fs"):
        return ""
    try:
        given = storage_options(args) is not None
    except LakeckptError:
        given = True
    if given:
        return ". Check the endpoint, bucket and credentials of the storage options"
    return (f"no storage options given for {target}, which is on an object store: pass "
            f"--storage-options JSON (or @FILE.json), or set {ENV_STORAGE_OPTIONS}")


def _ledger_scan_failed(exc: Exception) -> bool:
    """A DuckDB query failed reading the lazily scanned ledger (a damaged page)."""
    return type(exc).__module__.lstrip("_").startswith("duckdb") and \
        "registered as 'ledger' failed" in str(exc)


def _silence_stdout() -> None:
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())

if __name__ == "__main__":
    sys.exit(main())
