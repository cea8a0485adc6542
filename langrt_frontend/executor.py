"""The interpreter: each program state has an `Executor` whose own thread runs the state's
queued nodes in order. Independent states (forks, batch items) therefore send their requests
concurrently, and the runtime batches them.

Threads: the program body (user code) submits nodes and reads results; the worker thread runs
nodes. Everything the two share (text, variables, meta info, messages) is guarded by `lock`,
a Condition notified whenever text or a variable grows, so streaming readers can follow.
Text only ever grows; `fork_start` marks where a forked child's own text begins.

`gen` and `select` become native /generate payloads for a `Backend`; a `PrimitiveBackend`
(OpenAI's API) gets them whole, with the state's `Context`, and builds its own requests.
"""

from __future__ import annotations

import base64
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

from langrt_frontend import ir
from langrt_frontend.backends.base import caches_prefixes, stream_increments, takes_native_payloads
from langrt_frontend.config import global_config
from langrt_frontend.params import GenParams
from langrt_frontend.primitive_nodes import PrimitiveNodes
from langrt_frontend.reasoning import gen_values
from langrt_frontend.select import score_choices

logger = logging.getLogger("langrt_frontend")

_END = object()  # queued by end(): the worker exits after the nodes before it


@dataclass
class _Pending:
    """A variable that queued nodes will set; `count` nodes are still to run."""

    count: int = 1
    done: threading.Event = field(default_factory=threading.Event)


