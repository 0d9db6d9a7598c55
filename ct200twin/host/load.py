"""A constant streaming load on the twin's public endpoint while something changes behind it
(bench/rolling.py, the replica tests): C clients, each sending the next request as soon as its
last one ends, random 256/256 token ids on SGLang's streaming /generate, the way users see it.
"random 256/256" as SGLang's bench_serving samples it by default (`--random-range-ratio 0.0`):
each request's input and output length uniform in 1..256 (range_ratio=1.0: exactly 256 each,
the gate's methodology; equal requests then finish in waves).

A request counts as failed on any non-200 answer, a transport error, an error chunk (smg sends
one, then `[DONE]`, when a replica is cut off mid-stream) or fewer tokens than asked. Gaps are
measured on the clients' clock: the longest time between two completions, and the longest time
in which no token arrived on any stream.

Loopback only: the twin shares this machine's loopback (the rules: load goes to loopback
addresses of this machine).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import random
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ct200twin.server.perf import sse_data


def longest_gap(times: list[float], since: float, until: float) -> tuple[float, float]:
    """(length, start) of the longest gap between TIMES within [since, until], edges included."""
    points = [since] + sorted(t for t in times if since <= t <= until) + [until]
    return max((b - a, a) for a, b in zip(points, points[1:]))


def windows_over(times: list[float], since: float, until: float, window_s: float, bound_s: float,
                 step_s: float = 1.0) -> tuple[int, int, float]:
    """How a steady run's completions look through every window of WINDOW_S that fits in
    [since, until], started STEP_S apart: (windows, windows whose longest gap exceeds BOUND_S, the
    median longest gap). What any rollout that keeps the load on that capacity for WINDOW_S
    would show at best (bench/rolling.py's floor row)."""
    longest = []
    start = since
    while start + window_s <= until:
        longest.append(longest_gap(times, start, start + window_s)[0])
        start += step_s
    if not longest:
        raise ValueError(f"no window of {window_s:g} s fits in a run of {until - since:g} s")
    longest.sort()
    return len(longest), sum(g > bound_s for g in longest), longest[len(longest) // 2]


@dataclass
class LoadResult:
    sent: int = 0
    completed: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    completions: list[float] = field(default_factory=list)    # monotonic times
    tokens_at: list[float] = field(default_factory=list)      # a sample of token arrival times
    started: float = 0.0
    ended: float = 0.0

    def max_gap_s(self, since: float | None = None, until: float | None = None) -> float:
        """The longest time between two completions in [since, until] (edges included)."""
        return self._gap(self.completions, since, until)

    def max_token_gap_s(self, since: float | None = None, until: float | None = None) -> float:
        return self._gap(self.tokens_at, since, until)

    def _gap(self, times: list[float], since: float | None, until: float | None) -> float:
        return longest_gap(times, self.started if since is None else since, self.ended if until is None else until)[0]


def _loopback(url: str) -> None:
    host = urlsplit(url).hostname or ""
    if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
        raise ValueError(f"load goes to loopback addresses only, not {url}")


class StreamingLoad:
    """Start with `start()`, stop with `stop()` (waits for the requests in flight): a LoadResult."""

    def __init__(self, url: str, concurrency: int = 32, input_len: int = 256, output_len: int = 256,
                 api_key: str | None = None, seed: int = 7, request_timeout_s: float = 600.0,
                 stagger_s: float = 15.0, range_ratio: float = 0.0):
        _loopback(url)
        self.url, self.c, self.input_len, self.output_len = url.rstrip("/"), concurrency, input_len, output_len
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._rng = random.Random(seed)
        self._timeout = request_timeout_s
        self.stagger_s = stagger_s
        self.range_ratio = range_ratio
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.result = LoadResult()

    def start(self) -> "StreamingLoad":
        self.result.started = time.monotonic()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="streaming-load", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 900.0) -> LoadResult:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout_s)
        self.result.ended = time.monotonic()
        return self.result

    async def _main(self) -> None:
        import aiohttp

        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=self._timeout)) as s:
            # clients start spread over `stagger_s`: equal requests started together would finish
            # together and run in lockstep, and completions would come in waves, not as a stream
            await asyncio.gather(*(self._client(s, i * self.stagger_s / self.c) for i in range(self.c)))

    async def _client(self, session, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        while not self._stop.is_set():
            await self._one(session)

    async def _one(self, session) -> None:
        r = self.result
        lo = lambda n: max(1, int(n * self.range_ratio))  # noqa: E731
        asked = self._rng.randint(lo(self.output_len), self.output_len)
        ids = [self._rng.randrange(100, 120000) for _ in range(self._rng.randint(lo(self.input_len), self.input_len))]
        body = {"input_ids": ids, "stream": True,
                "sampling_params": {"max_new_tokens": asked, "ignore_eos": True, "temperature": 0.0}}
        r.sent += 1
        tokens, problem = 0, None
        try:
            async with session.post(f"{self.url}/generate", json=body, headers=self._headers) as resp:
                if resp.status != 200:
                    problem = f"HTTP {resp.status}: {(await resp.read())[:200]!r}"
                else:
                    async for data in sse_data(resp):
                        if "error" in data:
                            problem = f"error chunk: {json.dumps(data['error'])[:200]}"
                            break
                        got = data.get("meta_info", {}).get("completion_tokens", tokens)
                        if got != tokens:
                            r.tokens_at.append(time.monotonic())
                        tokens = got
        except Exception as exc:  # noqa: BLE001 - any transport failure is a failed request
            problem = f"{type(exc).__name__}: {exc}"[:200]
        if problem is None and tokens < asked:
            problem = f"stream ended after {tokens} of {asked} tokens"
        if problem:
            r.failed += 1
            r.errors.append(problem)
        else:
            r.completed += 1
            r.completions.append(time.monotonic())


def main(argv=None) -> int:
    """`python -m ct200twin.host.load --url URL [...]`: the load until SIGTERM or SIGINT, then its
    figures as one JSON line. The API key comes on stdin (never argv). Run it inside an isolated
    twin's network namespace (`ip netns exec NS ...`) to reach that twin's loopback."""
    import argparse
    import signal
    import sys

    ap = argparse.ArgumentParser(prog="python -m ct200twin.host.load", description=main.__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--stagger-s", type=float, default=15.0)
    ap.add_argument("--key-stdin", action="store_true", help="read the API key from stdin's first line")
    args = ap.parse_args(argv)
    key = sys.stdin.readline().strip() if args.key_stdin else None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    load = StreamingLoad(args.url, concurrency=args.concurrency, input_len=args.input_len,
                         output_len=args.output_len, api_key=key or None, stagger_s=args.stagger_s).start()
    print("started", flush=True)
    stop.wait()
    r = load.stop()
    print(json.dumps({"sent": r.sent, "completed": r.completed, "failed": r.failed, "errors": r.errors[:20],
                      "max_gap_s": r.max_gap_s(), "max_token_gap_s": r.max_token_gap_s()}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
