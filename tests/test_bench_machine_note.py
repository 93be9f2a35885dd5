"""Every bench report names the pyarrow memory pool beside CPUs and load: a shuffled read's wall
time depends on it (docstring of ``machine_note`` in ``tools/bench/_common.py``), so two reports
taken under different pools must not read as a regression."""

from __future__ import annotations

import pyarrow as pa

from lakeckpt_tables.tools.bench._common import machine_note


def test_the_machine_note_names_cpus_load_and_the_memory_pool() -> None:
    note = machine_note()
    assert "CPUs, load average" in note
    assert note.endswith(f"pyarrow memory pool {pa.default_memory_pool().backend_name}")
