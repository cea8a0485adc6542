"""`langrt launch --dp-size N`: N replicas behind the router, in one command.

Each replica is a whole `langrt launch` (its own scheduler, KV pools and radix cache) started
as a child process on a private port of 127.0.0.1; the router (cache_aware) serves the public
host and port in this process. Whole servers rather than N scheduler pairs behind one
tokenizer manager: a replica is then exactly what the router sees in a cluster, its failure is
contained (it dies alone, and the router retries its requests elsewhere), and no part of the
single-server path changes. Replicas are not restarted: the launch exits (1) once none is left,
and an orchestrator restarts it, as it would a single server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import time
import urllib.request

from langrt.router.app import RouterArgs
from langrt.router.server import serve as serve_router
from langrt.router.workers import HealthSettings
from langrt.server_args import ServerArgs

STARTUP_TIMEOUT_S = 600.0  # a replica loads the model; big ones on slow disks take minutes
STOP_GRACE_S = 20.0
# Settings the launcher gives each replica itself rather than passing through.
_OWN = {"host", "port", "dp_size", "num_threads"}


def replica_flags(args: ServerArgs) -> list[str]:
    """The command-line flags that give a replica the launch's settings (non-defaults only)."""
    flags = []
    for f in dataclasses.fields(ServerArgs):
        value = getattr(args, f.name)
        if f.name in _OWN or value == f.default:
            continue
        flag = "--" + f.name.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    return flags


def replica_threads(args: ServerArgs) -> int:
    """Torch threads per model process (each tensor-parallel rank of each replica): the cores
    shared out, unless --num-threads says."""
    if args.num_threads:
        return args.num_threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // (args.dp_size * args.tp_size))


def _free_port(taken: set[int]) -> int:
    """A port of 127.0.0.1 that is free now and not in `taken`: the public port (the router
    binds it only once the replicas are up, so until then the system may hand it out) and the
    ports already given to other replicas."""
    import socket

    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in taken:
            return port


def _env(rank: int, tp_size: int = 1) -> dict[str, str]:
    """Replica `rank` gets the rank-th group of tp_size visible GPUs (one per tensor-parallel
    rank) when enough are listed; else all share."""
    env = dict(os.environ)
    devices = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if len(devices) >= (rank + 1) * tp_size:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices[rank * tp_size : (rank + 1) * tp_size])
    return env


class Replicas:
    def __init__(self, args: ServerArgs):
        self.processes: list[subprocess.Popen] = []
        self.urls: list[str] = []
        threads = str(replica_threads(args))
        taken = {args.port}
        for rank in range(args.dp_size):
            port = _free_port(taken)
            taken.add(port)
            command = [sys.executable, "-m", "langrt", "launch", "--host", "127.0.0.1", "--port", str(port)]
            command += ["--num-threads", threads, *replica_flags(args)]
            self.processes.append(subprocess.Popen(command, env=_env(rank, args.tp_size), preexec_fn=_die_with_parent))
            self.urls.append(f"http://127.0.0.1:{port}")

    def wait_healthy(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        waiting = set(range(len(self.urls)))
        while waiting:
            for rank in list(waiting):
                if self.processes[rank].poll() is not None:
                    raise RuntimeError(f"replica {rank} exited with {self.processes[rank].returncode} while starting")
                if _healthy(self.urls[rank]):
                    waiting.discard(rank)
            if time.monotonic() > deadline:
                raise TimeoutError(f"replicas {sorted(waiting)} were not healthy within {timeout_s:.0f} s")
            time.sleep(0.2)

    def alive(self) -> int:
        return sum(p.poll() is None for p in self.processes)

    def stop(self) -> None:
        for p in self.processes:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for p in self.processes:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _die_with_parent() -> None:
    """In the replica before exec (Linux): SIGTERM when the launcher dies, even by SIGKILL."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


async def _watch(replicas: Replicas, stop: asyncio.Event, lost: list[int]) -> None:
    while not stop.is_set():
        if replicas.alive() == 0:
            print("langrt: error: every replica has exited; shutting down", file=sys.stderr, flush=True)
            lost.append(1)
            stop.set()
        await asyncio.sleep(0.5)


async def _serve(args: ServerArgs, replicas: Replicas) -> int:
    health = HealthSettings(interval_s=1.0, timeout_s=5.0, failure_threshold=2)
    router_args = RouterArgs(
        tuple(replicas.urls),
        "cache_aware",
        args.host,
        args.port,
        health,
        log_level=args.log_level,
        api_key=args.api_key,
    )
    stop, lost = asyncio.Event(), []
    watcher = asyncio.create_task(_watch(replicas, stop, lost))
    code = await serve_router(router_args, stop=stop)
    watcher.cancel()
    return 1 if lost else code


def launch_replicas(args: ServerArgs) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the replicas while they start
    replicas = Replicas(args)
    try:
        replicas.wait_healthy()
        print(f"langrt: {args.dp_size} replicas ready at {', '.join(replicas.urls)}", flush=True)
        return asyncio.run(_serve(args, replicas))
    except (RuntimeError, TimeoutError) as e:
        print(f"langrt: error: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        replicas.stop()
