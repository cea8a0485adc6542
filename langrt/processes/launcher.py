"""Starting, watching and stopping the scheduler and detokenizer processes.

Each child is a fresh interpreter running `python -m langrt.processes.child ROLE`, its arguments
pickled over stdin. Not multiprocessing's spawn: that re-imports the parent's `__main__` in the
child, which re-runs a script's top level (an `Engine()` there starts children of its own) and
fails outright for `python -`, `python -c` and notebooks.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from langrt.ipc import Endpoints
from langrt.server_args import ServerArgs

logger = logging.getLogger(__name__)

# The directory holding the `langrt` package: the child finds the same langrt as the parent,
# installed or not.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


class ChildProcess:
    """A child interpreter running one role's entry point of `langrt.processes.child`."""

    def __init__(self, role: str, name: str, payload: object, *extra: str):
        self.name = name
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "langrt.processes.child", role, *extra], stdin=subprocess.PIPE, env=env
        )
        try:
            self.process.stdin.write(pickle.dumps(payload, protocol=5))
            self.process.stdin.close()
        except BrokenPipeError:  # it died at once; dead() reports it with its exit code
            pass

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def exitcode(self) -> int | None:
        return self.process.poll()

    def is_alive(self) -> bool:
        return self.process.poll() is None

    def terminate(self) -> None:
        if self.is_alive():
            self.process.terminate()

    def kill(self) -> None:
        if self.is_alive():
            self.process.kill()

    def join(self, timeout_s: float | None = None) -> None:
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass


@dataclass
class ChildProcesses:
    endpoints: Endpoints
    scheduler: ChildProcess | None = None
    detokenizer: ChildProcess | None = None
    tp_workers: list[ChildProcess] = field(default_factory=list)  # ranks 1.. of --tp-size

    @classmethod
    def start(cls, args: ServerArgs) -> "ChildProcesses":
        children = cls(Endpoints.create())
        payload = (args, children.endpoints, os.getpid())
        try:
            children.scheduler = ChildProcess("scheduler", "langrt-scheduler", payload)
            children.detokenizer = ChildProcess("detokenizer", "langrt-detokenizer", payload)
            for rank in range(1, args.tp_size):
                children.tp_workers.append(ChildProcess("tp-worker", f"langrt-tp-rank-{rank}", payload, str(rank)))
        except BaseException:  # e.g. no interpreter to start: leave no process or ipc directory behind
            children.stop()
            raise
        return children

    @property
    def processes(self) -> list[ChildProcess]:
        return [p for p in (self.scheduler, self.detokenizer, *self.tp_workers) if p is not None]

    def dead(self) -> list[str]:
        """Names (and exit codes) of children that have exited."""
        return [f"{p.name} (exit code {p.exitcode})" for p in self.processes if not p.is_alive()]

    def stop(self, timeout_s: float = 3.0) -> None:
        """Terminate the children and remove the ipc directory."""
        for p in self.processes:
            p.terminate()
        for p in self.processes:
            p.join(timeout_s)
            if p.is_alive():
                p.kill()
                p.join(1.0)
        self.endpoints.remove()
