"""Sickness a twin server can catch while it runs, for the watch (docs/watch.md, "The twin can be
sick"): unlike faults.py (read once at start), this file is read again whenever it changes, so a
test or the bench switches a fault on and off under a running server.

``/etc/dsv4deploy-twin/sick.json`` (env ``DSV4_TWIN_SICK`` overrides the path), all keys optional:

``slowdown`` (float >= 1)   every batch takes this many times longer (1.67: 40% less throughput).
``hang`` (bool)             user generations never start (the request waits), while /health,
                            which SGLang answers from its own 1-token generation, stays 200.
``errors_after_s`` (float)  this many seconds after the file was written, every user generation
                            fails (HTTP 500, or an error chunk mid-stream).
A missing or empty file: healthy.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

DEFAULT_PATH = "/etc/dsv4deploy-twin/sick.json"
ENV = "DSV4_TWIN_SICK"
RECHECK_S = 0.2


class Sickness:
    """The switched-on sickness, read again at most every RECHECK_S when the file changed."""

    def __init__(self, path: str | None = None):
        self.path = Path(path or os.environ.get(ENV) or DEFAULT_PATH)
        self._mtime: float | None = None
        self._doc: dict = {}
        self._checked = 0.0

    def doc(self) -> dict:
        now = time.monotonic()
        if now - self._checked < RECHECK_S:
            return self._doc
        self._checked = now
        try:
            mtime = self.path.stat().st_mtime
        except OSError:
            self._mtime, self._doc = None, {}
            return self._doc
        if mtime != self._mtime:
            try:
                doc = json.loads(self.path.read_text() or "{}")
            except (OSError, ValueError):
                doc = {}
            self._mtime, self._doc = mtime, doc if isinstance(doc, dict) else {}
        return self._doc

    def slowdown(self) -> float:
        return max(1.0, float(self.doc().get("slowdown") or 1.0))

    def hangs(self) -> bool:
        return bool(self.doc().get("hang"))

    def errors(self) -> bool:
        after = self.doc().get("errors_after_s")
        return after is not None and self._mtime is not None and time.time() - self._mtime >= float(after)