class Executor(PrimitiveNodes):
    def __init__(self, backend, defaults: GenParams, stream: bool = False, template=None, start: bool = True):
        self.backend = backend
        self.template = template if template is not None else backend.chat_template
        self.defaults = defaults
        self.stream = stream
        self.lock = threading.Condition()
        self.text = ""
        self.variables: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {}
        self.messages: list[dict] = []
        self.role: str | None = None
        self.role_start = 0
        self.scopes: dict[str, int] = {}
        self.images: list[str] = []
        # (text, its token count) learnt from a response: where select's logprobs can start.
        self.token_mark: tuple[str, int] | None = None
        self.error: Exception | None = None
        self.fork_start = 0
        self.pending: dict[str, _Pending] = {}
        self.closed = False
        self.finished = False
        self.queue: queue.Queue = queue.Queue()
        self.handlers = {
            ir.Text: self._text,
            ir.ExprList: self._expr_list,
            ir.Gen: self._gen,
            ir.Select: self._select,
            ir.RoleBegin: self._role_begin,
            ir.RoleEnd: self._role_end,
            ir.VarScopeBegin: self._var_scope_begin,
            ir.VarScopeEnd: self._var_scope_end,
            ir.Image: self._image,
            ir.Video: self._video,
            ir.ConcatAndAppend: self._concat_and_append,
        }
        if not takes_native_payloads(backend):
            self.handlers.update({ir.Gen: self._gen_primitive, ir.Select: self._select_primitive})
        if start:
            threading.Thread(target=self._work, name="langrt-frontend-state", daemon=True).start()

    # ---- called from the program body ---------------------------------------------------------

    def submit(self, node: ir.Expr) -> None:
        if self.closed:
            raise RuntimeError(
                "this program state has ended (its program returned or it was joined); nothing more can be added"
            )
        with self.lock:
            for name in node.variable_names():
                entry = self.pending.get(name)
                if entry is None:
                    self.pending[name] = _Pending()
                else:
                    entry.count += 1
        self.queue.put(node)

    def sync(self) -> None:
        """Wait until every queued node has run (or been skipped after an error)."""
        self.queue.join()

    def end(self) -> None:
        """No more nodes: the worker thread exits once the queued ones have run."""
        if not self.closed:
            self.closed = True
            self.queue.put(_END)

    def get(self, name: str, with_meta: bool = False):
        """A variable's value (and meta info), waiting while queued nodes will set it."""
        with self.lock:
            entry = self.pending.get(name)
        if entry is not None:
            entry.done.wait()
        with self.lock:
            if name in self.variables:
                return (self.variables[name], self.meta_info.get(name)) if with_meta else self.variables[name]
            error = self.error
        if error is not None:
            raise KeyError(f"variable {name!r} was not set: the program stopped with {error!r}") from error
        raise KeyError(f"no variable {name!r} in this program state")

    def set(self, name: str, value, meta=None) -> None:
        with self.lock:
            self.variables[name] = value
            if meta is not None:
                self.meta_info[name] = meta
            entry = self.pending.get(name)
            if entry is not None:
                entry.count -= 1
                if entry.count == 0:
                    del self.pending[name]
                    entry.done.set()
            self.lock.notify_all()

    def fork(self, n: int) -> list["Executor"]:
        """`n` children starting from this state as it is after every queued node. With more
        than one child, the shared text is prefilled first so that every child finds it cached
        instead of all computing it at once (unless the runtime keeps no cache)."""
        self.sync()
        if n > 1 and self.text and self.error is None and caches_prefixes(self.backend):
            self._commit_prefix()
        children = []
        for _ in range(n):
            child = Executor(self.backend, self.defaults, self.stream)
            with self.lock:
                child.text = self.text
                child.variables = dict(self.variables)
                child.meta_info = dict(self.meta_info)
                child.messages = [dict(m) for m in self.messages]
                child.role, child.role_start = self.role, self.role_start
                child.scopes = dict(self.scopes)
                child.images = list(self.images)
                child.token_mark = self.token_mark
                child.error = self.error
                child.fork_start = len(self.text)
            children.append(child)
        return children

    def _commit_prefix(self) -> None:
        try:
            response = self.backend.generate(
                {"text": self.text, "sampling_params": {"max_new_tokens": 0}, **self.defaults.adapter_fields()}
            )
        except RuntimeError:
            return  # only an optimization: the children's own requests report real failures
        self._learn_tokens(self.text, response["meta_info"])

    def increments(self, var: str | None = None) -> Iterator[str]:
        """Text (or variable `var`) increments as they arrive, until final."""
        position = 0
        while True:
            with self.lock:
                while True:
                    current, done = self._current(var)
                    if len(current) > position or done:
                        break
                    self.lock.wait()
                out, position = current[position:], len(current)
            if out:
                yield out
            if done:
                return

    def _current(self, var: str | None) -> tuple[str, bool]:
        if var is None:
            return self.text, self.finished
        value = self.variables.get(var, "")
        final = self.finished or (var in self.variables and var not in self.pending)
        return (value if isinstance(value, str) else str(value)), final

    # ---- the worker ---------------------------------------------------------------------------

    def _work(self) -> None:
        try:
            while True:
                node = self.queue.get()
                try:
                    if node is _END:
                        return
                    if self.error is None:
                        self._run_guarded(node)
                finally:
                    self.queue.task_done()
        finally:
            with self.lock:
                self.finished = True
                self.lock.notify_all()

    def _run_guarded(self, node: ir.Expr) -> None:
        try:
            self.run(node)
        except Exception as e:  # noqa: BLE001 - recorded: state.error() reports it
            logger.warning("langrt_frontend: program stopped: %r", e)
            with self.lock:
                self.error = e
                for entry in self.pending.values():
                    entry.done.set()
                self.pending.clear()
                self.lock.notify_all()

    def run(self, node: ir.Expr) -> None:
        handler = self.handlers.get(type(node))
        if handler is None:
            raise TypeError(f"cannot run a {type(node).__name__} node")
        handler(node)

    def _append(self, text: str) -> None:
        with self.lock:
            self.text += text
            self.lock.notify_all()

    # ---- node handlers ------------------------------------------------------------------------

    def _text(self, node: ir.Text) -> None:
        self._append(node.value)

    def _expr_list(self, node: ir.ExprList) -> None:
        for item in node.items:
            self.run(item)

    def _gen(self, node: ir.Gen) -> None:
        params = node.params.over(self.defaults).with_extra_stops(self.template.stop_str)
        prompt = self.text
        payload = {"text": prompt, "sampling_params": _sampling_params(params), **params.request_options()}
        self._attach_images(payload)
        if self.stream and (params.n or 1) == 1:
            self._gen_streaming(node.name, prompt, payload, params.reasoning)
            return
        response = self.backend.generate(payload)
        if isinstance(response, list):  # n > 1: every sample stored, the first appended
            self._learn_tokens(prompt, response[0]["meta_info"])
            self._append(response[0]["text"])
            value, meta = [r["text"] for r in response], [r["meta_info"] for r in response]
        else:
            self._learn_tokens(prompt, response["meta_info"])
            self._append(response["text"])
            value, meta = response["text"], response["meta_info"]
        if node.name is not None:
            self._set_gen(node.name, value, meta, params.reasoning)

    def _attach_images(self, payload: dict) -> None:
        """Images travel with every request made after them; a text-only runtime refuses them
        with a clear error, which stops the program."""
        if self.images:
            payload["image_data"] = self.images[0] if len(self.images) == 1 else list(self.images)

    def _gen_streaming(self, name: str | None, prompt: str, payload: dict, reasoning: bool | None) -> None:
        value, meta = self._stream_into(name, stream_increments(self.backend.generate_stream(payload)))
        if meta is not None:
            self._learn_tokens(prompt, meta)
        if name is not None:
            self._set_gen(name, value, meta, reasoning)

    def _set_gen(self, name: str, value, meta, reasoning: bool | None) -> None:
        for var, part in gen_values(name, value, reasoning):  # the answer apart from the thinking
            self.set(var, part, meta if var == name else None)

    def _stream_into(self, name: str | None, pieces: Iterator[tuple[str, dict | None]]) -> tuple[str, dict | None]:
        """Append (increment, meta or None) pieces as they come, to the text and to `name`."""
        value, meta = "", None
        for delta, piece_meta in pieces:
            value += delta
            meta = piece_meta if piece_meta is not None else meta
            with self.lock:
                self.text += delta
                if name is not None:
                    self.variables[name] = value
                self.lock.notify_all()
        return value, meta

    def _learn_tokens(self, prompt: str, meta: dict) -> None:
        if meta and meta.get("prompt_tokens"):
            self.token_mark = (prompt, meta["prompt_tokens"])

    def _select(self, node: ir.Select) -> None:
        if node.temperature != 0:
            raise ValueError(f"select: temperature must be 0 (choices are scored, not sampled), got {node.temperature}")
        if (
            self._unknown_chars() >= global_config.precache_min_chars
            and caches_prefixes(self.backend)
            and not self.images
        ):
            # Every choice row (and the prefix row) computes all positions from the last known
            # token count, where its logprobs start: text past it would be computed k + 1 times.
            # Cache it once and learn its token count, so the rows compute only their choice.
            self._commit_prefix()
        decision, meta = score_choices(
            self.backend,
            self.text,
            node.choices,
            node.method,
            self._known_tokens(),
            self._attach_images,
            self.defaults.adapter_fields(),
        )
        self._append(decision)
        if node.name is not None:
            self.set(node.name, decision, meta)

    def _unknown_chars(self) -> int:
        """Characters of the current text past the prefix whose token count is known."""
        known = self.token_mark[0] if self.token_mark is not None and self.text.startswith(self.token_mark[0]) else ""
        return len(self.text) - len(known)

    def _known_tokens(self) -> int:
        """Tokens of a prefix of the current text known from an earlier response (0: none)."""
        if self.token_mark is None or not self.text.startswith(self.token_mark[0]):
            return 0
        return self.token_mark[1]

    def _role_begin(self, node: ir.RoleBegin) -> None:
        if self.role is not None:
            raise RuntimeError(f"nested roles are not allowed: {node.role!r} began inside {self.role!r}")
        default_system = self.template.default_system_prompt
        if not self.messages and node.role != "system" and default_system:
            self._role_begin(ir.RoleBegin("system"))
            self._append(default_system)
            self._role_end(ir.RoleEnd("system"))
        prefix, _ = self.template.prefix_and_suffix(node.role)
        self._append(prefix)
        with self.lock:
            self.role, self.role_start = node.role, len(self.text)

    def _role_end(self, node: ir.RoleEnd) -> None:
        if self.role != node.role:
            raise RuntimeError(f"role {node.role!r} ended while {self.role!r} was open")
        _, suffix = self.template.prefix_and_suffix(node.role)
        with self.lock:
            content = self.text[self.role_start :].lstrip()
            self.text += suffix
            self.messages.append({"role": node.role, "content": content})
            self.role = None
            self.lock.notify_all()

    def _var_scope_begin(self, node: ir.VarScopeBegin) -> None:
        self.scopes[node.name] = len(self.text)

    def _var_scope_end(self, node: ir.VarScopeEnd) -> None:
        if node.name not in self.scopes:
            raise RuntimeError(f"var_scope {node.name!r} ended without beginning")
        self.set(node.name, self.text[self.scopes.pop(node.name) :])

    def _image(self, node: ir.Image) -> None:
        if node.path.startswith(("http://", "https://", "data:")):
            self.images.append(node.path)
            return
        with open(node.path, "rb") as f:
            self.images.append(base64.b64encode(f.read()).decode())
        self._append(self.template.image_token)

    def _video(self, node: ir.Video) -> None:
        raise NotImplementedError(f"video inputs are not supported: langrt serves text-only models ({node.path!r})")

    def _concat_and_append(self, node: ir.ConcatAndAppend) -> None:
        for child in node.children:
            child.sync()
            self._append(child.text[child.fork_start :])


def _sampling_params(params: GenParams) -> dict:
    out = params.sampling_params()
    if not global_config.skip_special_tokens_in_output:
        out["skip_special_tokens"] = False
    if not global_config.spaces_between_special_tokens_in_out:
        out["spaces_between_special_tokens"] = False
    return out
