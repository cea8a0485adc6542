"""The Executor's gen and select for a PrimitiveBackend (OpenAI's API and the like, which take
whole nodes rather than /generate payloads): each gets the state's `Context`."""

from __future__ import annotations

from langrt_frontend import ir
from langrt_frontend.backends.base import Context


class PrimitiveNodes:
    """Mixed into executor.Executor, whose state (text, messages, role, images, lock) it reads."""

    def context(self) -> Context:
        with self.lock:
            role_text = self.text[self.role_start :] if self.role is not None else ""
            return Context(self.text, tuple(dict(m) for m in self.messages), self.role, role_text, tuple(self.images))

    def _gen_primitive(self, node: ir.Gen) -> None:
        params = node.params.over(self.defaults).with_extra_stops(self.template.stop_str)
        if self.stream and (params.n or 1) == 1:
            value, meta = self._stream_into(node.name, self.backend.gen_stream(self.context(), params))
        else:
            value, meta = self.backend.gen(self.context(), params)
            self._append(value[0] if isinstance(value, list) else value)
        if node.name is not None:
            self.set(node.name, value, meta)

    def _select_primitive(self, node: ir.Select) -> None:
        if node.temperature != 0:
            raise ValueError(f"select: temperature must be 0 (choices are scored, not sampled), got {node.temperature}")
        decision, meta = self.backend.select(self.context(), node.choices, node.method)
        self._append(decision)
        if node.name is not None:
            self.set(node.name, decision, meta)
