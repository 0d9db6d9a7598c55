"""The twin's performance model and THE calibration (constants, what they reproduce, sources).

Model (SGLang's scheduler, reduced to what the campaign measured)
-----------------------------------------------------------------
One batched loop over the running requests, as SGLang's scheduler runs it:

* If requests wait, there is room (``--max-running-requests``, KV pool) and we are at a
  scheduling point, run ONE prefill batch (SGLang prefers prefill): requests are taken FIFO
  while their prompt tokens fit ``--chunked-prefill-size`` (at least one).  It costs
  ``PREFILL_FIXED_S + sum(prompt_tokens * PREFILL_PER_TOKEN_S + PREFILL_CTX_PASSES *
  DECODE_PER_REQ_CTX_TOKEN_S * context_length)`` and yields each request's first token.
  Decode is stalled meanwhile (no mixed chunks by default).
* Else run a decode step over all ``n`` running requests, one token each:
  ``step(n) = DECODE_FIXED_S + n * (DECODE_PER_REQ_S + DECODE_PER_REQ_CTX_TOKEN_S *
  context_length)`` where ``context_length`` is the CONFIGURED ``--context-length`` (model max,
  1,048,576 for DeepSeek-V4, when unset): the DSV4 indexer's torch fallback on sm_120 scored
  the whole configured context every step, whatever the real sequence length (the campaign's
  finding).
* ``--num-continuous-decode-steps``: accepted and shown in ``/server_info``, and changes NOTHING.
  SGLang 0.5.12-0.5.23 declare the flag but never read it (the PR that would wire it up was
  closed unmerged), so the campaign's "4 continuous decode steps" ran exactly like 1; the
  scheduler looks at the queue before every step.
* TP size: deliberately NEUTRAL for speed.  Every measured number is from TP4, and no
  measurement separates TP sizes; the bottleneck (indexer fallback + per-layer launch/
  all-reduce latency) did not shrink with more GPUs.  TP matters to the memory model only.
* CUDA-graph batch size, NCCL env, MoE runner: no speed effect (no measurement to fit).  The
  campaign's "10-20 % better at best, capped near 28" for its tuning together (NCCL LL+Ring,
  graphs, and a decode-steps flag that did nothing) is not modelled.

Calibration
-----------
Reference argv (the campaign's launch script after msg 12416, which the scaling series of
msg 12519 ran with): TP4, ``--mem-fraction-static 0.70``, ``--cuda-graph-max-bs-decode 32``,
``--num-continuous-decode-steps 4`` (never read, so no effect), ``--moe-runner-backend marlin``;
default context (~1M) for the scaling series, ``--context-length 8192`` for the 531.7 point.
Sources: ``reference/seeds/`` msg 12416 and 12519/12520; BRIEF "The measured numbers".

1. "step ~ 40 ms + 31 ms per running request" at ~1M context (msg 12519):
   ``DECODE_FIXED_S = 40 ms``; ``DECODE_PER_REQ_S + DECODE_PER_REQ_CTX_TOKEN_S * 1048576
   = 31 ms``.  C=1 step = 71 ms (msg 12519: "71 ms/step").
2. C=64 with ``--context-length 8192``: 531.7 tok/s (msg 12520) fixes the split of those 31 ms
   into a context-proportional part and the rest (fitted by bisection, prefill included):
   ``DECODE_PER_REQ_CTX_TOKEN_S = 2.869e-8 s`` (30.08 ms per request at 1M, 0.235 ms at 8192)
   and ``DECODE_PER_REQ_S = 0.916 ms``.  Step at C=64, 8192: 40 + 64*1.151 = 113.7 ms.
   ("capping cut this work by ~128x": 1048576/8192 = 128.)
3. Prefill: ``PREFILL_PER_TOKEN_S`` = 0.1 ms (10k prompt tok/s, an assumption; TTFT was not
   recorded) and a context-proportional prefill term, ``PREFILL_CTX_PASSES`` = 8 indexer passes
   over the configured context per prefilled request (0.24 s at 1M, 1.9 ms at 8192).  It is
   FITTED, not measured: without it the linear step model gives 31.5 tok/s at C=64 where the
   campaign measured 29.7; 8 passes is the minimax over the four default-context numbers
   (max error 3.5 %; 6 passes 4.2 %, 10 passes 3.9 %).
4. ``IDLE_WAKE_S`` = 5 ms: an idle scheduler picks a new request up 5 ms later, so requests
   sent together are prefilled together (SGLang's tokenizer -> scheduler hop).

What the constants reproduce (random 256/256, campaign prompt counts; "model" is the
virtual-time prediction of :func:`simulate_bench`, "twin" was measured client-side over HTTP
by ``python bench/twin_calibration.py``).  Removing the invented continuous-decode-steps gain
(k=4 was 38 + 8/4 ms fixed and admission every 4th step) left the model column unchanged to the
last digit: in these closed loops the requests run in waves of equal length.  The twin column
was measured before that change (the reference argv still carried the flag).

    configuration            C   n    campaign   model    twin
    default context (~1M)    1   8    ~14        13.90    13.88
    default context (~1M)    8   32   ~28        27.08    27.06
    default context (~1M)   16   48   ~30        29.05    29.03
    default context (~1M)   64   128  29.7       30.73    30.72
    --context-length 8192   64   128  531.7      531.44   529.88
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

# ---------------------------------------------------------------------------- THE calibration
DECODE_FIXED_S = 0.040              # per decode step (launches, per-layer all-reduce, scheduler round)
DECODE_PER_REQ_S = 0.000916         # per running request per step, context-independent
DECODE_PER_REQ_CTX_TOKEN_S = 2.869e-8  # per running request per step per CONFIGURED context token
PREFILL_FIXED_S = 0.040             # per prefill batch (one forward)
PREFILL_PER_TOKEN_S = 0.0001        # per prompt token
PREFILL_CTX_PASSES = 8.0            # indexer passes over the configured context per prefilled request
IDLE_WAKE_S = 0.005                 # an idle scheduler sees a new request this much later (tokenizer ->
                                    # scheduler hop), so requests sent together are prefilled together

DSV4_MAX_CONTEXT = 1048576
CAMPAIGN = {  # (context, concurrency, num_prompts) -> measured output tok/s (client side)
    ("default", 1, 8): 14.0,
    ("default", 8, 32): 28.0,
    ("default", 16, 48): 30.0,
    ("default", 64, 128): 29.7,
    (8192, 64, 128): 531.7,
}
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PerfConfig:
    context_length: int = DSV4_MAX_CONTEXT
    max_running_requests: int = 256
    chunked_prefill_size: int = 8192
    max_prefill_tokens: int = 16384
    max_total_num_tokens: int = 10**9
    tp_size: int = 1

    def decode_step_s(self, n_running: int) -> float:
        per_req = DECODE_PER_REQ_S + DECODE_PER_REQ_CTX_TOKEN_S * self.context_length
        return DECODE_FIXED_S + n_running * per_req

    def prefill_req_s(self, prompt_tokens: int) -> float:
        return (prompt_tokens * PREFILL_PER_TOKEN_S
                + PREFILL_CTX_PASSES * DECODE_PER_REQ_CTX_TOKEN_S * self.context_length)

    def prefill_batch_s(self, prompt_lens: list[int]) -> float:
        return PREFILL_FIXED_S + sum(self.prefill_req_s(n) for n in prompt_lens)

    @property
    def prefill_budget(self) -> int:
        return self.chunked_prefill_size if self.chunked_prefill_size and self.chunked_prefill_size > 0 \
            else self.max_prefill_tokens


@dataclass(eq=False)
class Req:
    """One generation request inside the scheduler."""
    rid: str
    input_len: int
    max_new_tokens: int
    t_arrival: float = 0.0
    fail_at: int | None = None        # fault knob: fail after this many output tokens
    generated: int = 0
    finished: bool = False
    failed: bool = False
    aborted: bool = False
    t_first: float | None = None
    t_done: float | None = None
    notify: Callable[["Req"], None] | None = field(default=None, repr=False)
    internal: bool = False            # health/warmup generations (not counted as user requests)

    @property
    def reserve(self) -> int:
        return self.input_len + self.max_new_tokens


@dataclass
class Batch:
    kind: str               # "prefill" | "decode"
    reqs: list[Req]
    cost_s: float


class Scheduler:
    """SGLang-like batch scheduler, clock-free: plan() picks the next batch and its cost,
    finish(batch, t) applies it at time t.  The server drives it in wall time, simulate_bench()
    in virtual time, so the prediction and the server are the same code."""

    def __init__(self, cfg: PerfConfig):
        self.cfg = cfg
        self.waiting: collections.deque[Req] = collections.deque()
        self.running: list[Req] = []
        self.kv_used = 0
        self.decode_steps = 0
        self.generated_tokens = 0
        self.prompt_tokens = 0
        self.last_kind = ""

    def add(self, req: Req) -> None:
        self.waiting.append(req)

    def idle(self) -> bool:
        return not self.waiting and not self.running

    def _drop_aborted(self) -> None:
        if any(r.aborted for r in self.waiting):
            self.waiting = collections.deque(r for r in self.waiting if not r.aborted)
        if any(r.aborted for r in self.running):
            for r in self.running:
                if r.aborted:
                    self.kv_used -= r.reserve
            self.running = [r for r in self.running if not r.aborted]

    def plan(self) -> Batch | None:
        self._drop_aborted()
        cfg = self.cfg
        if self.waiting and len(self.running) < cfg.max_running_requests:
            picked: list[Req] = []
            tokens = 0
            kv = self.kv_used
            while self.waiting and len(self.running) + len(picked) < cfg.max_running_requests:
                r = self.waiting[0]
                if picked and tokens + r.input_len > cfg.prefill_budget:
                    break
                if (picked or self.running) and kv + r.reserve > cfg.max_total_num_tokens:
                    break
                self.waiting.popleft()
                picked.append(r)
                tokens += r.input_len
                kv += r.reserve
            if picked:
                return Batch("prefill", picked, cfg.prefill_batch_s([r.input_len for r in picked]))
        if self.running:
            return Batch("decode", list(self.running), cfg.decode_step_s(len(self.running)))
        return None

    def _emit(self, r: Req, t: float) -> None:
        r.generated += 1
        self.generated_tokens += 1
        if r.t_first is None:
            r.t_first = t
        if r.fail_at is not None and r.generated >= r.fail_at:
            r.failed = r.finished = True
        elif r.generated >= r.max_new_tokens:
            r.finished = True
        if r.finished:
            r.t_done = t

    def finish(self, batch: Batch, t: float) -> list[Req]:
        """Apply a batch that ended at time t; returns the requests that got a token."""
        self.last_kind = batch.kind
        touched = []
        if batch.kind == "prefill":
            for r in batch.reqs:
                if r.aborted:
                    continue
                self.prompt_tokens += r.input_len
                self.kv_used += r.reserve
                self._emit(r, t)
                if not r.finished:
                    self.running.append(r)
                else:
                    self.kv_used -= r.reserve
                touched.append(r)
        else:
            self.decode_steps += 1
            for r in batch.reqs:
                if r.aborted or r.finished:
                    continue
                self._emit(r, t)
                touched.append(r)
            if any(r.finished for r in self.running):
                for r in self.running:
                    if r.finished:
                        self.kv_used -= r.reserve
                self.running = [r for r in self.running if not r.finished]
        for r in touched:
            if r.notify is not None:
                r.notify(r)
        return touched


@dataclass
class BenchResult:
    duration_s: float
    completed: int
    output_tokens: int

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else 0.0


def simulate_bench(cfg: PerfConfig, concurrency: int, num_prompts: int, input_len: int = 256,
                   output_len: int = 256, client_rtt_s: float = 0.001) -> BenchResult:
    """Virtual-time closed-loop benchmark (bench_serving with --max-concurrency C, request rate
    inf): C requests start at t=0, each completion immediately sends the next."""
    sched = Scheduler(cfg)
    t = 0.0
    sent = 0
    done = 0
    pending: list[tuple[float, Req]] = []

    def send(at: float) -> None:
        nonlocal sent
        pending.append((at, Req(rid=str(sent), input_len=input_len, max_new_tokens=output_len, t_arrival=at)))
        sent += 1

    for _ in range(min(concurrency, num_prompts)):
        send(client_rtt_s)
    while done < num_prompts:
        # deliver arrivals that happened by now
        pending.sort(key=lambda p: p[0])
        while pending and pending[0][0] <= t + 1e-12:
            sched.add(pending.pop(0)[1])
        batch = sched.plan()
        if batch is None:  # idle: the scheduler notices the next arrival IDLE_WAKE_S later
            t = pending[0][0] + IDLE_WAKE_S
            while pending and pending[0][0] <= t + 1e-12:
                sched.add(pending.pop(0)[1])
            continue
        t += batch.cost_s
        for r in sched.finish(batch, t):
            if r.finished:
                done += 1
                if sent < num_prompts:
                    send(t + client_rtt_s)
    return BenchResult(duration_s=t, completed=done, output_tokens=done * output_len)


def reference_config(context_length: int | None = None) -> PerfConfig:
    """The campaign's reference launch (see module docstring)."""
    return PerfConfig(context_length=context_length or DSV4_MAX_CONTEXT,
                      max_running_requests=256, chunked_prefill_size=8192, tp_size=4)


