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
    "demo": ("lakeckpt_tables.cli.demo",
             "train from a synthetic Delta table, SIGKILL it, resume, prove exactly-once"),
    "bench": ("lakeckpt_tables.cli.bench", "measure reader, checkpoint and state figures"),
    "checkpoints": ("lakeckpt_tables.cli.checkpoints",
                    "list the committed checkpoints under a root"),
    "chaos": ("lakeckpt_tables.cli.chaos",
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
        return int(command.run(cmd_args) or 0)
    except LakeckptError as exc:
        print(f"lakeckpt {args.command}: error: {exc}", file=sys.stderr)
        return 2

if __name__ == "__main__":
    sys.exit(main())
