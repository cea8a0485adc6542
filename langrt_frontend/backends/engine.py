"""`EngineBackend`: a backend over an in-process `langrt.Engine` (no HTTP).

The Engine starts the same scheduler and detokenizer processes as `langrt launch` and takes
calls from many threads at once, so forks and batch items still batch in the runtime."""

from __future__ import annotations

from typing import Any, Iterator

from langrt_frontend.chat_template import ChatTemplate, resolve_chat_template

_GENERATE_ARGS = (
    "sampling_params",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
    "rid",
    "lora_path",
)


class EngineBackend:
    def __init__(
        self, engine=None, model_path: str | None = None, chat_template_name: str | None = None, **server_args: Any
    ):
        """Wrap `engine`, or start a `langrt.Engine(model_path, **server_args)` owned by this
        backend (stopped by `shutdown()`)."""
        if engine is None:
            import langrt  # torch and the runtime: only when an in-process backend is made

            engine = langrt.Engine(model_path, **server_args)
            self._owned = True
        else:
            self._owned = False
        self.engine = engine
        tokenizer = engine.tokenizer
        eos = getattr(tokenizer, "eos_token", None)
        self.model_info = {
            "model_path": str(engine.args.model_path or "builtin"),
            "chat_template": getattr(tokenizer, "chat_template", None),
            "stop_strings": [eos] if eos else [],
            "is_generation": True,
        }
        self.chat_template: ChatTemplate = resolve_chat_template(self.model_info, chat_template_name)
        self.caches_prefixes = not engine.args.disable_radix_cache

    def get_model_info(self) -> dict:
        return self.model_info

    def generate(self, payload: dict) -> dict | list[dict]:
        return self._generate(payload, stream=False)

    def generate_stream(self, payload: dict) -> Iterator[dict]:
        """Results as they grow (cumulative text), as the native API streams them."""
        from langrt.errors import LangrtError

        try:
            yield from self._generate(payload, stream=True)
        except LangrtError as e:
            raise RuntimeError(f"generate failed: {e}") from e

    def _generate(self, payload: dict, stream: bool):
        from langrt.errors import LangrtError

        if payload.get("image_data") is not None:
            raise RuntimeError("this model is text-only: image inputs are not supported")
        kwargs = {k: payload[k] for k in _GENERATE_ARGS if k in payload}
        try:
            return self.engine.generate(
                payload.get("text"), input_ids=payload.get("input_ids"), stream=stream, **kwargs
            )
        except LangrtError as e:
            raise RuntimeError(f"generate failed: {e}") from e

    def flush_cache(self) -> bool:
        return self.engine.flush_cache()

    def get_server_info(self) -> dict:
        return self.engine.get_server_info()

    def shutdown(self) -> None:
        if self._owned:
            self.engine.shutdown()

    def __repr__(self) -> str:
        return f"EngineBackend({self.model_info['model_path']!r})"
