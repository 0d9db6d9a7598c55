"""The hook for the watch's results (issue 38, built beside this page): when the watch has left
its state for a host on the control node as reports/<host>/watch.json, the page shows it; until
then the cards say there are no watch results. Only this module knows that file's shape, so the
watch can change it here alone.

The shape read (every key optional): {"results": [{"at": ISO time, "result": "passed" | "failed" |
"inconclusive", "why": text}, ...] oldest first, "drift": [file paths that differ] or null when
not checked, "state": a word such as "healthy" or "degraded"}."""

from __future__ import annotations

WATCH_FILE = "watch.json"


def watch_view(doc: dict | None) -> dict | None:
    """The watch's state as the page shows it: the last result in words, drift, every result."""
    if not isinstance(doc, dict):
        return None
    results = [{"at": str(r.get("at", "")), "result": str(r.get("result", "?")), "why": str(r.get("why", ""))}
               for r in doc.get("results") or [] if isinstance(r, dict)]
    last = results[-1] if results else None
    said = f"{last['result']} at {last['at'][:19].replace('T', ' ')}" if last else "no result yet"
    if doc.get("state"):
        said = f"{doc['state']}; last interval {said}"
    drift = doc.get("drift")
    return {"last": said, "results": results,
            "drift": [str(d) for d in drift] if isinstance(drift, list) else None}
