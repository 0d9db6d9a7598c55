"""The token engine: drives :mod:`perf`'s batched scheduler in wall time, logs SGLang's prefill
and decode lines, and makes the tokens themselves, deterministic per prompt (``token_id``,
``token_text``).  ``ReqGroup`` holds the requests of one HTTP call and their text so far.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from typing import Any

from ct200twin.server.logs import Log
from ct200twin.server.perf import IDLE_WAKE_S, PerfConfig, Req, Scheduler
from ct200twin.server.vocab import WORDS

VOCAB_SIZE = 129280


def _seed(obj: Any) -> int:
    return zlib.crc32(json.dumps(obj, sort_keys=True, default=str).encode()) & 0xFFFFFFFF


def token_id(seed: int, i: int) -> int:
    return (seed * 2654435761 + (i + 1) * 40503) % VOCAB_SIZE


def token_text(tok: int) -> str:
    return " " + WORDS[tok % len(WORDS)]


class Engine:
    """Drives perf.Scheduler in wall time: sleeps to absolute deadlines (no drift)."""

    def __init__(self, cfg: PerfConfig, log: Log, decode_log_interval: int = 40,
                 graph_max_bs: int = 0):
        self.cfg = cfg
        self.sched = Scheduler(cfg)
        self.log = log
        self.decode_log_interval = max(1, decode_log_interval)
        self.graph_max_bs = graph_max_bs
        self.wake = asyncio.Event()
        self.gen_throughput = 0.0
        self._last_log_t: float | None = None
        self._last_log_tokens = 0
        self.ttft: list[float] = []
        self.e2e: list[float] = []
        self.task: asyncio.Task | None = None
        self.sick = None            # sickness.Sickness: a slowdown switched on while it runs

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run())

    def submit(self, req: Req) -> None:
        req.t_arrival = asyncio.get_running_loop().time()
        self.sched.add(req)
        self.wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        base: float | None = None
        sched = self.sched
        while True:
            batch = sched.plan()
            if batch is None:
                self.wake.clear()
                await self.wake.wait()
                await asyncio.sleep(IDLE_WAKE_S)
                base = None
                continue
            now = loop.time()
            if base is None or now - base > 0.25:  # idle gap, or the loop was blocked: restart
                base = now
            deadline = base + batch.cost_s * (self.sick.slowdown() if self.sick else 1.0)
            delay = deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.log.level <= 10:
                self.log.debug(f"batch {batch.kind} n={len(batch.reqs)} cost={batch.cost_s * 1000:.1f}ms "
                               f"late={(loop.time() - deadline) * 1000:.2f}ms t={loop.time():.4f}", tp=True)
            base = deadline
            if batch.kind == "prefill":
                self._log_prefill(batch)
            touched = sched.finish(batch, loop.time())
            for r in touched:
                if r.finished and not r.internal:
                    if r.t_first is not None:
                        self.ttft.append(r.t_first - r.t_arrival)
                    if r.t_done is not None:
                        self.e2e.append(r.t_done - r.t_arrival)
            if batch.kind == "decode" and sched.decode_steps % self.decode_log_interval == 0:
                self._log_decode(loop.time())

    def _log_prefill(self, batch) -> None:
        s = self.sched
        self.log.info(
            f"Prefill batch. #new-seq: {len(batch.reqs)}, #new-token: {sum(r.input_len for r in batch.reqs)}, "
            f"#cached-token: 0, token usage: {self.token_usage():.2f}, #running-req: {len(s.running)}, "
            f"#queue-req: {len(s.waiting)}", tp=True)

    def _log_decode(self, t: float) -> None:
        s = self.sched
        if self._last_log_t is not None and t > self._last_log_t:
            self.gen_throughput = (s.generated_tokens - self._last_log_tokens) / (t - self._last_log_t)
        self._last_log_t = t
        self._last_log_tokens = s.generated_tokens
        n = len(s.running)
        graph = bool(self.graph_max_bs) and n <= self.graph_max_bs
        self.log.info(
            f"Decode batch. #running-req: {n}, #token: {s.kv_used}, token usage: {self.token_usage():.2f}, "
            f"cuda graph: {graph}, gen throughput (token/s): {self.gen_throughput:.2f}, "
            f"#queue-req: {len(s.waiting)}", tp=True)

    def token_usage(self) -> float:
        return self.sched.kv_used / max(1, self.cfg.max_total_num_tokens)


class ReqGroup:
    """Requests of one HTTP call; one event wakes the handler whenever any of them progresses."""

    def __init__(self):
        self.event = asyncio.Event()
        self.reqs: list[Req] = []
        self.seeds: list[int] = []
        self.texts: list[str] = []
        self.ids: list[list[int]] = []

    def add(self, req: Req, seed: int) -> None:
        req.notify = self._notify
        self.reqs.append(req)
        self.seeds.append(seed)
        self.texts.append("")
        self.ids.append([])

    def _notify(self, _req: Req) -> None:
        self.event.set()

    def sync(self, i: int) -> str:
        """Bring text/ids of request i up to its generated count; returns the new text (delta)."""
        r = self.reqs[i]
        ids = self.ids[i]
        delta = []
        while len(ids) < r.generated:
            t = token_id(self.seeds[i], len(ids))
            ids.append(t)
            delta.append(token_text(t))
        d = "".join(delta)
        self.texts[i] += d
        return d

    def abort_unfinished(self) -> None:
        for r in self.reqs:
            if not r.finished:
                r.aborted = True
