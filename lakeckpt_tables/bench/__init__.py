"""Benchmarks behind ``lakeckpt bench``: one module per figure family (``read`` first).

Each figure is measured side by side with its reference in one run and reported as a ratio
where DESIGN.md states one, so the numbers mean the same on any machine.
"""

from lakeckpt_tables.bench.data import SyntheticTable, ensure_synthetic_table
from lakeckpt_tables.bench.read import Figure, ReadBenchReport, format_report, run_read_bench

__all__ = [
    "Figure",
    "ReadBenchReport",
    "SyntheticTable",
    "ensure_synthetic_table",
    "format_report",
    "run_read_bench",
]
