"""Prefix extraction by tracing: run a program's body without a backend up to its first
operation that needs the runtime, to learn the text it starts with. `run_batch` prefills the
prefix shared by all its programs once, before fanning out, so each of them finds it cached."""

from __future__ import annotations

import os

from langrt_frontend import ir
from langrt_frontend.executor import Executor
from langrt_frontend.params import GenParams

_TRACED_ITEMS = 8  # enough programs to find what they share; the rest just hit the cache


class _StopTrace(BaseException):
    """Raised where the traced program needs the runtime. A BaseException, so that a program's
    own `except Exception` does not swallow it."""


class _TracingExecutor(Executor):
    """Runs constant nodes (text, roles, scopes) at once, on the caller's thread."""

    _CONSTANT = (ir.Text, ir.ExprList, ir.RoleBegin, ir.RoleEnd, ir.VarScopeBegin, ir.VarScopeEnd)

    def __init__(self, template):
        super().__init__(None, GenParams(), template=template, start=False)
        for node_type in list(self.handlers):
            if node_type not in self._CONSTANT:
                self.handlers[node_type] = self._stop

    def _stop(self, node) -> None:
        raise _StopTrace

    def submit(self, node: ir.Expr) -> None:
        self.run(node)

    def sync(self) -> None:
        pass

    def end(self) -> None:
        pass

    def get(self, name, with_meta=False):
        raise _StopTrace

    def fork(self, n):
        raise _StopTrace


def traced_prefix(function, template, args: tuple, kwargs: dict) -> str:
    """The text a program has built when it first needs the runtime ('' if its body fails)."""
    from langrt_frontend.state import ProgramState

    executor = _TracingExecutor(template)
    state = ProgramState(executor)
    try:
        function.func(state, *args, **{**function.bind_arguments, **kwargs})
    except _StopTrace:
        pass
    except Exception:  # noqa: BLE001 - the real run reports it; tracing only looks for a prefix
        return ""
    return executor.text


def shared_prefix(function, template, calls: list[tuple[tuple, dict]]) -> str:
    """The longest text prefix the first few programs of a batch all start with."""
    return os.path.commonprefix([traced_prefix(function, template, a, kw) for a, kw in calls[:_TRACED_ITEMS]])
