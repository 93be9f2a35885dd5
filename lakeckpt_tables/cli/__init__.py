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
                 "rows consumed per run and pass, with rate and ETA"),
    "audit": ("lakeckpt_tables.cli.audit",
              "which rows trained a checkpoint, who read a file, who saw a row"),
    "verify": ("lakeckpt_tables.cli.verify",
               "prove exactly-once from the ledger; exit 1 naming the first violation"),
    "sql": ("lakeckpt_tables.cli.sql", "run a SQL query over the ledger's views (DuckDB)"),
    "runs": ("lakeckpt_tables.cli.runs", "list the runs registered in a catalog"),
    "tag": ("lakeckpt_tables.cli.tag", "label a committed checkpoint"),
    "gc": ("lakeckpt_tables.cli.gc", "remove model files no retained checkpoint names"),
    "maintain": ("lakeckpt_tables.cli.maintain", "compact the ledger"),
    "report": ("lakeckpt_tables.cli.report",
               "write a self-contained HTML report: progress plot, runs, checkpoints, events"),
    "chaos": ("lakeckpt_tables.tools.chaos.campaign",
              "attack a scratch run (kills, bit flips, concurrent jobs) and count what breaks"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lakeckpt`` console script."""
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
    except LakeckptError as exc:
        print(f"lakeckpt {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader of our output went away (`| head`): not an error, and no traceback when
        # Python flushes stdout at exit
        _silence_stdout()
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if not _ledger_scan_failed(exc):
            raise
        from lakeckpt_tables.audit._target import damage_error

        named = damage_error(getattr(cmd_args, "target", None), exc)
        print(f"lakeckpt {args.command}: error: {named}", file=sys.stderr)
        return 2


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
