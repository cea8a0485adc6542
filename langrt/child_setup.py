"""What every child process (scheduler, detokenizer, tensor-parallel rank, grammar checker) does
first. Standard library only: the children's modules import it, and processes/child.py, which
starts them, sits above them in the layer diagram (docs/architecture.md)."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import threading
import time


def exit_with_parent(parent_pid: int, ipc_directory: str | None = None) -> None:
    """Child process set-up: it must not outlive the process that started it (even one killed
    with -9, which cannot remove `ipc_directory` itself: the child does); Ctrl-C is the
    parent's to handle (it stops the children); SIGTERM exits cleanly."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        if ipc_directory is not None:
            shutil.rmtree(ipc_directory, ignore_errors=True)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def configure_logging(level: str, name: str) -> None:
    logging.basicConfig(level=level.upper(), format=f"[langrt {name}] %(message)s", stream=sys.stderr)
