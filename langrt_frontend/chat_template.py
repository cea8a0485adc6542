"""Chat templates for roles (docs/programs.md, chat roles): named ones, and ones derived from the served model's
own Jinja template by rendering marker conversations and cutting them at the markers."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    roles: dict[str, tuple[str, str]]  # role -> (prefix, suffix)
    stop_str: tuple[str, ...] = ()
    default_system_prompt: str | None = None
    image_token: str = field(default="")

    def prefix_and_suffix(self, role: str) -> tuple[str, str]:
        if role not in self.roles:
            raise ValueError(f"chat template {self.name!r} has no role {role!r}; roles: {', '.join(self.roles)}")
        return self.roles[role]


def _chatml_roles() -> dict[str, tuple[str, str]]:
    return {r: (f"<|im_start|>{r}\n", "<|im_end|>\n") for r in ("system", "user", "assistant")}


TEMPLATES: dict[str, ChatTemplate] = {
    "default": ChatTemplate(
        "default", {"system": ("SYSTEM:", "\n"), "user": ("USER:", "\n"), "assistant": ("ASSISTANT:", "\n")}
    ),
    "chatml": ChatTemplate("chatml", _chatml_roles(), stop_str=("<|im_end|>",)),
    "qwen": ChatTemplate(
        "qwen", _chatml_roles(), stop_str=("<|im_end|>",), default_system_prompt="You are a helpful assistant."
    ),
    "llama-3-instruct": ChatTemplate(
        "llama-3-instruct",
        {r: (f"<|start_header_id|>{r}<|end_header_id|>\n\n", "<|eot_id|>") for r in ("system", "user", "assistant")},
        stop_str=("<|eot_id|>",),
    ),
}


def get_chat_template(name: str) -> ChatTemplate:
    if name not in TEMPLATES:
        raise ValueError(f"unknown chat template {name!r}; known: {', '.join(TEMPLATES)}")
    return TEMPLATES[name]


def template_name_for_model_path(model_path: str | None) -> str:
    """The fallback by name when the model has no chat template of its own."""
    path = (model_path or "").lower()
    if "qwen" in path and ("instruct" in path or "chat" in path):
        return "qwen"
    if "llama-3" in path and "instruct" in path:
        return "llama-3-instruct"
    return "default"


def resolve_chat_template(model_info: dict, name: str | None = None) -> ChatTemplate:
    """The template for a served model: by `name` if given, else derived from the model's own
    template (/get_model_info `chat_template`), else by its path."""
    if name is not None:
        return get_chat_template(name)
    source = model_info.get("chat_template")
    if source:
        derived = derive_from_jinja(source, tuple(model_info.get("stop_strings") or ()))
        if derived is not None:
            return derived
    return get_chat_template(template_name_for_model_path(model_info.get("model_path")))


# ---- derivation from a Jinja chat template ------------------------------------------------------

_MARK = {role: f"\x02{role.upper()}\x03" for role in ("system", "user", "assistant")}
_SECOND_USER = "\x02USER2\x03"


class _TemplateError(Exception):
    pass


def derive_from_jinja(source: str, stop_strings: tuple[str, ...] = ()) -> ChatTemplate | None:
    """Each role's prefix and suffix, the default system prompt and the stop strings of a Jinja
    chat template; None when the template is not a plain concatenation of per-role blocks (then
    the caller falls back to a named template)."""
    try:
        render = _renderer(source)
        system_prefix, system_suffix = _cut(render([("system", _MARK["system"])]), _MARK["system"])
        full = render([("system", _MARK["system"]), ("user", _MARK["user"]), ("assistant", _MARK["assistant"])])
        before_user, after_user = _cut(render([("system", _MARK["system"]), ("user", _MARK["user"])]), _MARK["user"])
        user_suffix = after_user
        assistant_suffix = full.rsplit(_MARK["assistant"], 1)[1]
        user_prefix = _strip_start(_between(full, _MARK["system"], _MARK["user"]), system_suffix)
        assistant_prefix = _strip_start(_between(full, _MARK["user"], _MARK["assistant"]), user_suffix)
        roles = {
            "system": (system_prefix, system_suffix),
            "user": (user_prefix, user_suffix),
            "assistant": (assistant_prefix, assistant_suffix),
        }
        default_system = _default_system(render, roles)
        _check(render, roles, default_system)
    except _TemplateError:
        return None
    except Exception:  # noqa: BLE001 - a template that fails to render is not derivable
        return None
    known = _known_template(roles, default_system)
    if known is not None:
        return known
    stops = tuple(stop_strings) or ((assistant_suffix.strip(),) if assistant_suffix.strip() else ())
    return ChatTemplate("model", roles, stop_str=stops, default_system_prompt=default_system)


def _known_template(roles, default_system) -> ChatTemplate | None:
    """The named template with the same role markers: the one that also has the same default
    system prompt, else the first (so SmolLM2's template, ChatML markers plus its own system
    line, is "chatml", and Qwen's is "qwen")."""
    same_roles = [t for t in TEMPLATES.values() if t.roles == roles]
    exact = [t for t in same_roles if t.default_system_prompt == default_system]
    return (exact or same_roles or [None])[0]


def _renderer(source: str):
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # only when a template is derived

    def raise_exception(message):
        raise _TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(source)

    def render(messages: list[tuple[str, str]]) -> str:
        return template.render(
            messages=[{"role": r, "content": c} for r, c in messages],
            add_generation_prompt=False,
            bos_token="",  # the runtime's tokenizer adds BOS itself
            eos_token="",
        )

    return render


def _cut(text: str, mark: str) -> tuple[str, str]:
    if text.count(mark) != 1:
        raise _TemplateError(f"marker {mark!r} rendered {text.count(mark)} times")
    before, after = text.split(mark)
    return before, after


def _between(text: str, first: str, second: str) -> str:
    return text.split(first, 1)[1].split(second, 1)[0]


def _strip_start(text: str, prefix: str) -> str:
    if not text.startswith(prefix):
        raise _TemplateError("a role's suffix changes when another message follows")
    return text[len(prefix) :]


def _default_system(render, roles) -> str | None:
    """The system message the template inserts when a conversation starts without one."""
    head, _ = _cut(render([("user", _MARK["user"])]), _MARK["user"])
    user_prefix = roles["user"][0]
    if head == user_prefix:
        return None
    system_prefix, system_suffix = roles["system"]
    inserted = head[: len(head) - len(user_prefix)] if head.endswith(user_prefix) else None
    if inserted is None or not inserted.startswith(system_prefix) or not inserted.endswith(system_suffix):
        raise _TemplateError("the template adds text before the first user message that is not a system message")
    return inserted[len(system_prefix) : len(inserted) - len(system_suffix)]


def _check(render, roles, default_system) -> None:
    """The derived pieces must reproduce a longer conversation exactly."""
    conversation = [("user", _MARK["user"]), ("assistant", _MARK["assistant"]), ("user", _SECOND_USER)]
    expected = ""
    if default_system is not None:
        expected += roles["system"][0] + default_system + roles["system"][1]
    for role, content in conversation:
        prefix, suffix = roles[role]
        expected += prefix + content + suffix
    if render(conversation) != expected:
        raise _TemplateError("the template is not a concatenation of per-role blocks")
