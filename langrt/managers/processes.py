"""Starting, watching and stopping the scheduler and detokenizer processes."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
from dataclasses import dataclass

from langrt.ipc import Endpoints
from langrt.managers.child import detokenizer_main, scheduler_main
from langrt.server_args import ServerArgs

logger = logging.getLogger(__name__)


@dataclass
class ChildProcesses:
    endpoints: Endpoints
    scheduler: mp.Process
    detokenizer: mp.Process

    @classmethod
    def start(cls, args: ServerArgs) -> "ChildProcesses":
        # spawn, not fork: the children start clean (no inherited threads, sockets or CUDA state).
        ctx = mp.get_context("spawn")
        endpoints = Endpoints.create()
        parent = os.getpid()
        scheduler = ctx.Process(
            target=scheduler_main, args=(args, endpoints, parent), name="langrt-scheduler", daemon=True
        )
        detokenizer = ctx.Process(
            target=detokenizer_main, args=(args, endpoints, parent), name="langrt-detokenizer", daemon=True
        )
        children = cls(endpoints, scheduler, detokenizer)
        try:
            scheduler.start()
            detokenizer.start()
        except BaseException:  # e.g. spawn refused: leave no process or ipc directory behind
            children.stop()
            raise
        return children

    @property
    def processes(self) -> list[mp.Process]:
        return [self.scheduler, self.detokenizer]

    def dead(self) -> list[str]:
        """Names (and exit codes) of children that have exited."""
        return [f"{p.name} (exit code {p.exitcode})" for p in self.processes if not p.is_alive()]

    def stop(self, timeout_s: float = 3.0) -> None:
        """Terminate both children and remove the ipc directory."""
        started = [p for p in self.processes if p.pid is not None]
        for p in started:
            if p.is_alive():
                p.terminate()
        for p in started:
            p.join(timeout_s)
            if p.is_alive():
                p.kill()
                p.join(1.0)
        self.endpoints.remove()
