"""``lakeckpt bench checkpoint``: step-time overhead of sync and async saves, and of tracking."""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torchdata.stateful_dataloader import StatefulDataLoader

from lakeckpt_tables.reader.dataset import LakeDataset
from lakeckpt_tables.sources.delta import DeltaSource
from lakeckpt_tables.tools.bench._timing import (
    Progress,
    TimedManager,
    clock,
    no_dcp_warnings,
    quiet,
    train_step,
)

__all__ = ["MODES", "TRACKING_INTERVAL", "OverheadResult", "measure_overhead"]

TRACKING_INTERVAL = 500
"""Steps between checkpoints at which the tracking share is stated (a realistic interval)."""

MODES = ("none", "sync", "async")


@dataclass(frozen=True)
class OverheadResult:
    """Step time without checkpoints and with sync/async saves every ``every`` steps.

    Attributes:
        steps: training steps per block.
        every: steps between saves within a block (the first save after ``every // 2``).
        rounds: rounds; each runs one block of every mode, in rotating order.
        batch_size: rows per batch.
        workers: DataLoader workers.
        model_params: parameters of the MLP.
        checkpoint_bytes: DCP files of one checkpoint (model + Adam state).
        block_s: per mode, the wall time of its block in each round.
        block_cpu_s: per mode, the CPU time of this process (all its threads: the async
            writer's too; not the loader's worker processes) in its block in each round.
        save_s: per mode, every ``save()`` call (blocking part; for async the file write
            continues in the background).
        wait_s: async: the ``wait()`` ending each block (commit of the last save).
        capture_s: ``_capture_reader`` alone, repeated on the running loader.
    """

    steps: int
    every: int
    rounds: int
    batch_size: int
    workers: int
    model_params: int
    checkpoint_bytes: int
    block_s: dict[str, tuple[float, ...]]
    block_cpu_s: dict[str, tuple[float, ...]]
    save_s: dict[str, tuple[float, ...]]
    wait_s: tuple[float, ...]
    capture_s: tuple[float, ...]

    @property
    def step_ms(self) -> float:
        """Median step time without checkpoints."""
        return statistics.median(self.block_s["none"]) / self.steps * 1e3

    def overheads(self, mode: str, *, cpu: bool = False) -> tuple[float, ...]:
        """Per round: (block time of ``mode`` / block time without checkpoints) - 1."""
        blocks = self.block_cpu_s if cpu else self.block_s
        return tuple(m / n - 1 for m, n in zip(blocks[mode], blocks["none"], strict=True))

    def overhead(self, mode: str, *, cpu: bool = False) -> float:
        """Median over rounds of :meth:`overheads`."""
        return statistics.median(self.overheads(mode, cpu=cpu))

    @property
    def saves_per_block(self) -> int:
        return (self.steps - self.every // 2) // self.every + 1

    def cost_per_save_ms(self, mode: str) -> float:
        """Median over rounds of the block time ``mode`` adds per save, in ms."""
        return statistics.median(
            (m - n) / self.saves_per_block * 1e3
            for m, n in zip(self.block_s[mode], self.block_s["none"], strict=True))

    def overhead_at(self, mode: str, interval: int = TRACKING_INTERVAL) -> float:
        """:meth:`cost_per_save_ms` over the training time of ``interval`` steps."""
        return self.cost_per_save_ms(mode) / (interval * self.step_ms)

    @property
    def capture_ms(self) -> float:
        return statistics.median(self.capture_s) * 1e3

    def tracking_share(self, interval: int = TRACKING_INTERVAL) -> float:
        """Capture time over the training time of ``interval`` steps without checkpoints."""
        return self.capture_ms / (interval * self.step_ms)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(step_ms=self.step_ms, overhead={m: self.overhead(m) for m in MODES[1:]},
                   round_overheads={m: self.overheads(m) for m in MODES[1:]},
                   cpu_overhead={m: self.overhead(m, cpu=True) for m in MODES[1:]},
                   cost_per_save_ms={m: self.cost_per_save_ms(m) for m in MODES[1:]},
                   overhead_at_tracking_interval={m: self.overhead_at(m) for m in MODES[1:]},
                   mean_save_ms={m: statistics.fmean(self.save_s[m]) * 1e3 for m in MODES[1:]},
                   capture_ms=self.capture_ms,
                   tracking_share={str(TRACKING_INTERVAL): self.tracking_share(),
                                   str(self.every): self.tracking_share(self.every)})
        clean: dict[str, Any] = json.loads(json.dumps(out))  # plain JSON types: lists
        return clean


def _mlp(features: int) -> nn.Module:
    return nn.Sequential(nn.Linear(features, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(),
                         nn.Linear(512, 1))


def measure_overhead(
    table: str,
    root: str | Path,
    *,
    steps: int = 100,
    every: int = 50,
    rounds: int = 10,
    batch_size: int = 64,
    workers: int = 2,
    capture_repeats: int = 30,
    threads: int | None = 1,
    progress: Progress = quiet,
) -> OverheadResult:
    """Blocks of ``steps`` training steps: no checkpoints, sync saves, async saves.

    Blocks are short (two saves each) and many, in rotating order, so that bursts of load
    from other processes hit some rounds and not the median; each block's CPU time is kept
    alongside its wall time. One ``StatefulDataLoader`` over ``table`` feeds every block, so
    the reader is warm and equally far into its data for all modes; each mode that saves has
    its own manager and run. Saves happen at steps ``every // 2 + j * every`` of a block, so
    that an async save has at least ``every // 2`` steps to overlap with before the ``wait()``
    ending its block (counted in the block). Round 0 warms up (first saves, the loader's
    workers) and is not counted.

    ``threads`` sets torch's intra-op threads for the measurement (restored afterwards): one
    compute thread leaves the other cores to the loader's workers and the async writer, and
    keeps the CPU time of a step steady on a small shared machine (measured on 2 cores under a
    load average of 4: 5.4-6.0 ms per step with one thread, 4-58 ms with two). None keeps
    torch's setting.
    """
    if every < 2 or steps < every:
        raise ValueError(f"need 2 <= every <= steps, got every={every}, steps={steps}")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _measure_overhead(table, root, steps, every, rounds, batch_size, workers,
                                 capture_repeats, progress)
    finally:
        torch.set_num_threads(before)


def _measure_overhead(table: str, root: str | Path, steps: int, every: int, rounds: int,
                      batch_size: int, workers: int, capture_repeats: int,
                      progress: Progress) -> OverheadResult:

    torch.manual_seed(0)
    features = 64
    model = _mlp(features)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    dataset = LakeDataset(DeltaSource(table), columns=["x"], batch_size=batch_size, seed=0,
                          epochs=1000)
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=workers)
    managers = {
        "sync": TimedManager(Path(root) / "sync", "sync", keep_last=2),
        "async": TimedManager(Path(root) / "async", "async", keep_last=2, async_save=True),
    }
    block: dict[str, list[float]] = {m: [] for m in MODES}
    block_cpu: dict[str, list[float]] = {m: [] for m in MODES}
    save: dict[str, list[float]] = {m: [] for m in MODES[1:]}
    waits: list[float] = []
    step = 0
    with no_dcp_warnings():
        batches: Iterator[dict[str, torch.Tensor]] = iter(loader)

    def run_block(mode: str, n: int, counted: bool) -> tuple[float, float]:
        nonlocal step
        manager = managers.get(mode)
        gc.collect()
        t0, c0 = clock(), time.process_time()
        for i in range(1, n + 1):
            train_step(model, optimizer, next(batches)["x"], features, False)
            step += 1
            if manager is not None and i % every == every // 2:
                s0 = clock()
                manager.save(step, model=model, optimizer=optimizer, dataloader=loader)
                if counted:
                    save[mode].append(clock() - s0)
        if manager is not None and manager.async_save:
            w0 = clock()
            manager.wait()
            if counted:
                waits.append(clock() - w0)
        return clock() - t0, time.process_time() - c0

    with no_dcp_warnings():
        for mode in MODES:  # warm-up: loader workers, first DCP save of each manager
            run_block(mode, every, counted=False)
        for r in range(rounds):
            order = MODES[r % 3:] + MODES[: r % 3]
            for mode in order:
                wall, cpu = run_block(mode, steps, counted=True)
                block[mode].append(wall)
                block_cpu[mode].append(cpu)
            progress(f"overhead round {r + 1}/{rounds}: " + ", ".join(
                f"{m} {block[m][-1] / steps * 1e3:.1f} ms/step" for m in MODES))
        sync = managers["sync"]
        capture: list[float] = []
        for _ in range(capture_repeats):
            t0 = clock()
            sync.capture(loader)
            capture.append(clock() - t0)
        last = sync.checkpoints()[-1]
    params = sum(p.numel() for p in model.parameters())
    ckpt_bytes = sum(int(d["bytes"]) for d in last.manifest.values())
    return OverheadResult(steps, every, rounds, batch_size, workers, params, ckpt_bytes,
                          {m: tuple(v) for m, v in block.items()},
                          {m: tuple(v) for m, v in block_cpu.items()},
                          {m: tuple(v) for m, v in save.items()}, tuple(waits), tuple(capture))