def calibration_table() -> list[dict[str, Any]]:
    rows = []
    for (ctx, c, n), measured in CAMPAIGN.items():
        cfg = reference_config(None if ctx == "default" else ctx)
        res = simulate_bench(cfg, c, n)
        rows.append({"context": ctx, "concurrency": c, "num_prompts": n, "campaign": measured,
                     "model": res.output_throughput,
                     "diff_pct": 100.0 * (res.output_throughput - measured) / measured})
    return rows


if __name__ == "__main__":
    for row in calibration_table():
        print(f"{str(row['context']):>8} C={row['concurrency']:<3} n={row['num_prompts']:<4} "
              f"campaign {row['campaign']:7.1f}  model {row['model']:7.2f}  ({row['diff_pct']:+.1f}%)")
    cfg = reference_config()
    print("step(1) =", round(cfg.decode_step_s(1) * 1000, 2), "ms; step(n) slope =",
          round((cfg.decode_step_s(2) - cfg.decode_step_s(1)) * 1000, 2), "ms")


# ------------------------------------------------------------- client-side measurement
@dataclass
class Measured:
    duration_s: float
    completed: int
    failed: int
    output_tokens: int
    ttft_s: list[float] = field(default_factory=list)

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else 0.0


async def sse_data(resp):
    """The JSON documents of a streaming /generate answer (`data: {...}` lines), up to `[DONE]`."""
    async for line in resp.content:
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        yield json.loads(payload)


