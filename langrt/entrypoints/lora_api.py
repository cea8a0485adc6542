"""LoRA adapters over HTTP, as SGLang serves them: POST /load_lora_adapter
{"lora_name", "lora_path"}, POST /unload_lora_adapter {"lora_name"}, and which adapter an
OpenAI request's `model` names ("BASE:NAME", or a loaded adapter's NAME)."""

from __future__ import annotations

from aiohttp import web

from langrt.errors import InvalidRequest
from langrt.entrypoints.errors import error_response
from langrt.entrypoints.native_api import read_json


async def load_lora_adapter(request: web.Request) -> web.Response:
    body = await read_json(request, {"lora_name", "lora_path", "pinned"})
    name, path = _text(body, "lora_name"), _text(body, "lora_path")
    return _answer(await request.app["manager"].lora(name, path))


async def unload_lora_adapter(request: web.Request) -> web.Response:
    body = await read_json(request, {"lora_name"})
    return _answer(await request.app["manager"].lora(_text(body, "lora_name")))


def _text(body: dict, field: str) -> str:
    value = body.get(field)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{field} must be a non-empty string", param=field)
    return value


def _answer(reply: dict) -> web.Response:
    if "error" in reply:
        return error_response(400, reply["error"], "lora_name")
    return web.json_response({"success": True, "error_message": "", "loaded_adapters": reply["adapters"]})


def adapter_of_model(model, served_name: str, lora_names: set[str]) -> str | None:
    """The adapter an OpenAI `model` field names: "BASE:NAME" -> NAME (an unknown NAME is then
    refused by name), a loaded adapter's NAME -> NAME; anything else (the served model's name,
    or a name a client always sends) -> None, the base model, as before adapters existed."""
    if not isinstance(model, str) or model == served_name:
        return None
    if model in lora_names:
        return model
    base, sep, name = model.rpartition(":")
    return name if sep and base and name else None


def add_routes(app: web.Application) -> None:
    app.router.add_post("/load_lora_adapter", load_lora_adapter)
    app.router.add_post("/unload_lora_adapter", unload_lora_adapter)
