"""``lakeckpt bench compare NEW.json [--baseline B]``: the regression guard of the figures.

A benchmark's ``--json`` report carries ``bench`` (which benchmark) and ``ratios``: every figure
as a ratio to its reference measured in the same run (library / raw read, library / plain
loader, 2 workers / 0 workers...), each higher-is-better. Ratios travel between machines where
rows/s do not, so a reference run's report, committed under ``baselines/<bench>.json``, guards
them: every ratio that fell more than ``--tolerance`` (10%) below the baseline is printed, and
the exit status is 1 when any fell.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["BASELINES", "TOLERANCE", "Change", "compare", "register", "run"]

BASELINES = Path(__file__).parent / "baselines"
TOLERANCE = 0.10


@dataclass(frozen=True)
class Change:
    """One ratio of the new report beside the baseline's."""

    name: str
    baseline: float | None
    new: float | None

    @property
    def change(self) -> float | None:
        """new / baseline - 1; None when either side lacks the ratio."""
        if self.baseline is None or self.new is None or self.baseline <= 0:
            return None
        return self.new / self.baseline - 1

    def fell(self, tolerance: float) -> bool:
        change = self.change
        return change is not None and change < -tolerance


def ratios_of(report: dict[str, Any], where: str) -> dict[str, float | None]:
    """The ``ratios`` of a ``--json`` report.

    Raises:
        SystemExit: the file is no benchmark report with ratios.
    """
    ratios = report.get("ratios")
    if not isinstance(ratios, dict) or not ratios:
        raise SystemExit(f"lakeckpt bench compare: {where} has no 'ratios'; compare the --json "
                         "report of `lakeckpt bench peers`, `read`, `tables` or `workers`")
    return {str(k): None if v is None else float(v) for k, v in ratios.items()}


def compare(new: dict[str, Any], baseline: dict[str, Any]) -> list[Change]:
    """Every ratio of either report, the baseline's order first."""
    ours, theirs = ratios_of(new, "the new report"), ratios_of(baseline, "the baseline")
    names = list(theirs) + [n for n in ours if n not in theirs]
    return [Change(n, theirs.get(n), ours.get(n)) for n in names]


def register(sub: Any) -> None:
    """Add ``compare`` to the ``bench`` subcommands."""
    parser = sub.add_parser("compare", help="ratios of a --json report against a baseline",
                            description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("report", metavar="NEW.json", help="a `lakeckpt bench ... --json` report")
    parser.add_argument("--baseline", metavar="B", default=None,
                        help="the report to compare against (default: the committed "
                        "baselines/<bench>.json of the report's benchmark)")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, metavar="F",
                        help=f"a fall larger than this fraction counts (default {TOLERANCE})")


def run(args: argparse.Namespace) -> int:
    """Print every ratio beside the baseline's; 1 when any fell more than the tolerance."""
    new = _load(Path(args.report))
    if args.baseline is None:
        bench = new.get("bench")
        if not bench:
            raise SystemExit(f"lakeckpt bench compare: {args.report} does not say which "
                             "benchmark made it ('bench'); name the baseline with --baseline")
        path = BASELINES / f"{bench}.json"
        if not path.exists():
            raise SystemExit(f"lakeckpt bench compare: no committed baseline for bench "
                             f"{bench!r} ({path}); name one with --baseline")
    else:
        path = Path(args.baseline)
    baseline = _load(path)
    if new.get("bench") != baseline.get("bench"):
        raise SystemExit(f"lakeckpt bench compare: {args.report} is a report of bench "
                         f"{new.get('bench')!r}, {path} of bench {baseline.get('bench')!r}; "
                         "compare reports of one benchmark")
    changes = compare(new, baseline)
    fell = [c for c in changes if c.fell(args.tolerance)]
    print(f"{args.report} against {path}")
    for key in ("shape", "machine"):
        if baseline.get(key) != new.get(key) and (baseline.get(key) or new.get(key)):
            print(f"  note: {key} differs: baseline {baseline.get(key)!r}, new {new.get(key)!r}")
    width = max(len(c.name) for c in changes)
    for c in changes:
        print(f"  {c.name.ljust(width)}  {_cell(c.baseline)} -> {_cell(c.new)}  "
              f"{_verdict(c, args.tolerance)}")
    if fell:
        print(f"{len(fell)} ratio(s) fell more than {args.tolerance:.0%}: "
              + "; ".join(f"{c.name} {c.baseline:.2f}x -> {c.new:.2f}x" for c in fell))
        return 1
    print(f"no ratio fell more than {args.tolerance:.0%}")
    return 0


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"lakeckpt bench compare: cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise SystemExit(f"lakeckpt bench compare: {path} is not a JSON object")
    return data


def _cell(value: float | None) -> str:
    return "    -" if value is None else f"{value:5.2f}x"


def _verdict(c: Change, tolerance: float) -> str:
    change = c.change
    if change is None:
        return "only in the baseline" if c.new is None else "new"
    return f"{change:+.0%}" + ("  FELL" if change < -tolerance else "")
