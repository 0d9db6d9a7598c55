#!/usr/bin/env python3
# dsv4deploy host program: runs on the GPU host with its own python3; standard library only.
"""dsv4deploy gate client: a self-contained, stdlib-only (Python 3.10+) streaming benchmark
client for SGLang's native ``/generate``, uploaded to the host and run there with the system
``python3`` (the server listens on 127.0.0.1).  It imports nothing from dsv4deploy.

Methodology = ``sglang.benchmark.serving --backend sglang --dataset-name random-ids
--random-range-ratio 1.0 --max-concurrency C --request-rate inf``: each request sends
``input_ids`` (random token ids, exactly input_len), ``sampling_params`` {max_new_tokens:
output_len, ignore_eos: true, temperature: 0}, ``stream: true``; at most C in flight, each
completion sends the next.  Output tokens are the server's ``meta_info.completion_tokens`` of the
last chunk; TTFT = first chunk with a token; ITL = time between chunks divided over the tokens
they carry; TPOT = (e2e - ttft) / (tokens - 1); throughput = tokens of completed requests / wall
duration of the timed part.  Warm-up requests (min(output_len, 32) tokens, sent together) come
first and are not timed.

Early stop (per level, when it has a floor on output tok/s):
  (a) bound: output throughput = N*L / T_end and T_end >= now, so the level is over when
      N*L / (t + R / r) < floor, R = tokens still to come, r = an optimistic rate for them:
      infinite (they come instantly) until the warm-up share below, afterwards HEADROOM x the
      best rate seen over any >= 2 s window.
  (b) running: after a warm-up share of the level (>= MIN_SHARE of its requests done or
      >= MIN_SECONDS), tokens streamed / t < MARGIN x floor.
  The running rate counts from the moment all of the first C requests stream, and only once
  every slot has streamed STEADY_ROUNDS more tokens on average (or nothing came for STALL_S):
  a decode step of a slow server at high concurrency (the 1M-context baseline at C=64: ~2.1 s)
  is longer than any fixed window, and a rate read between two steps would be near zero. It
  ends at the last token that arrived, not at the tick that reads it, for the same reason.
  Failed requests beyond --max-failed stop the level too; --budget-s bounds the whole run
  (in-flight requests are cancelled and their sockets closed; SIGALRM is a last resort).

Early pass (per level with a floor, --early-pass-margin M): once at least --early-pass-min
completed requests (default: the level's concurrency, at least 2) give an output throughput
(completed tokens / time, the same formula as a full run) >= (1 + M) x floor, with no failure
beyond --max-failed and p99 TTFT/TPOT <= ceiling / (1 + M), the level has clearly passed: the rest
is not sent and in-flight requests are cancelled. Levels near their floor run to the end.

Usage:
  python3 client.py --base-url http://127.0.0.1:30000 --levels '[{"concurrency": 64,
      "num_prompts": 128, "input_len": 256, "output_len": 256, "min_output_throughput": 400}]'
      [--api-key-fd 3] [--warmup-requests 2] [--max-failed 0] [--budget-s 1800]
      [--fail-fast] [--no-early-stop] [--seed 42] [--heartbeat-s 1]
With --heartbeat-s S the client writes one newline to stderr every S seconds and exits at once
(status 141, in-flight requests cut) when that write fails: the SSH session that started it is
gone (the control node was killed or lost its link), and nothing of the gate may keep loading the
server after the run that started it.
The API key is read from the file descriptor named by --api-key-fd (opened by the calling shell,
before it drops privileges), never from argv or the environment.
Prints ONE JSON document on stdout (the gate result); progress lines go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import os
import random
import resource
import signal
import ssl
import sys
import time
from urllib.parse import urlsplit

SCHEMA = "dsv4deploy.gate.result/1"
WARMUP_OUTPUT_LEN = 32
TICK_S = 0.2            # early-stop / budget check interval
RATE_WINDOW_S = 2.0     # windows for the best (peak) aggregate rate
MIN_SHARE = 0.2         # (b) warm-up share: this fraction of the level's requests done ...
MIN_SECONDS = 10.0      # ... or this many seconds into the level
MARGIN = 0.5            # (b) running throughput below MARGIN x floor stops the level
HEADROOM = 1.5          # (a) after the warm-up share, remaining tokens at HEADROOM x best rate
STEADY_ROUNDS = 2       # the running rate is read once each slot streamed this many more tokens ...
STALL_S = 10.0          # ... or when no token came for this long (a stalled server)
CT_KEY = b'"completion_tokens":'
ROUTED_HEADER = b"x-smg-routed-worker-id"   # smg names the worker that served each request
STAT_KEYS = ("mean", "median", "std", "p90", "p95", "p99", "max")
MAX_ERRORS = 5


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def seconds(value: float) -> str:
    """5.999 -> '6', 0.5 -> '0.5': a budget as a person wrote it."""
    return f"{value:.1f}".rstrip("0").rstrip(".")


def budget_named(opts) -> str:
    """The gate's budget as the profile sets it (--gate-budget-s), which messages name; --budget-s
    is what is left of it when this client starts (its deadline)."""
    return seconds(opts.budget_s if opts.gate_budget_s is None else opts.gate_budget_s)


def log(msg: str) -> None:
    sys.stderr.write(f"[gate {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


def percentile(v: list, q: float):
    n = len(v)
    if not n:
        return None
    pos = (n - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def stats_ms(values_s: list) -> dict:
    if not values_s:
        return {k: None for k in STAT_KEYS}
    v = sorted(x * 1000.0 for x in values_s)
    n = len(v)
    mean = sum(v) / n
    return {"mean": mean, "median": percentile(v, 50), "std": (sum((x - mean) ** 2 for x in v) / n) ** 0.5,
            "p90": percentile(v, 90), "p95": percentile(v, 95), "p99": percentile(v, 99), "max": v[-1]}


class RequestError(Exception):
    pass


class StaleConnection(Exception):
    """A kept-alive connection the server had closed: nothing was answered, safe to resend."""


class Rec:
    __slots__ = ("ok", "ttft", "e2e", "out", "itls", "error", "t_end", "t_start", "worker")

    def __init__(self):
        self.ok = False
        self.ttft = None
        self.e2e = None
        self.out = 0
        self.itls = []
        self.error = None
        self.t_end = 0.0
        self.t_start = 0.0
        self.worker = None      # the replica a gateway routed it to (ROUTED_HEADER), when it says


def routing(recs: list) -> dict | None:
    """Where a gateway sent the level's requests, from ROUTED_HEADER (None: no gateway named a
    worker): per worker its requests, completed ones, output tokens and peak in flight, and
    `busiest_share`, the time-weighted mean over the level of the busiest worker's share of the
    requests in flight (1/N when the gateway spread them evenly, 1.0 when one worker held them all
    at every moment, even if the totals came out even)."""
    named = [r for r in recs if r.worker]
    if not named:
        return None
    workers: dict = {}
    events = []
    for r in named:
        w = workers.setdefault(r.worker, {"requests": 0, "completed": 0, "output_tokens": 0, "peak_in_flight": 0})
        w["requests"] += 1
        if r.ok:
            w["completed"] += 1
            w["output_tokens"] += r.out
        events += [(r.t_start, 1, r.worker), (r.t_end, -1, r.worker)]
    events.sort(key=lambda e: (e[0], e[1]))
    now = dict.fromkeys(workers, 0)
    weighted = span = 0.0
    last = None
    for t, step, name in events:
        total = sum(now.values())
        if last is not None and total > 0 and t > last:
            weighted += (t - last) * max(now.values()) / total
            span += t - last
        now[name] += step
        workers[name]["peak_in_flight"] = max(workers[name]["peak_in_flight"], now[name])
        last = t
    return {"header": ROUTED_HEADER.decode(), "workers": workers,
            "busiest_share": round(weighted / span, 4) if span > 0 else None}


class Conn:
    __slots__ = ("reader", "writer", "uses")

    def __init__(self):
        self.reader = None
        self.writer = None
        self.uses = 0

    def close(self) -> None:
        if self.writer is not None:
            try:
                self.writer.transport.abort()
            except Exception:
                pass
        self.reader = self.writer = None
        self.uses = 0


class Target:
    def __init__(self, base_url: str, api_key: str | None):
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https"):
            raise SystemExit(f"--base-url must be http(s)://host:port, not {base_url!r}")
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if u.scheme == "https" else None
        self.path = (u.path.rstrip("/") or "") + "/generate"
        host_hdr = self.host if self.port in (80, 443) else f"{self.host}:{self.port}"
        auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        self.head = (f"POST {self.path} HTTP/1.1\r\nHost: {host_hdr}\r\nUser-Agent: dsv4deploy-gate\r\n"
                     f"Accept: text/event-stream\r\nContent-Type: application/json\r\n{auth}")

    def request_bytes(self, ids: list, output_len: int) -> bytes:
        body = json.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": output_len,
                           "ignore_eos": True, "temperature": 0.0}, "stream": True},
                          separators=(",", ":")).encode()
        return (self.head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    async def open(self, conn: Conn) -> None:
        conn.reader, conn.writer = await asyncio.open_connection(self.host, self.port, ssl=self.ssl,
                                                                 limit=1 << 22)
        conn.uses = 0


async def _read_head(reader) -> tuple[int, dict]:
    line = await reader.readline()
    if not line:
        raise StaleConnection("connection closed before the response")
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise RequestError(f"bad status line {line[:80]!r}")
    code = int(parts[1])
    headers = {}
    while True:
        h = await reader.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        k, _, v = h.partition(b":")
        headers[k.strip().lower()] = v.strip().lower()
    return code, headers


class Level:
    """One level: warm-up, C workers over persistent connections, a monitor for early stop
    and the budget.  State is kept on the object so a cancelled level still reports."""

    def __init__(self, spec: dict, target: Target, opts, deadline: float, index: int):
        self.c = int(spec["concurrency"])
        self.n = int(spec["num_prompts"])
        self.in_len = int(spec.get("input_len") or 256)
        self.out_len = int(spec.get("output_len") or 256)
        self.floor = spec.get("min_output_throughput")
        self.floor = float(self.floor) if self.floor else None
        self.spec = spec
        self.t = target
        self.o = opts
        self.deadline = deadline
        rng = random.Random(opts.seed + 7919 * index)
        self.payloads = [target.request_bytes([rng.randrange(100, 100000) for _ in range(self.in_len)],
                                              self.out_len) for _ in range(self.n)]
        self.warm_payload = target.request_bytes([rng.randrange(100, 100000) for _ in range(self.in_len)],
                                                 min(self.out_len, WARMUP_OUTPUT_LEN))
        self.recs: list[Rec] = []
        self.next = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.streamed = 0
        self.completed = 0
        self.failed = 0
        self.errors: collections.Counter = collections.Counter()
        self.status = "ok"
        self.reason = None
        self.early = None
        self.stop = asyncio.Event()
        self.t0 = None
        self.t_stop = None
        self.cpu0 = None
        self.cpu1 = None
        self.first_wave = min(self.c, self.n)
        self.first_tokens = 0
        self.t_steady = None   # s into the level when all of the first C requests stream
        self.g_steady = 0
        self.t_last = None     # s into the level when the last timed token arrived
        self.started_at = None
        self.best_rate = 0.0
        self.warmup_failed = 0
        self.warmup_s = None
        self.conns: list[Conn] = []

    @property
    def label(self) -> str:
        return f"C={self.c}"

    # ------------------------------------------------------------------ one request
    async def request(self, conn: Conn, payload: bytes, timed: bool) -> Rec:
        rec = Rec()
        t0 = rec.t_start = time.perf_counter()
        for attempt in (0, 1):
            reused = conn.writer is not None and conn.uses > 0
            try:
                await self._exchange(conn, payload, rec, t0, timed)
            except StaleConnection as e:
                conn.close()
                if attempt == 0 and reused:
                    continue  # the server had closed the idle keep-alive connection: resend once
                rec.error = f"connection: {e}"
            except (ConnectionError, OSError, asyncio.IncompleteReadError) as e:
                conn.close()
                rec.error = f"connection: {type(e).__name__}: {e}".rstrip(": ")
            except RequestError as e:
                conn.close()
                rec.error = str(e)
            except asyncio.CancelledError:
                conn.close()
                raise
            except Exception as e:  # a malformed answer: count it, never crash the level
                conn.close()
                rec.error = f"{type(e).__name__}: {e}"
            break
        rec.t_end = time.perf_counter()
        if rec.ok:
            rec.e2e = rec.t_end - t0
        return rec

    async def _exchange(self, conn: Conn, payload: bytes, rec: Rec, t0: float, timed: bool) -> None:
        reused = conn.writer is not None and conn.uses > 0
        if conn.writer is None:
            await self.t.open(conn)
        reader = conn.reader
        try:
            conn.writer.write(payload)
            await conn.writer.drain()
            code, headers = await _read_head(reader)
        except (ConnectionError, OSError, asyncio.IncompleteReadError) as e:
            if reused:
                raise StaleConnection(f"{type(e).__name__}: {e}") from None
            raise
        conn.uses += 1
        if ROUTED_HEADER in headers:
            rec.worker = headers[ROUTED_HEADER].decode("ascii", "replace")
        chunked = b"chunked" in headers.get(b"transfer-encoding", b"")
        length = int(headers[b"content-length"]) if (not chunked and b"content-length" in headers) else None
        keep = headers.get(b"connection", b"") != b"close"
        if code != 200:
            body = b""
            if length is not None:
                body = await reader.readexactly(length)
            elif chunked:
                size = int((await reader.readline()).split(b";", 1)[0].strip() or b"0", 16)
                body = await reader.readexactly(size) if size else b""
            conn.close()
            raise RequestError(f"HTTP {code}: {body[:200].decode('utf-8', 'replace').strip()}")
        buf = b""
        last_ct = 0
        last_ts = t0
        last_payload = None
        done = False
        while True:
            if chunked:
                if done:  # after [DONE] only the terminating chunk should follow: do not wait long
                    try:
                        line = await asyncio.wait_for(reader.readline(), 5.0)
                    except asyncio.TimeoutError:
                        keep = False
                        break
                else:
                    line = await reader.readline()
                if not line:
                    if done:
                        keep = False
                        break
                    raise ConnectionError("connection closed mid-stream")
                size = int(line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                piece = (await reader.readexactly(size + 2))[:-2]
            elif length is not None:
                if length <= 0:
                    break
                piece = await reader.read(min(length, 1 << 16))
                if not piece:
                    raise ConnectionError("connection closed mid-stream")
                length -= len(piece)
            else:
                piece = await reader.read(1 << 16)
                if not piece:
                    keep = False
                    break
            if b"\r" in piece:
                piece = piece.replace(b"\r\n", b"\n")
            buf += piece
            while True:
                i = buf.find(b"\n\n")
                if i < 0:
                    break
                event = buf[:i]
                buf = buf[i + 2:]
                for line in event.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        continue
                    if data.startswith(b'{"error"'):
                        try:
                            err = json.loads(data)["error"]
                            msg = err.get("message") if isinstance(err, dict) else str(err)
                        except Exception:
                            msg = data[:200].decode("utf-8", "replace")
                        raise RequestError(f"server error mid-stream: {msg}")
                    k = data.rfind(CT_KEY)
                    if k >= 0:
                        j = k + len(CT_KEY)
                        while data[j:j + 1] == b" ":
                            j += 1
                        e = j
                        while data[e:e + 1].isdigit():
                            e += 1
                        ct = int(data[j:e]) if e > j else last_ct + 1
                    else:
                        ct = last_ct + 1
                    if ct > last_ct:
                        now = time.perf_counter()
                        if rec.ttft is None:
                            rec.ttft = now - t0
                            if timed:
                                self.first_tokens += 1
                                if self.first_tokens == self.first_wave and self.t0 is not None:
                                    self.t_steady = now - self.t0
                                    self.g_steady = self.streamed
                        else:
                            new = ct - last_ct
                            rec.itls.extend([(now - last_ts) / new] * new)
                        last_ts = now
                        if timed:
                            self.streamed += ct - last_ct
                            if self.t0 is not None:
                                self.t_last = now - self.t0
                        last_ct = ct
                    last_payload = data
        if not keep:
            conn.close()
        if last_payload is None:
            raise RequestError("stream ended without any token")
        meta = json.loads(last_payload).get("meta_info") or {}
        fr = meta.get("finish_reason")
        if not done and not fr:
            raise RequestError(f"stream ended early after {last_ct} tokens")
        if isinstance(fr, dict) and fr.get("type") == "abort":
            raise RequestError(f"aborted by the server: {fr.get('message') or fr}")
        rec.out = int(meta.get("completion_tokens", last_ct))
        rec.ok = True

    # ------------------------------------------------------------------ control
    def halt(self, status: str, reason: str, rule: str | None = None) -> None:
        if self.stop.is_set():
            return
        self.status = status
        self.reason = reason
        self.t_stop = time.perf_counter()
        if rule:
            self.early = {"rule": rule, "at_s": round(self.t_stop - self.t0, 3) if self.t0 else 0.0,
                          "requests_done": self.completed + self.failed, "streamed_tokens": self.streamed,
                          "best_rate": round(self.best_rate, 3),
                          "steady_at_s": None if self.t_steady is None else round(self.t_steady, 3)}
        self.stop.set()
        log(f"{self.label}: {status}: {reason}")

    async def worker(self, conn: Conn) -> None:
        while not self.stop.is_set() and self.next < self.n:
            i = self.next
            self.next += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                rec = await self.request(conn, self.payloads[i], True)
            finally:
                self.in_flight -= 1
            self.recs.append(rec)
            if rec.ok:
                self.completed += 1
            else:
                self.failed += 1
                if len(self.errors) < MAX_ERRORS or rec.error in self.errors:
                    self.errors[rec.error] += 1
                if self.failed > self.o.max_failed:
                    self.halt("failed", f"{self.failed} failed request{'' if self.failed == 1 else 's'} > max "
                                        f"{self.o.max_failed} (last: {rec.error})")

    async def monitor(self) -> None:
        samples: collections.deque = collections.deque()
        total = self.n * self.out_len
        need = max(1, math.ceil(MIN_SHARE * self.n))
        while not self.stop.is_set():
            await asyncio.sleep(TICK_S)
            now = time.perf_counter()
            if now >= self.deadline:
                self.halt("budget", f"gate budget {budget_named(self.o)} s exhausted during {self.label} "
                                    f"({self.completed + self.failed}/{self.n} requests done)")
                return
            t = now - self.t0
            g = self.streamed
            ts = self.t_steady
            if ts is not None:  # peak rate over >= RATE_WINDOW_S windows, once every slot decodes
                samples.append((t, g))
                while len(samples) > 2 and t - samples[1][0] >= RATE_WINDOW_S:
                    samples.popleft()
                if t - samples[0][0] >= RATE_WINDOW_S:
                    self.best_rate = max(self.best_rate, (g - samples[0][1]) / (t - samples[0][0]))
            if not self.floor or not self.o.early_stop or t <= 0:
                continue
            # warm-up share: MIN_SHARE of the requests done, or MIN_SECONDS in and the level fully
            # loaded (all of the first C requests streaming) for at least one rate window
            running, settled = steady_rate(t, g, ts, self.g_steady, self.t_last, self.first_wave)
            share = (self.completed + self.failed) >= need or (
                settled and t >= MIN_SECONDS and t - ts >= RATE_WINDOW_S)
            remaining = max(0, total - g)
            rate = HEADROOM * max(self.best_rate, running) if share else 0.0
            bound = total / (t + (remaining / rate if rate > 0 else 0.0))
            if bound < self.floor:
                how = (f"the remaining {remaining} tokens at {rate:.1f} tok/s ({HEADROOM:g}x the best "
                       f"rate seen)" if rate > 0 else f"the remaining {remaining} tokens instantly")
                self.halt("early_stop", f"cannot reach the floor: even with {how}, output throughput "
                                        f"would be at most {bound:.1f} tok/s < floor {self.floor:g} tok/s "
                                        f"(after {t:.1f} s)", "bound")
                return
            if self.o.early_pass_margin is not None and self._passed_early(t):
                return
            if share and running < MARGIN * self.floor:
                self.halt("early_stop", f"running output throughput {running:.1f} tok/s after {t:.1f} s "
                                        f"({self.completed + self.failed}/{self.n} requests done) is below "
                                        f"{MARGIN:.0%} of the floor {self.floor:g} tok/s", "running")
                return

    def _passed_early(self, t: float) -> bool:
        """Early pass: enough completed requests, clearly above the floor and under the ceilings."""
        m = self.o.early_pass_margin
        need = self.o.early_pass_min or max(2, self.c)
        if self.completed < min(need, self.n) or self.completed >= self.n or self.failed > self.o.max_failed:
            return False
        ok = [r for r in self.recs if r.ok]
        rate = sum(r.out for r in ok) / t
        if rate < (1 + m) * self.floor:
            return False
        for key, values in (("max_p99_ttft_ms", [r.ttft for r in ok if r.ttft is not None]),
                            ("max_p99_tpot_ms", [(r.e2e - r.ttft) / (r.out - 1) for r in ok
                                                 if r.out > 1 and r.ttft is not None])):
            ceiling = self.spec.get(key)
            if ceiling and (not values or percentile(sorted(values), 99) * 1000.0 > float(ceiling) / (1 + m)):
                return False
        self.halt("ok", f"passed early: {rate:.1f} tok/s over {self.completed}/{self.n} completed requests "
                        f">= {1 + m:.2f} x floor {self.floor:g} tok/s (after {t:.1f} s)", "pass")
        return True

    async def _until_deadline(self, aws: list) -> bool:
        """Wait for all of aws; False (and cancel them) if the budget runs out first."""
        tasks = [asyncio.ensure_future(a) for a in aws]
        if not tasks:
            return True
        done, pending = await asyncio.wait(tasks, timeout=max(0.0, self.deadline - time.perf_counter()))
        if pending:
            for p in pending:
                p.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            return False
        return True

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            for c in self.conns:
                c.close()

    async def _run(self) -> None:
        log(f"{self.label}: {self.n} prompts, {self.in_len}/{self.out_len} tokens"
            + (f", floor {self.floor:g} tok/s" if self.floor else ""))
        w = self.o.warmup_requests
        if w > 0:
            tw = time.perf_counter()
            conns = [Conn() for _ in range(w)]
            self.conns.extend(conns)
            results: list = []

            async def warm(c):
                results.append(await self.request(c, self.warm_payload, False))

            ok = await self._until_deadline([warm(c) for c in conns])
            for c in conns:
                c.close()
            self.warmup_s = time.perf_counter() - tw
            if not ok:
                self.status, self.reason = "budget", (f"gate budget {budget_named(self.o)} s exhausted during "
                                                      f"{self.label} warm-up")
                return
            self.warmup_failed = sum(1 for r in results if not r.ok)
            if results and self.warmup_failed == len(results):
                self.status, self.reason = "failed", f"warm-up failed: {results[0].error}"
                log(f"{self.label}: {self.reason}")
                return
        # open the C keep-alive connections before the clock starts (as a pooled client has them)
        self.conns = [Conn() for _ in range(min(self.c, self.n))]

        async def pre_open(c):
            try:
                await self.t.open(c)
            except (OSError, ConnectionError):
                c.close()

        if not await self._until_deadline([pre_open(c) for c in self.conns]):
            self.status, self.reason = "budget", f"gate budget {budget_named(self.o)} s exhausted during {self.label}"
            return
        self.started_at = time.time()
        self.cpu0 = _cpu()
        self.t0 = time.perf_counter()
        workers = [asyncio.ensure_future(self.worker(c)) for c in self.conns]
        mon = asyncio.ensure_future(self.monitor())
        stopper = asyncio.ensure_future(self.stop.wait())
        all_done = asyncio.ensure_future(asyncio.gather(*workers, return_exceptions=True))
        try:
            await asyncio.wait({all_done, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if self.t_stop is None:
                self.t_stop = time.perf_counter()
            self.cpu1 = _cpu()
            for tsk in (*workers, mon, stopper):
                tsk.cancel()
            await asyncio.gather(*workers, mon, stopper, all_done, return_exceptions=True)

    def running_rate(self, dur: float) -> float:
        """Output tok/s streamed (in-flight requests included) since all of the first C requests
        were streaming (see steady_rate), or since the start when that never settled."""
        rate, settled = steady_rate(dur, self.streamed, self.t_steady, self.g_steady, self.t_last, self.first_wave)
        if settled:
            return rate
        return self.streamed / dur if dur > 0 else 0.0

    def result(self) -> dict:
        dur = ((self.t_stop or time.perf_counter()) - self.t0) if self.t0 else 0.0
        ok = [r for r in self.recs if r.ok]
        out = sum(r.out for r in ok)
        inp = self.in_len * len(ok)
        tpots = [(r.e2e - r.ttft) / (r.out - 1) for r in ok if r.out > 1 and r.ttft is not None]
        itls = [x for r in ok for x in r.itls]
        cpu = ((self.cpu1 or _cpu()) - self.cpu0) if self.cpu0 is not None else None
        status = self.status
        passed_early = bool(self.early and self.early.get("rule") == "pass")
        if status == "ok" and self.completed + self.failed < self.n and self.t0 and not passed_early:
            status, self.reason = "failed", self.reason or "level ended before all requests were sent"
        return {
            "concurrency": self.c, "num_prompts": self.n, "input_len": self.in_len, "output_len": self.out_len,
            "status": status, "reason": self.reason, "completed": len(ok), "failed": self.failed,
            "duration_s": dur, "total_input_tokens": inp, "total_output_tokens": out,
            "request_throughput": len(ok) / dur if dur > 0 else 0.0,
            "input_throughput": inp / dur if dur > 0 else 0.0,
            "output_throughput": out / dur if dur > 0 else 0.0,
            "total_throughput": (inp + out) / dur if dur > 0 else 0.0,
            "ttft_ms": stats_ms([r.ttft for r in ok if r.ttft is not None]),
            "tpot_ms": stats_ms(tpots), "itl_ms": stats_ms(itls), "e2e_ms": stats_ms([r.e2e for r in ok]),
            "streamed_output_tokens": self.streamed,
            "running_output_throughput": self.running_rate(dur),
            "peak_output_throughput": self.best_rate or None, "max_in_flight": self.max_in_flight,
            "warmup_requests": self.o.warmup_requests, "warmup_failed": self.warmup_failed,
            "warmup_s": self.warmup_s, "started_at": self.started_at,
            "client_cpu_s": cpu, "client_cpu_share": (cpu / dur) if (cpu is not None and dur > 0) else None,
            "early_stop": self.early,
            "errors": [{"message": m, "count": c} for m, c in self.errors.most_common(MAX_ERRORS)],
            "extra": {}, "routed": routing(self.recs),
        }


def steady_rate(t: float, streamed: int, t_steady: float | None, g_steady: int, t_last: float | None,
                wave: int) -> tuple[float, bool]:
    """(output tok/s since the level became steady, whether that rate can be trusted yet).

    Steady = all of the first `wave` requests stream (t_steady, with g_steady tokens by then).
    The rate is trusted once each slot streamed STEADY_ROUNDS more tokens on average, and then
    ends at the last token that arrived (t_last): tokens come a decode step at a time, and a
    step can be longer than any fixed window. With no token for STALL_S it ends now instead,
    so a stalled server reads as slow. Before that: the rate since the start, not trusted."""
    if t_steady is None or t <= t_steady:
        return (streamed / t if t > 0 else 0.0), False
    more = streamed - g_steady
    stalled = t - (t_last if t_last is not None else t_steady) >= STALL_S
    if stalled:
        return more / (t - t_steady), True
    if more < STEADY_ROUNDS * max(1, wave) or t_last is None or t_last <= t_steady:
        return more / (t - t_steady), False
    return more / (t_last - t_steady), True


def _skipped(spec: dict, reason: str, warmup: int) -> dict:
    return {"concurrency": int(spec["concurrency"]), "num_prompts": int(spec["num_prompts"]),
            "input_len": int(spec.get("input_len") or 256), "output_len": int(spec.get("output_len") or 256),
            "status": "skipped", "reason": reason, "warmup_requests": warmup}


def _level_ok(res: dict, spec: dict, max_failed: int) -> bool:
    """For --fail-fast only (the controller's verdict is the authority)."""
    if res["status"] != "ok" or res["failed"] > max_failed:
        return False
    floor = spec.get("min_output_throughput")
    if floor and res["output_throughput"] < float(floor):
        return False
    for key, stat in (("max_p99_ttft_ms", "ttft_ms"), ("max_p99_tpot_ms", "tpot_ms")):
        lim, obs = spec.get(key), res[stat]["p99"]
        if lim and obs is not None and obs > float(lim):
            return False
    return True


def _read_key(fd: int) -> str | None:
    with os.fdopen(fd, "r", encoding="utf-8", closefd=True) as f:
        return f.read().strip() or None


async def run_gate(opts, levels: list) -> dict:
    api_key = _read_key(opts.api_key_fd) if opts.api_key_fd is not None else None
    target = Target(opts.base_url, api_key or None)
    t_start = time.perf_counter()
    wall0 = time.time()
    cpu0 = _cpu()
    deadline = t_start + opts.budget_s
    out: list = []
    skip_reason = None
    budget_hit = False
    for i, spec in enumerate(levels):
        if skip_reason:
            out.append(_skipped(spec, skip_reason, opts.warmup_requests))
            continue
        lv = Level(spec, target, opts, deadline, i)
        try:
            await asyncio.wait_for(lv.run(), timeout=max(0.5, deadline - time.perf_counter() + 5.0))
        except asyncio.TimeoutError:  # belt and braces: monitor and warm-up honour the deadline
            lv.status, lv.reason = "budget", f"gate budget {budget_named(opts)} s exhausted during {lv.label}"
        res = lv.result()
        out.append(res)
        log(f"{lv.label}: {res['status']}: {res['completed']}/{res['num_prompts']} ok, {res['failed']} failed, "
            f"{res['output_throughput']:.1f} tok/s over {res['duration_s']:.1f} s"
            + (f", client CPU {100 * res['client_cpu_share']:.1f}%" if res.get("client_cpu_share") is not None else ""))
        if res["status"] == "budget":
            budget_hit = True
            skip_reason = f"not run: gate budget {budget_named(opts)} s exhausted"
        elif opts.fail_fast and not _level_ok(res, spec, opts.max_failed):
            skip_reason = f"not run: gate stopped after C={lv.c} failed (fail fast)"
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "schema": SCHEMA, "runner": "builtin", "base_url": opts.base_url, "levels": out,
        "started_at": wall0, "wall_s": time.perf_counter() - t_start, "budget_s": opts.budget_s,
        "budget_exhausted": budget_hit, "error": None,
        "client": {"python": sys.version.split()[0], "pid": os.getpid(), "uid": os.getuid(), "cpu_s": _cpu() - cpu0,
                   "cpu_user_s": ru.ru_utime, "cpu_sys_s": ru.ru_stime, "max_rss_kib": ru.ru_maxrss,
                   "api_key": bool(api_key), "seed": opts.seed, "fail_fast": opts.fail_fast,
                   "warmup_output_len": WARMUP_OUTPUT_LEN,
                   "early_pass": {"margin": opts.early_pass_margin, "min_requests": opts.early_pass_min},
                   "early_stop": {"enabled": opts.early_stop, "min_share": MIN_SHARE, "min_seconds": MIN_SECONDS,
                                  "margin": MARGIN, "headroom": HEADROOM, "rate_window_s": RATE_WINDOW_S}},
    }


