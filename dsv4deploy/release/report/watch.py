"""The hook for the watch's results (issue 38, built beside this page): when the watch's state for
a host is on the control node as reports/<host>/watch.json, the page shows it; until then the
cards say there are no watch results. Only this module knows that file's shape, so the watch can
change it here alone.

Two shapes are read (every key optional):
- one host's entry of `dsv4deploy status --json`: {"health", "why": [...], "trend": {target:
  "PPF."}, "last": {target: {"verdict", "t", ...}}, "drift": [...]};
- a plain list of results: {"results": [{"at": ISO time, "result": "passed" | "failed" |
  "inconclusive", "why": text}, ...] oldest first, "drift": [...] or null when not checked,
  "state": a word such as "healthy" or "degraded"}."""

from __future__ import annotations

import datetime as dt

WATCH_FILE = "watch.json"


def _when(value) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return dt.datetime.fromtimestamp(value, dt.timezone.utc).replace(microsecond=0).isoformat()
    return str(value or "")


def _result(r: dict, target: str = "") -> dict:
    said = str(r.get("why") or r.get("reason") or "")
    return {"at": _when(r.get("at") or r.get("t")), "result": str(r.get("result") or r.get("verdict") or "?"),
            "why": f"{target}: {said}" if target and said else (target or said)}


def watch_view(doc: dict | None) -> dict | None:
    """The watch's state as the page shows it: the last result in words, drift, every result."""
    if not isinstance(doc, dict):
        return None
    results = [_result(r) for r in doc.get("results") or [] if isinstance(r, dict)]
    if isinstance(doc.get("last"), dict):        # a `dsv4deploy status --json` entry
        results += [_result(r, str(name)) for name, r in doc["last"].items() if isinstance(r, dict) and r]
    last = results[-1] if results else None
    said = f"{last['result']} at {last['at'][:19].replace('T', ' ')}" if last else "no result yet"
    state = doc.get("state") or doc.get("health")
    if state:
        said = f"{state}; last interval {said}"
    trend = doc.get("trend")
    if isinstance(trend, dict) and trend:
        said += " (trend, oldest first: " + ", ".join(f"{n} {t}" for n, t in trend.items()) + ")"
    drift = doc.get("drift")
    return {"last": said, "results": results,
            "drift": [str(d) for d in drift] if isinstance(drift, list) else None}
