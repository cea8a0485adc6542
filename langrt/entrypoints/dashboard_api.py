"""The live dashboard (docs/dashboard.md): GET /dashboard (one self-contained page: plain SVG
and JavaScript, nothing fetched from elsewhere), GET /dashboard/state (its JSON) and GET
/dashboard/events (the same state as server-sent events). Behind the same API-key check as
every route; `--disable-dashboard` leaves the routes out."""

from __future__ import annotations

import asyncio
import json
from importlib import resources

from aiohttp import web

from langrt.errors import InvalidRequest
from langrt.server.dashboard import Dashboard

DEFAULT_INTERVAL_S = 0.5
MIN_INTERVAL_S = 0.25  # what one snapshot is reused for (Dashboard.min_poll_s)
MAX_INTERVAL_S = 60.0


async def page(request: web.Request) -> web.Response:
    html = resources.files("langrt.entrypoints").joinpath("static/dashboard.html").read_text(encoding="utf-8")
    return web.Response(text=html, content_type="text/html", charset="utf-8")


async def state(request: web.Request) -> web.Response:
    return web.json_response(await request.app["dashboard"].state())


async def events(request: web.Request) -> web.StreamResponse:
    """The state every `interval` seconds (query parameter, default 0.5) until the client goes."""
    raw = request.query.get("interval", str(DEFAULT_INTERVAL_S))
    try:
        interval = float(raw)
    except ValueError:
        raise InvalidRequest(f"interval must be a number of seconds; got {raw!r}", param="interval") from None
    if not MIN_INTERVAL_S <= interval <= MAX_INTERVAL_S:
        raise InvalidRequest(
            f"interval must be in [{MIN_INTERVAL_S}, {MAX_INTERVAL_S}] seconds; got {interval}", param="interval"
        )
    dashboard: Dashboard = request.app["dashboard"]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    try:
        while True:
            await response.write(f"data: {json.dumps(await dashboard.state())}\n\n".encode())
            await asyncio.sleep(interval)
    except ConnectionError:
        pass  # the page was closed (or aiohttp cancels this handler, which ends it too)
    return response


def add_routes(app: web.Application) -> None:
    app["dashboard"] = Dashboard(app["manager"], min_poll_s=MIN_INTERVAL_S)
    app.router.add_get("/dashboard", page)
    app.router.add_get("/dashboard/state", state)
    app.router.add_get("/dashboard/events", events)
