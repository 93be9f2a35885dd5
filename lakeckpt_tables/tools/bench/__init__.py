"""Benchmarks behind ``lakeckpt bench`` (:mod:`.cli`): one module per figure family.

Each figure is measured side by side with its reference in one run and reported as a ratio
where DESIGN.md states one, so the numbers mean the same on any machine.
"""
