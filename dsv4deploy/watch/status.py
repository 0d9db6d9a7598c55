"""`dsv4deploy status`: for each host, what serves (release, profile, since when), its units and
gateway, the watch's last intervals with their trend, the GPUs' health, and drift (files on the
host that differ from those the release wrote). One command per host reads it all; the rest is
pure (parse, judge, print), tested from recorded answers.

Exit code: 0 every host healthy, 1 one is degraded (a watch verdict, a GPU fault, drift, the watch
itself not running), 2 one is down (nothing serves, the watch says down, or the host is unreachable).
"""

from __future__ import annotations

import json
import time

from dsv4deploy.release import running_set
from dsv4deploy.render.layout import RELEASES
from dsv4deploy.watch import units as w
from dsv4deploy.watch.decide import INCONCLUSIVE, gpu_faults

HEALTHY, DEGRADED, DOWN = "healthy", "degraded", "down"
EXIT = {HEALTHY: 0, DEGRADED: 1, DOWN: 2}
_SEP = "@@dsv4-status@@"
_REC = "@@dsv4-record@@"
PARTS = ("records", "state", "config", "units", "drift", "events")


def command() -> str:
    """The one command that reads a host's status (as root: records, state, drift)."""
    live = (f"L=$(grep -l '\"status\": *\"deployed\"' {RELEASES}/*/status.json 2>/dev/null | sort | tail -n 1); "
            f"D=$(dirname \"${{L:-/nonexistent/x}}\")")
    units = (f"U=$(grep -o '\"unit\": *\"[^\"]*\"' {w.CONFIG} 2>/dev/null | cut -d'\"' -f4 | tr '\\n' ' ')")
    return "; ".join([
        live, units,
        f"echo {_SEP}; for f in {RELEASES}/*/status.json; do [ -f \"$f\" ] && cat \"$f\" && echo {_REC}; done",
        f"echo {_SEP}; cat {w.STATE_FILE} 2>/dev/null",
        f"echo {_SEP}; cat {w.CONFIG} 2>/dev/null",
        f"echo {_SEP}; systemctl show -p Id -p ActiveState -p ActiveEnterTimestamp $U {w.SERVICE}.timer "
        f"$(grep -o '\"gateway_unit\": *\"[^\"]*\"' {w.CONFIG} 2>/dev/null | cut -d'\"' -f4) 2>/dev/null",
        f"echo {_SEP}; [ -d \"$D/files\" ] && (cd \"$D/files\" && find . -type f | while read -r f; do "
        f"cmp -s \"$f\" \"/${{f#./}}\" || echo \"/${{f#./}}\"; done)",
        f"echo {_SEP}; tail -n 20 \"$D/watch-events.jsonl\" 2>/dev/null; true"])


def parse(out: str) -> dict:
    """The command's answer as data: records, watch state and settings, units, drift, events."""
    chunks = (out.split(_SEP) + [""] * 7)[1:7]
    doc = dict(zip(PARTS, chunks))
    records = []
    for text in doc["records"].split(_REC):
        rec = _json(text)
        if isinstance(rec, dict) and "release" in rec:
            records.append(rec)
    units, cur = [], {}
    for line in doc["units"].splitlines() + [""]:
        if not line.strip():
            if cur:
                units.append(cur)
            cur = {}
            continue
        k, _, v = line.partition("=")
        cur[k] = v
    return {"records": records, "state": _json(doc["state"]), "config": _json(doc["config"]), "units": units,
            "drift": [x for x in doc["drift"].splitlines() if x.startswith("/")],
            "events": [e for e in map(_json, doc["events"].splitlines()) if e]}


def _json(text: str):
    try:
        return json.loads(text) if text.strip() else None
    except ValueError:
        return None


