"""The children's entry point:
`python -m langrt.processes.child scheduler|detokenizer|tp-worker [RANK]`, with (ServerArgs, Endpoints, parent
pid) pickled on stdin (`processes.ChildProcess` starts it).

The entry points import their process's modules only inside the child, so the parent (the HTTP
server) never imports torch. What every child does first is in langrt/child_setup.py, which the
children's modules import without importing this launcher (it sits above them).
"""

from __future__ import annotations

import pickle
import sys


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
