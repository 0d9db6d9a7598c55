"""The one result format both runners return (``builtin`` and ``bench_serving``).

``GateResult.to_dict()`` is exactly the JSON document the built-in client prints on stdout
(it cannot import this module, so the field names are the contract); the bench_serving runner
builds the same objects from SGLang's JSONL.  Latency statistics are in milliseconds,
throughputs in tok/s (req/s for requests) over the level's wall duration, as bench_serving.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from dsv4deploy.gate.spec import LevelShape

SCHEMA = "dsv4deploy.gate.result/1"

# Level status: how the level ended (the verdict decides pass/fail from it and the numbers).
OK = "ok"                  # ran to the end (every request answered or failed)
EARLY_STOP = "early_stop"  # stopped: it could not reach its floor (reason says why)
FAILED = "failed"          # stopped: too many failed requests, warm-up failed, client/tool error
BUDGET = "budget"          # stopped: the gate's wall-clock budget ran out
SKIPPED = "skipped"        # not run (an earlier level failed and the gate fails fast, or budget)
STATUSES = (OK, EARLY_STOP, FAILED, BUDGET, SKIPPED)

STAT_KEYS = ("mean", "median", "std", "p90", "p95", "p99", "max")


@dataclass
class Stats:
    """Latency distribution in ms (None where nothing was measured)."""
    mean: float | None = None
    median: float | None = None
    std: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None

    @classmethod
    def from_dict(cls, d: dict | None) -> "Stats":
        d = d or {}
        return cls(**{k: (None if d.get(k) is None else float(d[k])) for k in STAT_KEYS})


@dataclass
class LevelResult(LevelShape):
    concurrency: int
    num_prompts: int
    input_len: int = 256
    output_len: int = 256
    status: str = OK
    reason: str | None = None
    completed: int = 0
    failed: int = 0
    duration_s: float = 0.0
    total_input_tokens: int = 0
    total_output_tokens: int = 0          # sum of meta_info.completion_tokens of completed requests
    request_throughput: float = 0.0
    input_throughput: float = 0.0
    output_throughput: float = 0.0        # total_output_tokens / duration_s
    total_throughput: float = 0.0
    ttft_ms: Stats = field(default_factory=Stats)
    tpot_ms: Stats = field(default_factory=Stats)
    itl_ms: Stats = field(default_factory=Stats)
    e2e_ms: Stats = field(default_factory=Stats)
    # built-in client only (None from bench_serving):
    streamed_output_tokens: int | None = None      # incl. requests still in flight at the end
    running_output_throughput: float | None = None  # streamed tok/s once all C slots streamed
    peak_output_throughput: float | None = None     # best rate over >= 2 s windows
    max_in_flight: int | None = None
    warmup_requests: int = 0
    warmup_failed: int = 0
    warmup_s: float | None = None
    started_at: float | None = None                 # unix time of the timed start
    client_cpu_s: float | None = None               # the client's own CPU time during the level
    client_cpu_share: float | None = None           # client_cpu_s / duration_s
    early_stop: dict[str, Any] | None = None        # {"rule": "bound"|"running"|..., "at_s": ...}
    errors: list[dict[str, Any]] = field(default_factory=list)  # [{"message", "count"}], first few
    extra: dict[str, Any] = field(default_factory=dict)          # runner specifics (exit code, tail)
    # built-in client through a gateway that names the worker of each request (smg's
    # x-smg-routed-worker-id): {"header", "workers": {url: {requests, completed, output_tokens,
    # peak_in_flight}}, "busiest_share"} (client.routing); None otherwise
    routed: dict[str, Any] | None = None

    @property
    def passed_early(self) -> bool:
        """It stopped as a clear pass (either runner's early pass): its figures rest on its
        `completed` requests, fewer than its `num_prompts`."""
        return self.status == OK and (self.early_stop or {}).get("rule") == "pass"

    def basis(self) -> str:
        """What its figures rest on, in words: 'all 128 requests', '64 of 128 requests (passed early)'."""
        if self.passed_early:
            return f"{self.completed + self.failed} of {self.num_prompts} requests (passed early)"
        return f"all {self.num_prompts} requests"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LevelResult":
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            kw[k] = Stats.from_dict(d.get(k))
        if kw.get("status") not in STATUSES:
            raise ValueError(f"level status {kw.get('status')!r} is not one of {STATUSES}")
        return cls(**kw)


@dataclass
class GateResult:
    runner: str                                   # "builtin" | "bench_serving"
    levels: list[LevelResult] = field(default_factory=list)   # in the order they ran
    base_url: str | None = None
    started_at: float | None = None               # unix time
    wall_s: float = 0.0                           # the whole gate, as its runner measured it
    budget_s: float | None = None
    budget_exhausted: bool = False
    error: str | None = None                      # the runner itself failed (no or bad output)
    client: dict[str, Any] = field(default_factory=dict)      # cpu, python, early-stop policy, ...
    # through a replica set's gateway: each replica's requests during the gate, from its own
    # sglang:num_requests_total ([{"index", "url", "requests"}], gate/split.py); empty otherwise
    replicas: list[dict[str, Any]] = field(default_factory=list)
    schema: str = SCHEMA

    def level(self, concurrency: int) -> LevelResult | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    def by_key(self) -> dict[tuple, LevelResult]:
        return {lv.key: lv for lv in self.levels}

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict) -> "GateResult":
        if d.get("schema", SCHEMA) != SCHEMA:
            raise ValueError(f"not a gate result: schema {d.get('schema')!r}")
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["levels"] = [LevelResult.from_dict(x) for x in d.get("levels") or ()]
        return cls(**kw)

    @classmethod
    def from_json(cls, text: str) -> "GateResult":
        return cls.from_dict(json.loads(text))
