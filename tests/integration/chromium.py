"""A real headless Chromium (Debian's `chromium`), driven over the DevTools protocol: enough to
log in with a cookie, open a page, read its text and take a screenshot.

The command line alone cannot set a cookie, so the browser starts with a remote-debugging port
(chosen by Chromium and read from `DevToolsActivePort`) and one small websocket client sends
the protocol's commands.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
    "--remote-allow-origins=*",
]


def binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Chromium:
    """One browser with one page; use as a context manager."""

    def __init__(self, profile: Path, width: int = 1440, height: int = 900) -> None:
        self.profile, self.width, self.height = profile, width, height
        self._ids = 0

    def __enter__(self) -> Chromium:
        exe = binary()
        if exe is None:
            raise FileNotFoundError("chromium is not installed (apt-get install -y chromium)")
        self.profile.mkdir(parents=True, exist_ok=True)
        self.log = (self.profile / "chromium.log").open("wb")
        args = [exe, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"]
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        port = self._devtools_port()
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        page = next(t for t in targets if t["type"] == "page")
        self._closing = contextlib.ExitStack()
        self.ws: ClientConnection = self._closing.enter_context(
            connect(page["webSocketDebuggerUrl"], max_size=2**27)
        )
        self.send("Page.enable")
        self.send("Network.enable")
        self.send(
            "Emulation.setDeviceMetricsOverride",
            width=self.width,
            height=self.height,
            deviceScaleFactor=1,
            mobile=False,
        )
        return self

    def __exit__(self, *_exc: object) -> None:
        try:
            self._closing.close()
        finally:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
            self.log.close()

    def send(self, method: str, **params: Any) -> dict:
        """One protocol command; its result (events received meanwhile are dropped)."""
        self._ids += 1
        self.ws.send(json.dumps({"id": self._ids, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv(timeout=60))
            if reply.get("id") == self._ids:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def set_cookie(self, url: str, name: str, value: str) -> None:
        self.send("Network.setCookie", url=url, name=name, value=value, path="/")

    def open(self, url: str, timeout: float = 60) -> int | None:
        """Load `url` and wait until it finished loading; the main document's HTTP status."""
        self._ids += 1
        self.ws.send(
            json.dumps({"id": self._ids, "method": "Page.navigate", "params": {"url": url}})
        )
        deadline = time.monotonic() + timeout
        status = None
        while time.monotonic() < deadline:
            event = json.loads(self.ws.recv(timeout=timeout))
            if event.get("id") == self._ids and "error" in event:
                raise RuntimeError(f"navigating to {url}: {event['error']}")
            if event.get("method") == "Network.responseReceived":
                params = event["params"]
                if params.get("type") == "Document" and status is None:
                    status = params["response"]["status"]
            if event.get("method") == "Page.loadEventFired":
                return status
        raise TimeoutError(f"{url} did not finish loading in {timeout}s")

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60) -> Any:
        """Poll a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.5)
        raise TimeoutError(f"{expression!r} still false after {timeout}s")

    def text(self) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """A PNG of the page (all of it, beyond the window, when `full_page`)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            width = max(self.width, int(size["width"]))
            height = max(self.height, int(size["height"]))
            params["clip"] = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
            params["captureBeyondViewport"] = True
        data = self.send("Page.captureScreenshot", **params)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def _devtools_port(self, timeout: float = 30) -> int:
        marker = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"chromium exited with {self.process.returncode}; see {marker.parent}"
                )
            if marker.exists() and marker.read_text().strip():
                return int(marker.read_text().split()[0])
            time.sleep(0.2)
        raise TimeoutError(f"chromium wrote no {marker} in {timeout}s")