HEARTBEAT_EXIT = 141   # as a shell reports a process killed by SIGPIPE


def start_heartbeat(interval_s: float, fd: int = 2) -> None:
    """Write one newline to `fd` every `interval_s` from a daemon thread; when the write fails
    (EPIPE: the reader, sshd's channel or sudo's relay, is gone) leave at once with os._exit, so
    the sockets close and the server stops generating for this client. A thread, so a busy event
    loop cannot delay it."""
    import threading

    def beat() -> None:
        while True:
            time.sleep(interval_s)
            try:
                os.write(fd, b"\n")
            except OSError:
                os._exit(HEARTBEAT_EXIT)

    threading.Thread(target=beat, name="heartbeat", daemon=True).start()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True)
    p.add_argument("--levels", required=True, help="JSON list of levels (or @file)")
    p.add_argument("--api-key-fd", type=int, default=None, help="inherited file descriptor holding the API key")
    p.add_argument("--warmup-requests", type=int, default=2)
    p.add_argument("--max-failed", type=int, default=0)
    p.add_argument("--budget-s", type=float, default=1800.0, help="seconds this client may run (its deadline)")
    p.add_argument("--gate-budget-s", type=float, default=None,
                   help="the gate's budget as the profile sets it, named in messages (default: --budget-s)")
    p.add_argument("--fail-fast", action="store_true")
    p.add_argument("--no-early-stop", dest="early_stop", action="store_false")
    p.add_argument("--early-pass-margin", type=float, default=None,
                   help="stop a level once it is this fraction above its floor (default: run to the end)")
    p.add_argument("--early-pass-min", type=int, default=None,
                   help="completed requests before an early pass (default: the concurrency, at least 2)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--heartbeat-s", type=float, default=0.0,
                   help="write a newline to stderr this often; exit when it fails (the session is gone)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    opts = parse_args(argv)
    text = opts.levels
    if text.startswith("@"):
        with open(text[1:]) as f:
            text = f.read()
    levels = json.loads(text)
    if not isinstance(levels, list) or not levels:
        print("--levels must be a non-empty JSON list", file=sys.stderr)
        return 2
    # last resort: whatever happens, this process is gone shortly after the budget
    if hasattr(signal, "SIGALRM"):
        signal.alarm(int(opts.budget_s + 20))
    if opts.heartbeat_s > 0:
        start_heartbeat(opts.heartbeat_s)
    doc = asyncio.run(run_gate(opts, levels))
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
