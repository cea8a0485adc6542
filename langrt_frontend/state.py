"""`ProgramState` (what a program's `s` is) and `ForkedStates` (what `s.fork(n)` returns),
docs/programs.md, run and forks. A state is a thin handle on an `Executor`; reads wait for the queued work."""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from typing import Any, Iterator

from langrt_frontend import ir
from langrt_frontend.executor import Executor


class ProgramState:
    def __init__(self, executor: Executor):
        self.executor = executor
        self.ret_value: Any = None

    # ---- adding to the program ----------------------------------------------------------------

    def __iadd__(self, other) -> "ProgramState":
        self.executor.submit(ir.as_expr(other))
        return self

    def _role(self, role: str, expr=None):
        if expr is not None:
            self.executor.submit(ir.ExprList((ir.RoleBegin(role), ir.as_expr(expr), ir.RoleEnd(role))))
            return None
        return self._role_scope(role)

    @contextmanager
    def _role_scope(self, role: str):
        self.executor.submit(ir.RoleBegin(role))
        yield self
        self.executor.submit(ir.RoleEnd(role))

    def system(self, expr=None):
        """`s.system("...")` appends a system message; `with s.system():` wraps what is added."""
        return self._role("system", expr)

    def user(self, expr=None):
        return self._role("user", expr)

    def assistant(self, expr=None):
        return self._role("assistant", expr)

    @contextmanager
    def var_scope(self, name: str):
        """The text added inside the block becomes variable `name`."""
        self.executor.submit(ir.VarScopeBegin(name))
        yield self
        self.executor.submit(ir.VarScopeEnd(name))

    # ---- reading ------------------------------------------------------------------------------

    def __getitem__(self, name: str):
        return self.executor.get(name)

    def get_var(self, name: str):
        return self.executor.get(name)

    def __setitem__(self, name: str, value) -> None:
        self.executor.set(name, value)

    def set_var(self, name: str, value) -> None:
        self.executor.set(name, value)

    def __contains__(self, name: str) -> bool:
        try:
            self.executor.get(name)
        except KeyError:
            return False
        return True

    def get_meta_info(self, name: str):
        """Meta info of the gen/select that set `name` (None if it has none)."""
        try:
            return self.executor.get(name, with_meta=True)[1]
        except KeyError:
            return None

    def text(self) -> str:
        self.executor.sync()
        return self.executor.text

    def messages(self) -> list[dict]:
        self.executor.sync()
        with self.executor.lock:
            return [dict(m) for m in self.executor.messages]

    def sync(self) -> "ProgramState":
        self.executor.sync()
        return self

    def report(self, path):
        """Write this run's report to `path` (HTML): its requests on a timeline, their cached and
        generated tokens, and the prefixes they share (langrt_frontend/report.py)."""
        from langrt_frontend.report import write_report

        return write_report(self, path)

    def error(self) -> Exception | None:
        """The exception that stopped this state's execution, or None."""
        self.executor.sync()
        return self.executor.error

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """With stream=True, text (or `var_name`) increments as they are generated; otherwise the
        final value once. The increments concatenate to text() / s[var_name]."""
        if self.executor.stream:
            yield from self.executor.increments(var_name)
        else:
            yield self.text() if var_name is None else self[var_name]

    async def text_async_iter(self, var_name: str | None = None, return_meta_data: bool = False):
        """`text_iter` for asyncio; with return_meta_data, (increment, meta info) pairs."""
        loop = asyncio.get_running_loop()
        iterator = self.text_iter(var_name)
        done = object()
        while True:
            item = await loop.run_in_executor(None, next, iterator, done)
            if item is done:
                return
            if return_meta_data:
                meta = await loop.run_in_executor(None, self.get_meta_info, var_name) if var_name else None
                yield item, meta
            else:
                yield item

    # ---- forks --------------------------------------------------------------------------------

    def fork(self, size: int = 1, position_ids_offset=None) -> "ForkedStates":
        """`size` independent children starting from this state after its queued work."""
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"fork needs a positive number of children, got {size!r}")
        return ForkedStates([ProgramState(e) for e in self.executor.fork(size)], self)

    @contextmanager
    def copy(self, position_ids_offset=None):
        """One forked child for the block, joined (gather_variable) on exit."""
        forks = self.fork(1)
        try:
            yield forks[0]
        finally:
            forks.join()

    def end(self) -> None:
        self.executor.end()

    def __del__(self):
        executor = getattr(self, "executor", None)
        if executor is not None:
            executor.end()

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"


class ForkedStates:
    """The children of `fork(n)`: index them, add to all at once, then `join`."""

    def __init__(self, states: list[ProgramState], parent: ProgramState):
        self.states = states
        self.parent = parent

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        if value is not self.states[i]:
            raise ValueError("a forked state can only be updated in place (forks[i] += ...)")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other) -> "ForkedStates":
        if callable(other) and not isinstance(other, ir.Expr):
            for i, state in enumerate(self.states):
                state += other(i)
        elif isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"{len(other)} expressions for {len(self.states)} forked states")
            for state, expr in zip(self.states, other, strict=True):
                state += expr
        else:
            expr = ir.as_expr(other)
            for state in self.states:
                state += expr
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """gather_variable: each variable created in the children becomes a list in the parent,
        in fork order. concate_and_append: the children's new text is appended to the parent."""
        executors = [s.executor for s in self.states]
        if mode == "gather_variable":
            _gather_variables(self.parent.executor, executors)
        elif mode == "concate_and_append":
            self.parent += ir.ConcatAndAppend(tuple(executors))
            self.parent.executor.sync()
        else:
            raise ValueError(f"unknown join mode {mode!r}; use 'gather_variable' or 'concate_and_append'")
        for e in executors:
            e.end()


def _gather_variables(parent: Executor, children: list[Executor]) -> None:
    parent_names = set(parent.variables)
    gathered: dict[str, list] = {}
    metas: dict[str, list] = {}
    for child in children:
        child.sync()
        with child.lock:
            for name in child.variables.keys() - parent_names:
                gathered.setdefault(name, []).append(child.variables[name])
                metas.setdefault(name, []).append(child.meta_info.get(name))
    for name, values in gathered.items():
        parent.set(name, values, metas[name])
