"""Drive a headless Chromium over the DevTools protocol (for the dashboard's page test).

No browser-automation package: Chromium is started with --remote-debugging-port=0, the port it
picks is read from its profile directory, and the protocol's JSON messages go over aiohttp's
websocket client (aiohttp is a langrt dependency). `find_chromium()` is None where no Chromium is
installed (Debian: `apt-get install chromium`; or set CHROMIUM to a binary).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import aiohttp

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def find_chromium() -> str | None:
    explicit = os.environ.get("CHROMIUM")
    if explicit:
        return explicit if Path(explicit).exists() else None
    return next((path for name in CANDIDATES if (path := shutil.which(name))), None)


class HeadlessChromium:
    def __init__(self, binary: str, profile: Path, width: int = 1400, height: int = 1000, timeout_s: float = 30.0):
        (profile / "DevToolsActivePort").unlink(missing_ok=True)  # a reused profile's is stale
        self.process = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
             f"--user-data-dir={profile}", "--remote-debugging-port=0", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        self.loop = asyncio.new_event_loop()
        self.ids = itertools.count(1)
        self.session = self.ws = None
        try:
            port = self._port(profile / "DevToolsActivePort", timeout_s)
            targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
            url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
            self.ws = self.loop.run_until_complete(self._connect(url))
        except BaseException:
            self.close()
            raise

    def _port(self, path: Path, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while not (path.exists() and path.read_text().strip()):
            if self.process.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.process.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not open its debugging port")
            time.sleep(0.1)
        return int(path.read_text().splitlines()[0])

    async def _connect(self, url: str):
        self.session = aiohttp.ClientSession()
        return await self.session.ws_connect(url, max_msg_size=0)

    def call(self, method: str, **params) -> dict:
        """One protocol command; its result (events in between are skipped)."""
        return self.loop.run_until_complete(self._call(method, params))

    async def _call(self, method: str, params: dict) -> dict:
        request_id = next(self.ids)
        await self.ws.send_str(json.dumps({"id": request_id, "method": method, "params": params}))
        while True:
            message = json.loads((await asyncio.wait_for(self.ws.receive(), 60)).data)
            if message.get("id") == request_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def navigate(self, url: str, timeout_s: float = 60.0) -> None:
        """Open url and return once its document has loaded (Page.navigate returns before that:
        an expression evaluated at once may still see about:blank, or a document with no body)."""
        self.call("Page.enable")
        self.call("Page.navigate", url=url)
        self.wait_for(f"location.href === {json.dumps(url)} && document.readyState === 'complete'", timeout_s)

    def evaluate(self, expression: str):
        """The JSON value of a JavaScript expression in the page."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 60.0, poll_s: float = 0.2):
        """Poll until the expression is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page never satisfied: {expression}")
            time.sleep(poll_s)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        if self.ws is not None:
            self.loop.run_until_complete(self.ws.close())
        if self.session is not None:
            self.loop.run_until_complete(self.session.close())
        self.loop.close()
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