async def measure_bench(url: str, concurrency: int, num_prompts: int, input_len: int = 256,
                        output_len: int = 256, api_key: str | None = None, seed: int = 42,
                        warmup: int = 1, timeout_s: float = 7200.0) -> Measured:
    """bench_serving's methodology, client side: ``--backend sglang --dataset-name random-ids
    --random-range-ratio 1.0 --max-concurrency C --request-rate inf``: streaming /generate with
    ``input_ids``, ``ignore_eos``; throughput = sum(completion_tokens) / wall duration (warmup
    requests excluded)."""
    import random

    import aiohttp  # the twin's own dependency

    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    prompts = [[rng.randrange(100, 120000) for _ in range(input_len)] for _ in range(num_prompts)]
    to = aiohttp.ClientTimeout(total=timeout_s)
    conn = aiohttp.TCPConnector(limit=0)

    async def one(session, ids) -> tuple[int, float | None, bool]:
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": output_len, "ignore_eos": True,
                                                      "temperature": 0.0}, "stream": True}
        t0 = time.perf_counter()
        ttft = None
        tokens = 0
        try:
            async with session.post(url.rstrip("/") + "/generate", json=body, headers=headers) as resp:
                if resp.status != 200:
                    await resp.read()
                    return 0, None, False
                async for data in sse_data(resp):
                    if "error" in data:
                        return tokens, ttft, False
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    tokens = data["meta_info"]["completion_tokens"]
            return tokens, ttft, tokens == output_len
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return tokens, ttft, False

    async with aiohttp.ClientSession(timeout=to, connector=conn) as session:
        # Open the C keep-alive connections first (cheap GETs), so connection setup on a small
        # CI box does not count as server time; then the usual warmup generation(s).
        async def touch():
            async with session.get(url.rstrip("/") + "/v1/models", headers=headers) as r:
                await r.read()

        await asyncio.gather(*(touch() for _ in range(min(concurrency, num_prompts))))
        for _ in range(warmup):
            await one(session, prompts[0])
        sem = asyncio.Semaphore(concurrency)
        results: list[tuple[int, float | None, bool]] = []

        async def limited(ids):
            async with sem:
                results.append(await one(session, ids))

        t0 = time.perf_counter()
        await asyncio.gather(*(limited(p) for p in prompts))
        dur = time.perf_counter() - t0
    ok = [r for r in results if r[2]]
    return Measured(duration_s=dur, completed=len(ok), failed=len(results) - len(ok),
                    output_tokens=sum(r[0] for r in ok), ttft_s=[r[1] for r in ok if r[1] is not None])
