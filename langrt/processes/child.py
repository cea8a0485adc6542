"""What every child process does first, and the children's entry point:
`python -m langrt.processes.child scheduler|detokenizer|tp-worker [RANK]`, with (ServerArgs, Endpoints, parent
pid) pickled on stdin (`processes.ChildProcess` starts it).

The entry points import their process's modules only inside the child, so the parent (the HTTP
server) never imports torch.
"""

from __future__ import annotations

import logging
import os
import pickle
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


def scheduler_main(args, endpoints, parent_pid: int) -> None:
    from langrt.scheduler.scheduler_process import run_scheduler_process

    run_scheduler_process(args, endpoints, parent_pid)


def detokenizer_main(args, endpoints, parent_pid: int) -> None:
    from langrt.detokenizer.detokenizer_process import run_detokenizer_process

    run_detokenizer_process(args, endpoints, parent_pid)


def tp_worker_main(args, endpoints, parent_pid: int, rank: str) -> None:
    from langrt.parallel.worker import run_worker_process

    run_worker_process(args, endpoints, parent_pid, int(rank))


ROLES = {"scheduler": scheduler_main, "detokenizer": detokenizer_main, "tp-worker": tp_worker_main}


def main() -> None:
    role = ROLES[sys.argv[1]]
    args, endpoints, parent_pid = pickle.loads(sys.stdin.buffer.read())
    role(args, endpoints, parent_pid, *sys.argv[2:])


if __name__ == "__main__":
    main()
