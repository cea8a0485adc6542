"""Running the router: its aiohttp app, the health-check task, start and stop."""

from __future__ import annotations

import asyncio
import logging
import signal

import aiohttp
from aiohttp import web

from langrt.entrypoints.errors import auth_middleware
from langrt.router import app as handlers
from langrt.router.app import FORWARDER, GENERATION_PATHS, MAX_ATTEMPTS, SESSION, WORKERS, RouterArgs
from langrt.router.forward import Forwarder
from langrt.router.policies import make_policy
from langrt.router.workers import WorkerSet

# Generation may take minutes; only connecting is bounded (a worker that accepts no connection
# in this long is dead or hung, and the request goes elsewhere).
CONNECT_TIMEOUT_S = 10.0


def create_app(args: RouterArgs) -> web.Application:
    app = web.Application(client_max_size=args.max_request_bytes, middlewares=[auth_middleware(args.api_key)])
    app[WORKERS] = WorkerSet(list(args.worker_urls), make_policy(args.policy), args.health)
    app[MAX_ATTEMPTS] = args.max_attempts
    app.cleanup_ctx.append(_session_and_health_checks)
    for path in GENERATION_PATHS:
        app.router.add_post(path, handlers.generation)
    app.router.add_get("/health", handlers.health)
    app.router.add_get("/health_generate", handlers.health)
    app.router.add_get("/list_workers", handlers.list_workers)
    app.router.add_post("/add_worker", handlers.add_worker)
    app.router.add_post("/remove_worker", handlers.remove_worker)
    app.router.add_route("*", "/flush_cache", handlers.flush_cache)
    app.router.add_get("/get_server_info", handlers.server_info)
    app.router.add_get("/server_info", handlers.server_info)
    app.router.add_get("/metrics", handlers.metrics)
    app.router.add_route("*", "/{tail:.*}", handlers.any_worker)
    return app


async def _session_and_health_checks(app: web.Application):
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S)
    # No connection reuse limit per host: every request in flight holds one connection.
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, auto_decompress=False) as session:
        app[SESSION] = session
        app[FORWARDER] = Forwarder(app[WORKERS], session, app[MAX_ATTEMPTS])
        workers = app[WORKERS]
        await asyncio.gather(*(workers.check(session, w) for w in workers.all))
        task = asyncio.create_task(workers.check_forever(session))
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def serve(args: RouterArgs, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None) -> int:
    """Run until SIGINT/SIGTERM (or `stop` is set); 0 then, 1 if the port cannot be bound."""
    app = create_app(args)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, args.host, args.port).start()
    except OSError as e:
        print(f"langrt router: error: cannot listen on {args.host}:{args.port}: {e}", flush=True)
        await runner.cleanup()
        return 1
    workers = ", ".join(w.url for w in app[WORKERS].all) or "none yet"
    print(f"langrt router: {args.policy} at http://{args.host}:{args.port} over {workers}", flush=True)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
    return 0


def launch(args: RouterArgs) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="[langrt router] %(message)s")
    return asyncio.run(serve(args))
