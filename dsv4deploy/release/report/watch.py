"""The watch's results on the page (issue 38's watch, docs/watch.md). The watch runs on the host by
itself and keeps only its last 20 intervals in its state; every interval it also writes one line
per target to the journal of dsv4-watch.service, and what it did to dsv4-watch-act's. So the
report reads, in one command per host, what `dsv4deploy status` reads (the judged health, trend,
drift) and the journal's lines since the last read, and keeps every interval it has read in
reports/<host>/watch.json: the page then shows the results over time, also for a host that
cannot be reached now (as last read). Only this module knows the lines' and the file's shape.

Pure: command text out, the host's answer and the kept file in, the kept file and the page's
view out."""

from __future__ import annotations

import datetime as dt
import re

from dsv4deploy.watch import status
from dsv4deploy.watch.units import ACT, SERVICE

WATCH_FILE = "watch.json"
KEEP_RESULTS = 5000          # intervals kept on the control node per host, newest (3.5 days of one target)
KEEP_EVENTS = 200
JOURNAL_LINES = 3000         # journal lines read at most per report (the newest)
_MARK = "@@dsv4-report-journal@@"

# `journalctl -o short-unix`: "<epoch.micro> <host> <identifier>[<pid>]: <message>"; the messages
# are agent.py's and act.py's prints
_LINE = re.compile(r"^(\d+(?:\.\d+)?) \S+ [^:]*: (.*)\Z")
_RESULT = re.compile(r"^watch (\S+): (passed|failed|inconclusive)(?: \(([a-z]+)\))?; (.*?)(?: \[(\d+)/(\d+) failed\])?\Z")
_PROBE = re.compile(r"^probe TTFT (\S+) ms TPOT (\S+) ms\Z")
_ACT = re.compile(r"^watch (act|decides): (.*)\Z")


def command(since: float | None) -> str:
    """What `dsv4deploy status` reads, then the watch's journal lines after SINCE (epoch s; None:
    the newest JOURNAL_LINES)."""
    after = f" --since @{int(since)}" if since else ""
    # systemd's own lines (starting, finished) are three of every four: left out before the cut
    return (f"{status.command()}; echo {_MARK}; journalctl -u {SERVICE}.service -u {ACT}.service -o short-unix "
            f"--no-pager -q{after} -n {4 * JOURNAL_LINES} 2>/dev/null | grep -F ': watch ' | tail -n {JOURNAL_LINES}; true")


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).replace(microsecond=0).isoformat()


def journal(text: str) -> tuple[list[dict], list[dict]]:
    """(results, events) of the journal's lines: one result per target and interval
    {t, at, target, result, cause, why, failed_in_row, ttft_ms, tpot_ms}; each action decided or
    done {t, at, said}."""
    results, events = [], []
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        t, message = float(m.group(1)), m.group(2)
        r = _RESULT.match(message)
        if r:
            probe = _PROBE.match(r.group(4))
            results.append({"t": t, "at": iso(t), "target": r.group(1), "result": r.group(2), "cause": r.group(3),
                            "why": "" if probe else r.group(4),
                            "failed_in_row": f"{r.group(5)}/{r.group(6)}" if r.group(5) else None,
                            "ttft_ms": _num(probe.group(1)) if probe else None,
                            "tpot_ms": _num(probe.group(2)) if probe else None})
            continue
        a = _ACT.match(message)
        if a:
            events.append({"t": t, "at": iso(t), "said": f"{'decided' if a.group(1) == 'decides' else 'acted'}: {a.group(2)}"})
    return results, events


def answered(text: str) -> bool:
    """Whether the command ran to its journal part (else the kept file stays as it was)."""
    return _MARK in text


def split_answer(text: str) -> tuple[str, str]:
    """The command's answer as (status part, journal part)."""
    head, _, tail = text.partition(_MARK)
    return head, tail


def last_t(doc: dict | None) -> float | None:
    """When the newest interval kept was logged (where the next read starts)."""
    times = [r["t"] for r in (doc or {}).get("results") or [] if isinstance(r, dict) and isinstance(r.get("t"), (int, float))]
    return max(times, default=None)


def _merge(old: list, new: list, keep: int, key) -> list:
    seen, out = set(), []
    for item in sorted([x for x in old if isinstance(x, dict)] + new, key=lambda x: x.get("t") or 0):
        k = key(item)
        if k not in seen:
            seen.add(k)
            out.append(item)
    return out[-keep:]


def merged(previous: dict | None, answer: str, host: str, read_at: str) -> dict:
    """The watch.json to keep: the host's status now (judged as `dsv4deploy status` does) and
    every interval and action read so far, this read's added."""
    head, tail = split_answer(answer)
    judged = status.judge(host, status.parse(head))
    results, events = journal(tail)
    previous = previous or {}
    return {"host": host, "read_at": read_at,
            "status": {k: judged[k] for k in ("health", "why", "release", "profile", "trend", "drift", "watch")},
            "results": _merge(previous.get("results") or [], results, KEEP_RESULTS,
                              lambda r: (r.get("t"), r.get("target"))),
            "events": _merge(previous.get("events") or [], events, KEEP_EVENTS, lambda e: (e.get("t"), e.get("said")))}


def _when(stamp: str) -> str:
    return (stamp or "")[:19].replace("T", " ")


def watch_view(doc: dict | None) -> dict | None:
    """What the card and the host page show of a kept watch.json; None: never read."""
    if not isinstance(doc, dict) or not isinstance(doc.get("status"), dict):
        return None
    st, results = doc["status"], [r for r in doc.get("results") or [] if isinstance(r, dict)]
    conclusive = [r for r in results if r.get("result") != "inconclusive"]
    verdict = (st.get("watch") or {}).get("verdict")
    last = results[-1] if results else None
    said = f"the watch says {verdict}" if verdict else "no verdict from the watch"
    said += (f"; last interval {last['result']} at {_when(last['at'])} UTC ({last['target']})" if last
             else "; no interval in the journal yet")
    trend = st.get("trend") or {}
    if trend:
        said += " (trend, oldest first: " + ", ".join(f"{n} {t or '-'}" for n, t in trend.items()) + ")"
    counts = {k: sum(1 for r in results if r.get("result") == k) for k in ("passed", "failed", "inconclusive")}
    return {"read_at": doc.get("read_at"), "last": said, "health": st.get("health"), "why": st.get("why") or [],
            "drift": st.get("drift") if isinstance(st.get("drift"), list) else None, "results": results,
            "recent": results[-40:][::-1], "counts": counts, "conclusive": len(conclusive),
            "since": results[0]["at"] if results else None, "events": (doc.get("events") or [])[::-1],
            "interval_s": (st.get("watch") or {}).get("interval_s")}
