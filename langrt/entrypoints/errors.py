"""Errors of every route, in one place: status codes and the OpenAI error shape (docs/serving.md, native API).

{"error": {"message": ..., "type": ..., "param": ..., "code": <status>}}
"""

from __future__ import annotations

import hmac
import json
import logging

from aiohttp import web

from langrt.errors import InvalidRequest, Overloaded, ServerUnavailable

logger = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    500: "internal_error",
    503: "service_unavailable",
}
OPEN_ROUTES = ("/health", "/health_generate")  # no API key needed
# Why 1 s: an overloaded server frees a place when a running request ends, which at decode
# speed is seconds away; clients that honour Retry-After (OpenAI's SDK does) come back then
# instead of at once. Errors that retrying this server will not cure (it is dying) get none.
RETRY_AFTER_S = 1


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "error"), "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None) -> web.Response:
    return web.json_response(error_body(status, message, param), status=status)


def status_of(error: Exception) -> tuple[int, str, str | None]:
    """(status, message, param) for an exception raised while serving a request."""
    if isinstance(error, InvalidRequest):
        return 400, error.message, error.param
    if isinstance(error, (Overloaded, ServerUnavailable)):
        return 503, str(error), None
    if isinstance(error, json.JSONDecodeError):
        return 400, f"the request body is not valid JSON: {error}", None
    return 500, f"internal error: {type(error).__name__}: {error}", None


@web.middleware
async def error_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        message = {
            408: f"the request body did not arrive within {request.app.get('body_read_timeout')} s",
            413: f"the request body is larger than the limit ({request.app['max_request_bytes']} bytes)",
        }.get(e.status, e.reason)
        return error_response(e.status, message)
    except Exception as e:  # noqa: BLE001 - every failure becomes a JSON error, never a hang
        status, message, param = status_of(e)
        if status == 500:
            logger.exception("error serving %s %s", request.method, request.path)
        response = error_response(status, message, param)
        if isinstance(e, Overloaded):
            response.headers["Retry-After"] = str(RETRY_AFTER_S)
        return response


def auth_middleware(api_key: str | None):
    expected = f"Bearer {api_key}".encode() if api_key else None

    @web.middleware
    async def check(request: web.Request, handler):
        if expected is not None and request.path not in OPEN_ROUTES:
            # surrogateescape: header bytes that are not UTF-8 come back as they were sent
            given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, expected):  # constant time
                return error_response(401, "missing or wrong API key: send 'Authorization: Bearer <key>'")
        return await handler(request)

    return check
