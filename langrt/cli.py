"""The `langrt` command. Server flags are generated from ServerArgs, so they cannot drift.

langrt launch [--model-path PATH] [--port 30000]     # the HTTP server
langrt router --worker-urls http://127.0.0.1:30001 http://127.0.0.1:30002 --port 30000
langrt generate "What is the capital of France?" --chat --max-new-tokens 32
langrt doctor                                        # versions, CPU path, kernels, caches
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Sequence

from langrt import envs
from langrt.errors import LangrtError
from langrt.server_args import ServerArgs


def add_server_args(parser: argparse.ArgumentParser) -> None:
    for f in dataclasses.fields(ServerArgs):
        flag = "--" + f.name.replace("_", "-")
        kind = _flag_type(f)
        if kind is bool:
            parser.add_argument(flag, action="store_true", help=f.metadata.get("help"))
        elif str(f.type).startswith("tuple"):  # a list of values: --lora-paths a=DIR b=DIR
            parser.add_argument(flag, nargs="*", default=list(f.default), help=f.metadata.get("help"))
        else:
            parser.add_argument(
                flag, type=kind, default=f.default, choices=f.metadata.get("choices"), help=f.metadata.get("help")
            )


def server_args_from(ns: argparse.Namespace) -> ServerArgs:
    values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(ServerArgs)}
    return ServerArgs(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def _flag_type(f: dataclasses.Field) -> type:
    annotation = str(f.type)
    for name, kind in (("bool", bool), ("int", int), ("float", float)):
        if annotation.startswith(name):
            return kind
    return str


def _generate(ns: argparse.Namespace) -> int:
    from langrt.engine import Engine

    args = server_args_from(ns)
    with Engine(**dataclasses.asdict(args)) as engine:
        prompt = ns.prompt
        if ns.chat:
            messages = [{"role": "user", "content": prompt}]
            prompt = engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out = engine.generate(prompt, {"max_new_tokens": ns.max_new_tokens, "temperature": ns.temperature})
    print(out["text"])
    return 0


def _launch(ns: argparse.Namespace) -> int:
    args = server_args_from(ns)
    if args.dp_size > 1:
        from langrt.router.replicas import launch_replicas

        return launch_replicas(args)
    from langrt.entrypoints.http_server import launch

    return launch(args)


def _router(ns: argparse.Namespace) -> int:
    from langrt.router.app import RouterArgs
    from langrt.router.server import launch
    from langrt.router.workers import HealthSettings

    health = HealthSettings(interval_s=ns.health_check_interval, failure_threshold=ns.health_failure_threshold)
    args = RouterArgs(
        tuple(ns.worker_urls),
        ns.policy,
        ns.host,
        ns.port,
        health,
        ns.max_attempts,
        log_level=ns.log_level,
        api_key=ns.api_key,
    )
    return launch(args)


def add_router_args(parser: argparse.ArgumentParser) -> None:
    from langrt.router.policies import POLICIES

    parser.add_argument(
        "--worker-urls", nargs="*", default=[], help="worker base URLs (more can be added with POST /add_worker?url=)"
    )
    parser.add_argument(
        "--policy",
        default="cache_aware",
        choices=POLICIES,
        help="cache_aware: longest prefix match unless the load is imbalanced",
    )
    parser.add_argument("--host", default="127.0.0.1", help="HTTP address to bind")
    parser.add_argument("--port", type=int, default=30000, help="HTTP port")
    parser.add_argument(
        "--health-check-interval", type=float, default=5.0, help="seconds between health checks of each worker"
    )
    parser.add_argument(
        "--health-failure-threshold",
        type=int,
        default=2,
        help="failed health checks in a row before a worker is taken out",
    )
    parser.add_argument(
        "--max-attempts", type=int, default=3, help="workers a request is tried on at most when they die"
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every route but /health (passed on to the workers)",
    )
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="langrt", description="langrt: a prefix-caching LLM runtime")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "launch",
        help="serve the native and OpenAI-compatible HTTP APIs",
        epilog=envs.help_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_server_args(serve)
    serve.set_defaults(handler=_launch)
    gen = commands.add_parser("generate", help="generate a completion offline (no server)")
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template as a user turn")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    add_server_args(gen)
    gen.set_defaults(handler=_generate)
    router = commands.add_parser("router", help="route requests over langrt workers (cache-aware by prefix)")
    add_router_args(router)
    router.set_defaults(handler=_router)
    doctor = commands.add_parser(
        "doctor", help="print the CPU path, kernels, versions and cache locations (for bug reports)"
    )
    doctor.set_defaults(handler=_doctor)
    return parser


def _doctor(ns: argparse.Namespace) -> int:
    from langrt.doctor import run

    return run()


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        return ns.handler(ns)
    except (ValueError, LangrtError) as e:  # bad input or settings: a message, not a traceback
        print(f"langrt: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
