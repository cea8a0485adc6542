"""The HTTP server: `langrt launch`. An aiohttp app in the main process, in front of the
TokenizerManager and the scheduler and detokenizer processes."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time

from aiohttp import web

from langrt.builtin import BUILTIN_NAME
from langrt.entrypoints import dashboard_api, embeddings_api, lora_api, native_api, openai_api
from langrt.entrypoints.chat_templates import resolve_chat_template
from langrt.entrypoints.errors import auth_middleware, error_middleware
from langrt.mem.host_malloc import release_freed_memory
from langrt.processes.launcher import ChildProcesses
from langrt.server.tokenizer_manager import TokenizerManager
from langrt.model.hf_fallback_config import check_model_servable
from langrt.model.source import ModelSource
from langrt.tokenizer.loader import load_tokenizer
from langrt.server_args import ServerArgs

logger = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 2.0  # in-flight requests get this long to receive their abort status
FAILURE_GRACE_S = 1.0  # after a runtime process dies, /health reports 503 this long before exit


def create_app(manager: TokenizerManager, args: ServerArgs, model_path: str, tokenizer_path: str) -> web.Application:
    app = web.Application(
        middlewares=[error_middleware, auth_middleware(args.api_key)], client_max_size=args.max_request_bytes
    )
    app["manager"] = manager
    app["model_path"] = model_path
    app["tokenizer_path"] = tokenizer_path
    app["served_model_name"] = args.served_model_name or (args.model_path or BUILTIN_NAME)
    app["chat_template"] = resolve_chat_template(args.chat_template, manager.tokenizer)
    app["reasoning_parser"] = args.reasoning_parser
    app["max_request_bytes"] = args.max_request_bytes
    app["body_read_timeout"] = args.body_read_timeout
    app["started"] = int(time.time())
    native_api.add_routes(app)
    openai_api.add_routes(app)
    lora_api.add_routes(app)
    embeddings_api.add_routes(app)
    if not args.disable_dashboard:
        dashboard_api.add_routes(app)
    return app


async def serve(args: ServerArgs) -> int:
    """Run the server until SIGINT/SIGTERM (exit code 0) or a runtime process dies (1)."""
    source = ModelSource.resolve(args.model_path)
    check_model_servable(args)  # before any process starts: a refusal here is one clear line
    tokenizer_path = args.tokenizer_path or str(source.path)
    children = ChildProcesses.start(args)
    manager = None
    runner = None
    try:
        manager = TokenizerManager(args, load_tokenizer(tokenizer_path), children)
        release_freed_memory()  # what building the tokenizer left behind
        await manager.start()
        app = create_app(manager, args, str(source.path), tokenizer_path)
        # shutdown_timeout: aiohttp waits this long for open connections at cleanup (60 s by
        # default). In-flight requests already had SHUTDOWN_GRACE_S to get their abort status; a
        # connection opened after that (a health probe racing the exit) must not hold the
        # process, seen once in test_dead_scheduler_means_503_and_exit (a /health unanswered for 60 s).
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S)
        await runner.setup()
        await web.TCPSite(runner, args.host, args.port).start()
        print(f"langrt: serving {app['served_model_name']} at http://{args.host}:{args.port}", flush=True)
        return await _wait_for_end(manager)
    except (RuntimeError, TimeoutError, OSError) as e:
        print(f"langrt: error: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        if manager is not None:
            await manager.abort_all("the server is shutting down", SHUTDOWN_GRACE_S)
            await manager.close()
        if runner is not None:
            await runner.cleanup()
        children.stop()


async def _wait_for_end(manager: TokenizerManager) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set():
        if manager.failure is not None:
            print(f"langrt: error: {manager.failure}; shutting down", file=sys.stderr, flush=True)
            await asyncio.sleep(FAILURE_GRACE_S)
            return 1
        try:
            await asyncio.wait_for(stop.wait(), timeout=0.1)
        except asyncio.TimeoutError:
            pass
    return 0


def launch(args: ServerArgs) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="[langrt] %(message)s")
    return asyncio.run(serve(args))
