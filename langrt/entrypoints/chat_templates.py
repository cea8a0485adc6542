"""Chat templates by name for `--chat-template` (docs/programs.md, chat roles), as Jinja for the tokenizer."""

from __future__ import annotations

from pathlib import Path

_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEMPLATES = {
    "chatml": _CHATML,
    "qwen": (
        "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
        + _CHATML
    ),
    "llama-3-instruct": (
        "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>"
        "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    "default": (
        "{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
    ),
}


def resolve_chat_template(name_or_path: str | None, tokenizer) -> str | None:
    """The Jinja template the server applies: a named one, a file's, or the tokenizer's own."""
    if name_or_path is None:
        return getattr(tokenizer, "chat_template", None)
    if name_or_path in TEMPLATES:
        return TEMPLATES[name_or_path]
    path = Path(name_or_path)
    if path.is_file():
        return path.read_text()
    raise ValueError(f"--chat-template {name_or_path!r} is neither a known name ({', '.join(TEMPLATES)}) nor a file")
