"""How a gate through the smg gateway was spread over the replicas (pure; docs/replicas.md,
"Which replica served the gate"): each replica's own `sglang:num_requests_total` read before and
after the gate, the difference per replica, and a warning when one replica served far less than
an even split would give it.

Why it is needed (measured on the twin, docs/tune.md): smg 1.13.0 routes a request that matches no
cached prefix (every one of the gate's random token-id prompts) by expected wait: the work it has
sent a replica since its last load poll (every 10 s) divided by that replica's
`sglang:gen_throughput` gauge, read as 2000 tok/s when it is 0. SGLang updates the gauge only while
it decodes and keeps the last value when idle, so a burst that reaches an idle set is split in the
ratio of whatever each replica reported last (a replica that has not decoded since its restart
reads 0, i.e. "fastest"). A gate through the gateway can then measure one replica's throughput
while it passes; only the replicas' own counters show it.
"""

from __future__ import annotations

import re
import shlex

from dsv4deploy.gate.prometheus import summed

COUNTER = re.compile(r"sglang[:_]num_requests_total(\{[^}]*\})?\s+(\S+)")
MARK = "@@dsv4deploy-replica "
SKEW_SHARE = 0.5      # warn when a replica served less than this fraction of an even split's share
MIN_REQUESTS = 8      # fewer requests through the gateway than this: too few to judge a split


def requests_total(metrics: str) -> int | None:
    """`sglang:num_requests_total` (SGLang's `sglang_` prefix too, every label set summed) in a
    /metrics text, or None when it has none (metrics off, or not SGLang)."""
    return summed(metrics, COUNTER, 2)


def counters_command(urls: list[str]) -> str:
    """One shell command (run on the host: the replicas listen on its loopback) that prints each
    replica's counter lines after a marker line naming its URL. /metrics needs no API key."""
    parts = [f"echo {shlex.quote(MARK + u)}; curl -s --noproxy '*' -m 5 {shlex.quote(u + '/metrics')} "
             "| grep -E '^sglang[:_]num_requests_total' " for u in urls]
    return "; ".join(parts) + "; true"


def parse_counters(out: str, urls: list[str]) -> dict[str, int | None]:
    """{url: requests served so far, or None when unreadable} from counters_command's output."""
    texts: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        if line.startswith(MARK):
            current = line[len(MARK):].strip()
            texts[current] = []
        elif current is not None:
            texts[current].append(line)
    return {u: requests_total("\n".join(texts.get(u, []))) for u in urls}


def split(urls: list[str], before: dict[str, int | None], after: dict[str, int | None]) -> list[dict]:
    """Per replica (in index order): its URL and the requests it served between the two reads;
    `requests` None when a read failed or the counter went back (the replica restarted meanwhile)."""
    out = []
    for i, u in enumerate(urls):
        b, a = before.get(u), after.get(u)
        n = a - b if a is not None and b is not None and a >= b else None
        out.append({"index": i, "url": u, "requests": n})
    return out


def describe(parts: list[dict]) -> str:
    """`requests per replica: 0: 123 (95%), 1: 7 (5%)`."""
    total = sum(p["requests"] or 0 for p in parts)
    shown = []
    for p in parts:
        n = p["requests"]
        shown.append(f"{p['index']}: unknown" if n is None else
                     f"{p['index']}: {n}" + (f" ({100 * n / total:.0f}%)" if total else ""))
    return "requests per replica: " + ", ".join(shown)


def busy_limit(n: int) -> float:
    """The busiest replica's time-weighted share of the requests in flight above which the spread
    is skewed: halfway between an even spread (1/n) and one replica holding them all (1.0)."""
    return (n + 1) / (2 * n)


def routing_lines(levels, n: int) -> tuple[list[str], list[str]]:
    """(lines, warnings) from each level's `routed` (the client's record of which replica the
    gateway named for each request): the spread over time, which the counters cannot show (two
    replicas can serve 65 requests each, one after the other, at one replica's throughput). No
    warning for a level with fewer than two requests in flight per replica (C=1 is all on one)."""
    lines, warns = [], []
    for lv in levels:
        routed = getattr(lv, "routed", None)
        if not routed or not n:
            continue
        share = routed.get("busiest_share")
        workers = routed.get("workers") or {}
        per = ", ".join(f"{url} {w.get('requests')} (peak {w.get('peak_in_flight')} in flight)"
                        for url, w in sorted(workers.items()))
        said = "n/a" if share is None else f"{100 * share:.0f}%"
        lines.append(f"{lv.label}: routed {per}; the busiest replica held {said} of the requests in flight "
                     f"(even spread: {100 / n:.0f}%)")
        # a level of fewer than two requests in flight per replica has no spread to judge
        small = lv.concurrency < 2 * n or sum(w.get("requests") or 0 for w in workers.values()) < MIN_REQUESTS
        if share is not None and not small and (share >= busy_limit(n) or len(workers) < n):
            warns.append(f"{lv.label}: the gateway kept {said} of the requests in flight on one replica on average "
                         f"(even spread: {100 / n:.0f}%, {len(workers)} of {n} replicas named): the throughput "
                         "measured is not the set's (docs/replicas.md, \"Which replica served the gate\")")
    return lines, warns


def warnings(parts: list[dict]) -> list[str]:
    """Loud lines when a replica served far less than its share of the gate (less than SKEW_SHARE of
    an even split), or when a replica's counter could not be read; none for a small gate."""
    if not parts:
        return []
    unknown = [p["index"] for p in parts if p["requests"] is None]
    if unknown:
        return [f"the split of the gate over the replicas is unknown: replica {', '.join(map(str, unknown))} "
                "gave no sglang:num_requests_total before and after (metrics off, unreachable, or restarted)"]
    total = sum(p["requests"] for p in parts)
    if total < MIN_REQUESTS:
        return []
    even = total / len(parts)
    out = []
    for p in parts:
        if p["requests"] < SKEW_SHARE * even:
            out.append(f"replica {p['index']} ({p['url']}) served {p['requests']} of the {total} requests the gate "
                       f"sent through the gateway ({100 * p['requests'] / total:.0f}%, an even split gives "
                       f"{100 / len(parts):.0f}%): the throughput measured is not the set's; smg's load-aware "
                       "routing split the burst by the replicas' stale sglang:gen_throughput (docs/replicas.md, "
                       "\"Which replica served the gate\")")
    return out
