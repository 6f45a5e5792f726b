"""Headless Chromium for the report tests, driven over the DevTools protocol on a pipe (no port, no extra
package): open a file, collect console messages, exceptions and network requests, evaluate JavaScript, take
screenshots and print to PDF.

``find_chromium()`` is None where no browser is installed (the tests then skip, saying why); CI installs
Debian's ``chromium`` (see .ci/run).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-default-apps",
    "--disable-extensions",
    "--mute-audio",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)


def find_chromium() -> str | None:
    override = os.environ.get("KVBENCH_CHROMIUM")
    if override:
        return override if Path(override).is_file() else None
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


class BrowserError(RuntimeError):
    pass


@dataclass
class PageLog:
    console: list[str] = field(default_factory=list)  # console errors and warnings, exceptions, log errors
    requests: list[str] = field(default_factory=list)  # every URL the page asked for, itself included


class Chromium:
    """One headless browser with a fresh profile; a context manager that always ends the process."""

    def __init__(self, executable: str, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self.profile = tempfile.mkdtemp(prefix="kvbench-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire_pipes() -> None:  # the DevTools pipe: the browser reads fd 3 and writes fd 4
            read_end, write_end = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        self.stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            preexec_fn=wire_pipes,
            close_fds=False,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []

    # -- protocol ---------------------------------------------------------------------------------------
    def _send(self, method: str, params: dict | None, session: str | None) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _receive(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise BrowserError("the browser did not answer in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise BrowserError(f"the browser closed its pipe: {self.log_tail()}")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict[str, Any]:
        ident = self._send(method, params, session)
        deadline = time.monotonic() + self.timeout_s
        while True:
            message = self._receive(deadline)
            if message.get("id") == ident:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._events.append(message)

    def wait_for(self, method: str, session: str, timeout_s: float | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        for index, event in enumerate(self._events):
            if event.get("method") == method and event.get("sessionId") == session:
                return self._events.pop(index)
        while True:
            message = self._receive(deadline)
            if message.get("method") == method and message.get("sessionId") == session:
                return message
            self._events.append(message)

    def drain(self, seconds: float) -> None:
        """Read the events that arrive in the next ``seconds`` (late console messages, requests)."""
        deadline = time.monotonic() + seconds
        try:
            while True:
                self._events.append(self._receive(deadline))
        except BrowserError:
            return

    # -- pages ------------------------------------------------------------------------------------------
    def open(self, path: Path, width: int = 1280, height: int = 900) -> Page:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", None, session)
        page = Page(self, session, Path(path).resolve().as_uri())
        page.resize(width, height)
        self._events = [e for e in self._events if e.get("sessionId") != session]
        self.call("Page.navigate", {"url": page.url}, session)
        self.wait_for("Page.loadEventFired", session)
        page.settle()
        return page

    def log_tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-2000:]

    def close(self) -> None:
        try:
            if self.process.poll() is None:
                try:
                    self._send("Browser.close", None, None)
                    self.process.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    self.process.kill()
                    self.process.wait(timeout=10)
        finally:
            for fd in (self._to_browser, self._from_browser):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.stderr.close()
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Page:
    def __init__(self, browser: Chromium, session: str, url: str) -> None:
        self.browser = browser
        self.session = session
        self.url = url

    def call(self, method: str, params: dict | None = None) -> dict[str, Any]:
        return self.browser.call(method, params, self.session)

    def settle(self, seconds: float = 0.3) -> None:
        self.browser.drain(seconds)

    def log(self) -> PageLog:
        """What the page has done so far: console errors and warnings, exceptions, and requests."""
        log = PageLog()
        for event in self.browser._events:
            if event.get("sessionId") != self.session:
                continue
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                log.console.append(f"console.{params['type']}: {text}")
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                log.console.append(
                    f"exception: {details.get('exception', {}).get('description') or details.get('text')}"
                )
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
                entry = params["entry"]
                log.console.append(
                    f"{entry.get('source')} {entry['level']}: {entry.get('text')} {entry.get('url', '')}"
                )
            elif method == "Network.requestWillBeSent":
                log.requests.append(params.get("request", {}).get("url", ""))
        return log

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def resize(self, width: int, height: int, mobile: bool = False) -> None:
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
        )

    def media(self, media: str) -> None:
        self.call("Emulation.setEmulatedMedia", {"media": media})

    def screenshot(self, path: Path, full_page: bool = True, clip: dict | None = None) -> Path:
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": full_page}
        if clip is not None:
            params["clip"] = {**clip, "scale": 1}
        elif full_page:
            width, height = self.evaluate(
                "[document.documentElement.scrollWidth, document.documentElement.scrollHeight]"
            )
            params["clip"] = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
        data = self.call("Page.captureScreenshot", params)["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def pdf(self, path: Path) -> Path:
        data = self.call("Page.printToPDF", {"printBackground": True, "preferCSSPageSize": True})["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)
