"""Headless Chromium (Debian's `chromium`, installed by `make test`'s browser-debs) driven over
its DevTools protocol with aiohttp's WebSocket client (already in the test venv): open a page,
and report what it did: every request it sent, every console message and uncaught error, the
DOM after load, the links' targets, a screenshot. No browser download, no extra library.

The flags are those that work on these machines (no sandbox as root, no GPU, no background
networking that would try Google's hosts), with a new empty profile each time."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--remote-debugging-port=0"]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Visit:
    requests: list[str] = field(default_factory=list)      # every URL the page asked for
    console: list[tuple[str, str]] = field(default_factory=list)   # (level, text): console calls, log entries, errors
    html: str = ""
    links: list[str] = field(default_factory=list)         # every <a href>, resolved
    screenshot: bytes = b""

    @property
    def errors(self) -> list[str]:
        return [text for level, text in self.console if level in ("error", "assert", "exception")]


class _Page:
    def __init__(self, ws):
        self.ws, self.seq, self.visit, self.loaded = ws, 0, Visit(), asyncio.Event()
        self.waiting: dict[int, asyncio.Future] = {}

    async def call(self, method: str, **params):
        self.seq += 1
        fut = asyncio.get_running_loop().create_future()
        self.waiting[self.seq] = fut
        await self.ws.send_json({"id": self.seq, "method": method, "params": params})
        return await asyncio.wait_for(fut, 30)

    async def pump(self):
        async for msg in self.ws:
            data = msg.json()
            if "id" in data and data["id"] in self.waiting:
                fut = self.waiting.pop(data["id"])
                fut.set_exception(RuntimeError(data["error"])) if "error" in data else fut.set_result(data.get("result"))
                continue
            method, p = data.get("method"), data.get("params", {})
            if method == "Network.requestWillBeSent":
                self.visit.requests.append(p["request"]["url"])
            elif method == "Runtime.consoleAPICalled":
                self.visit.console.append((p["type"], " ".join(str(a.get("value", a.get("description", "")))
                                                                for a in p.get("args", []))))
            elif method == "Runtime.exceptionThrown":
                self.visit.console.append(("exception", p["exceptionDetails"].get("text", "")))
            elif method == "Log.entryAdded":
                self.visit.console.append((p["entry"]["level"], p["entry"].get("text", "")))
            elif method == "Page.loadEventFired":
                self.loaded.set()


async def _visit(port: int, url: str, width: int) -> Visit:
    async with aiohttp.ClientSession() as http:
        async with http.put(f"http://127.0.0.1:{port}/json/new?about:blank") as resp:
            target = await resp.json()
        async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            page = _Page(ws)
            pump = asyncio.create_task(page.pump())
            for domain in ("Network", "Runtime", "Log", "Page"):
                await page.call(f"{domain}.enable")
            await page.call("Emulation.setDeviceMetricsOverride", width=width, height=900, deviceScaleFactor=1,
                            mobile=False)
            await page.call("Page.navigate", url=url)
            await asyncio.wait_for(page.loaded.wait(), 30)
            await asyncio.sleep(0.3)      # late console messages (CSP reports) arrive just after load
            got = await page.call("Runtime.evaluate", expression="document.documentElement.outerHTML",
                                  returnByValue=True)
            page.visit.html = got["result"]["value"]
            got = await page.call("Runtime.evaluate", returnByValue=True,
                                  expression="Array.from(document.querySelectorAll('a[href]'), a => a.href)")
            page.visit.links = got["result"]["value"]
            shot = await page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            page.visit.screenshot = base64.b64decode(shot["data"])
            pump.cancel()
            return page.visit


def visit(path: Path, width: int = 1200) -> Visit:
    """Open PATH (file://) in a fresh headless Chromium; what it did."""
    with tempfile.TemporaryDirectory(prefix="dsv4-chromium-", ignore_cleanup_errors=True) as profile:
        # its own process group: the browser and the helpers it starts end together
        proc = subprocess.Popen([chromium(), *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text().strip()):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"chromium did not open its DevTools port (exit {proc.poll()})")
                time.sleep(0.05)
            port = int(port_file.read_text().split()[0])
            return asyncio.run(_visit(port, path.resolve().as_uri(), width))
        finally:
            _end(proc)


def _end(proc: subprocess.Popen) -> None:
    """End the browser's process group (started by visit, named by its id), then reap it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(10)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:      # its helpers leave after the browser itself
                os.killpg(proc.pid, 0)
                time.sleep(0.05)
        except ProcessLookupError:
            break
        except subprocess.TimeoutExpired:
            continue
