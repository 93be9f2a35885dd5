"""Starting and killing the processes of ``lakeckpt chaos`` jobs.

Single-process jobs are forked from a server that imported torch and deltalake once (``fork``,
see :mod:`.job`) or started in a fresh interpreter (``exec``); torchrun jobs always start fresh.
Every job is its own process group, so a kill reaches its ranks too.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path

__all__ = ["Launcher", "Proc", "Stopped", "descendants"]


class Proc:
    """A job's process, started fresh or forked from the server; its own process group."""

    def __init__(self, proc: subprocess.Popen[bytes] | BaseProcess) -> None:
        self.proc = proc

    def wait(self, timeout: float) -> bool:
        """True when the process ended within ``timeout`` seconds."""
        if isinstance(self.proc, subprocess.Popen):
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        self.proc.join(timeout)
        return self.proc.exitcode is not None

    def kill(self) -> None:
        """SIGKILL the job's process group and its descendants' (torchrun's ranks each start a
        session of their own, so killing torchrun's group alone would orphan them)."""
        if self.proc.pid is None:
            return
        groups = [self.proc.pid, *descendants(self.proc.pid)]
        for pid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        self.wait(60.0)

    @property
    def returncode(self) -> int | None:
        if isinstance(self.proc, subprocess.Popen):
            return self.proc.returncode
        return self.proc.exitcode


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except OSError:
                continue
            found.extend(children)
            todo.extend(children)
    return found


class Stopped(Exception):
    """The campaign is stopping: no job starts any more."""


class Launcher:
    """Starts jobs: torchrun jobs always fresh; single-process ones forked or fresh."""

    def __init__(self, launch: str) -> None:
        self.server: ForkServerContext | None = None
        self.lock = threading.Lock()
        self.live: set[Proc] = set()
        self.stopped = False
        if launch == "fork":
            from lakeckpt_tables.tools.chaos.job import PRELOAD

            os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the server, as by fresh jobs
            self.server = multiprocessing.get_context("forkserver")
            self.server.set_forkserver_preload(list(PRELOAD))

    def start(self, args: list[str], *, nproc: int, crash: str | None, log: Path) -> Proc:
        """Start a job; its stdout and stderr (warnings, tracebacks) go to ``log``."""
        with self.lock:
            if self.stopped:
                raise Stopped
            self.live = {p for p in self.live if p.returncode is None}
            proc = self._start(args, nproc=nproc, crash=crash, log=log)
            self.live.add(proc)
            return proc

    def stop(self) -> None:
        """Kill every job still running: a trial cut short is run again by the next campaign,
        and no job of this one may write into its directory then."""
        with self.lock:
            self.stopped = True
            live = list(self.live)
        for proc in live:
            proc.kill()

    def _start(self, args: list[str], *, nproc: int, crash: str | None, log: Path) -> Proc:
        if nproc == 1 and self.server is not None:
            from lakeckpt_tables.tools.chaos.job import forked

            process = self.server.Process(target=forked, args=(args, crash, str(log)),
                                          daemon=False)
            process.start()  # under the lock: the server starts once, and this is not thread-safe
            return Proc(process)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        env.pop("LAKECKPT_CRASH_AT", None)
        if crash:
            env["LAKECKPT_CRASH_AT"] = crash
        module = ["-m", "lakeckpt_tables.tools.chaos.job"]
        if nproc == 1:
            cmd = [sys.executable, *module, *args]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={nproc}", "--max-restarts=0", *module, *args]
        with open(log, "ab") as output:
            return Proc(subprocess.Popen(cmd, env=env, stdout=output, stderr=output,
                                          start_new_session=True))