def judge(host: str, doc: dict, now: float | None = None) -> dict:
    """One host's status: health, why, and what the table shows."""
    now = time.time() if now is None else now
    live = max((r for r in doc["records"] if r.get("status") == "deployed"), key=lambda r: r["release"], default=None)
    state, cfg = doc.get("state") or {}, doc.get("config") or {}
    if live and state.get("release") not in (None, live["release"]):
        state = {}                # the last release's intervals: none of this one's yet
    why: list[str] = []
    serving = [u for u in doc["units"] if u.get("Id") != f"{w.SERVICE}.timer"]
    timer = next((u for u in doc["units"] if u.get("Id") == f"{w.SERVICE}.timer"), None)
    health = HEALTHY
    if live is None:
        health, why = DOWN, ["no release is deployed"]
    down_units = [u["Id"] for u in serving if u.get("ActiveState") != "active"]
    if live and serving and len(down_units) == len(serving):
        health, why = DOWN, why + [f"{', '.join(down_units)} not active"]
    elif down_units:
        health, why = DEGRADED, why + [f"{', '.join(down_units)} not active"]
    verdict = state.get("health")
    if health != DOWN and verdict in (DEGRADED, DOWN):
        health = verdict if verdict == DOWN else DEGRADED
        why += [f"watch: {verdict}"] + [f"{n}: {t['degraded']}" for n, t in (state.get("targets") or {}).items()
                                        if t.get("degraded")]
    if live and (timer is None or timer.get("ActiveState") != "active"):
        health = DEGRADED if health == HEALTHY else health
        why.append("the watch's timer is not running")
    interval = (cfg.get("settings") or {}).get("interval_s", 60)
    if live and state.get("t") and now - state["t"] > 3 * interval + 60:
        health = DEGRADED if health == HEALTHY else health
        why.append(f"the watch last measured {now - state['t']:.0f} s ago")
    if doc["drift"]:
        health = DEGRADED if health == HEALTHY else health
        why.append(f"drift: {', '.join(doc['drift'])} differ from what release {live['release']:04d} wrote")
    gpus = (state.get("last_reading") or {}).get("gpus") or []
    sick = [f for g in gpus for f in gpu_faults(g, (cfg.get("settings") or {}).get("foreign_mib", 1024))]
    if sick and health == HEALTHY:
        health = DEGRADED
        why += sick
    return {"host": host, "health": health, "why": why,
            "release": live and live["release"], "profile": live and live["profile"],
            "since": live and live.get("updated"), "units": {u.get("Id"): u.get("ActiveState") for u in doc["units"]},
            "trend": {n: trend(t.get("history") or []) for n, t in (state.get("targets") or {}).items()},
            "last": {n: (t.get("history") or [{}])[-1] for n, t in (state.get("targets") or {}).items()},
            "probe": {t["name"]: t.get("probe") for t in (state.get("last_reading") or {}).get("targets", [])},
            "gpus": {"count": len(gpus), "faults": sick}, "drift": doc["drift"], "events": doc["events"][-5:],
            "watch": {"interval_s": interval, "last_t": state.get("t"), "verdict": verdict}}


def with_set(s: dict, view: dict | None) -> dict:
    """S with VIEW, the running replica set against the release that serves
    (release/running_set.py compare): a difference degrades a healthy host (the next deploy
    converges it; `make plan` says how)."""
    if view is None:
        return s
    found = [f"cannot be compared: {view['error']}"] if "error" in view else view["differences"]
    health = DEGRADED if found and s["health"] == HEALTHY else s["health"]
    return {**s, "set": view, "health": health, "why": s["why"] + [f"replica set: {d}" for d in found]}


def trend(history: list[dict]) -> str:
    """The last intervals as one letter each (P passed, F failed, . inconclusive), oldest first."""
    return "".join({"passed": "P", "failed": "F"}.get(h.get("verdict"), ".") for h in history[-20:])


def unreachable(host: str, error: str) -> dict:
    return {"host": host, "health": DOWN, "why": [f"unreachable: {error}"], "release": None, "profile": None,
            "since": None, "units": {}, "trend": {}, "last": {}, "probe": {}, "gpus": {"count": 0, "faults": []},
            "drift": [], "events": [], "watch": {}}


def exit_code(hosts: list[dict]) -> int:
    return max((EXIT[h["health"]] for h in hosts), default=0)


def lines(s: dict) -> list[str]:
    """One host's status as text."""
    head = (f"{s['host']}: {s['health'].upper()}" + (f" - release {s['release']:04d} ({s['profile']}) since "
                                                     f"{(s['since'] or '?')[:19].replace('T', ' ')}" if s["release"] else ""))
    out = [head] + [f"  ! {y}" for y in s["why"]]
    if s["units"]:
        out.append("  units: " + ", ".join(f"{u} {a}" for u, a in s["units"].items()))
    if s["release"] and not s["trend"] and s["watch"].get("interval_s"):
        out.append(f"  watch: no interval of this release yet (one every {s['watch']['interval_s']} s)")
    for name, tr in s["trend"].items():
        last = s["last"].get(name) or {}
        p = s["probe"].get(name) or {}
        fig = (f"TTFT {p['ttft_ms']:.0f} ms, TPOT {p['tpot_ms']:.1f} ms" if p.get("tpot_ms") and p.get("ttft_ms")
               else "no probe figure")
        said = "; ".join(last.get("reasons") or [])[:160]
        out.append(f"  watch {name}: {last.get('verdict', '-')} ({fig}) trend {tr or '-'}" + (f" - {said}" if said else ""))
    g = s["gpus"]
    if g["count"]:
        out.append(f"  GPUs: {g['count']} watched, " + ("healthy" if not g["faults"] else "; ".join(g["faults"])))
    out.append("  drift: " + (", ".join(s["drift"]) if s["drift"] else "none"))
    view = s.get("set")
    if view and "error" in view:
        out.append(f"  replica set of release {view['release']:04d}: cannot be compared: {view['error']}")
    elif view:
        out += running_set.lines(view, view.get("release"))
    for e in s["events"]:
        out.append(f"  watch acted {e.get('at', '?')[:19]}: {e.get('action')} {e.get('target')}: {e.get('done')}")
    return out


def not_conclusive(history: list[dict]) -> bool:
    """Whether every interval kept was inconclusive (the watch could not judge yet)."""
    return all(h.get("verdict") == INCONCLUSIVE for h in history)
