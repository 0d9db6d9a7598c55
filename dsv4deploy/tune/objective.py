"""What the search optimises and how one measurement is judged (pure).

Objective: the highest output throughput at the target concurrency, subject to the profile's
SLOs at that concurrency (the gate level's floor on output tok/s and its p99 TTFT / TPOT
ceilings, when declared) and zero failed requests. A candidate that fails any of them is out,
whatever its throughput: the tuned profile must pass the gate `make deploy` runs on it.

Measurements come in levels (rungs of successive halving): level k sends `num_prompts[k]`
requests at the target concurrency with the gate's lengths; the last level is the gate's own
level at that concurrency, so the winner was measured exactly as the gate will measure it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from dsv4deploy.gate.spec import DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN, GateSpec
from dsv4deploy.profile.load import Profile
from dsv4deploy.tune.space import Space


@dataclass(frozen=True)
class Slo:
    """The constraints at the target concurrency (None: not declared by the profile)."""

    min_output_throughput: float | None = None
    max_p99_ttft_ms: float | None = None
    max_p99_tpot_ms: float | None = None
    max_failed_requests: int = 0

    def describe(self) -> str:
        """'zero failed requests, floor 400 tok/s, no p99 TTFT limit, p99 TPOT <= 150 ms'."""
        def limit(name, op, v, unit):
            return f"{name} {op} {v:g} {unit}" if v is not None else f"no {name} limit"
        failed = "zero failed requests" if not self.max_failed_requests else \
            f"at most {self.max_failed_requests} failed requests"
        return ", ".join([failed, limit("floor", ">=", self.min_output_throughput, "tok/s"),
                          limit("p99 TTFT", "<=", self.max_p99_ttft_ms, "ms"),
                          limit("p99 TPOT", "<=", self.max_p99_tpot_ms, "ms")])


@dataclass(frozen=True)
class Level:
    """One rung: what `measure(candidate, level)` must run (the gate's methodology)."""

    index: int
    concurrency: int
    num_prompts: int
    input_len: int
    output_len: int
    final: bool
    floor: float | None = None      # the gate's floor: a run that cannot reach it may stop early


@dataclass(frozen=True)
class Method:
    """How every candidate is measured; a saved state is reused only under the same method."""

    concurrency: int
    input_len: int
    output_len: int
    rung_prompts: tuple[int, ...]
    eta: int
    slo: Slo

    @property
    def levels(self) -> list[Level]:
        last = len(self.rung_prompts) - 1
        return [Level(i, self.concurrency, n, self.input_len, self.output_len, i == last,
                      self.slo.min_output_throughput) for i, n in enumerate(self.rung_prompts)]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["rung_prompts"] = list(self.rung_prompts)
        return d


def rung_prompts(concurrency: int, final: int, eta: int) -> tuple[int, ...]:
    """Prompts per rung, cheapest first: final / eta^k, never below one wave of `concurrency`."""
    rungs = [final]
    while rungs[0] > concurrency:
        n = max(concurrency, math.ceil(rungs[0] / eta))
        rungs.insert(0, n)
    return tuple(rungs)


def method_for(profile: Profile, space: Space) -> Method:
    """The method and SLOs of `profile`'s gate at the space's target concurrency."""
    c = space.concurrency
    level = GateSpec.from_profile(profile.data).level(c)
    if level is None:
        return Method(c, DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN, rung_prompts(c, 2 * c, space.eta), space.eta, Slo())
    slo = Slo(level.min_output_throughput, level.max_p99_ttft_ms, level.max_p99_tpot_ms, 0)
    return Method(c, level.input_len, level.output_len, rung_prompts(c, level.num_prompts, space.eta),
                  space.eta, slo)


@dataclass(frozen=True)
class Measurement:
    """What the backend saw for one candidate at one level."""

    output_throughput: float                 # tok/s at the target concurrency
    p99_ttft_ms: float | None = None
    p99_tpot_ms: float | None = None
    completed: int = 0
    failed: int = 0
    # the gate's early pass (either runner): the level stopped as a clear pass, so the figures rest on
    # `completed` of its `num_prompts` requests (a full run's on all of them), as the gate reads them
    passed_early: bool = False
    num_prompts: int = 0
    cannot_reach: bool = False               # the gate's early stop: it could not reach the floor
    gate_passed: bool | None = None          # the gate's verdict on the level, when the backend judged it
    error: str | None = None                 # the candidate did not serve (start failed, OOM, no health)
    wall_s: float = 0.0                      # set by the scheduler: the time this measurement took
    release: int | None = None               # the host release that served it (make history)
    scope: str = ""                          # where it was measured: the server, or a set's gateway
    # a rolled replica set: each replica's own gate, alone on its port ({replica, output_throughput,
    # passed}), kept beside the set's score; empty when the set started together or for one server
    per_replica: list = field(default_factory=list)
    requests_per_replica: list = field(default_factory=list)   # through a gateway: who served the score
    out_of_memory: bool = False              # it did not start because the GPUs ran out of memory

    def basis(self) -> str:
        """' (passed early: 64 of 128 requests)' when the figures rest on part of the level, else ''."""
        return f" (passed early: {self.completed} of {self.num_prompts} requests)" if self.passed_early else ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Measurement":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def infeasible(m: Measurement, slo: Slo) -> list[str]:
    """Why `m` breaks the objective's constraints; empty when it passes."""
    if m.error:
        return [f"did not serve: {m.error}"]
    why = []
    if m.failed > slo.max_failed_requests:
        why.append(f"{m.failed} failed request(s)")
    if m.cannot_reach:
        floor = f" of {slo.min_output_throughput:g} tok/s" if slo.min_output_throughput else ""
        why.append(f"stopped early: cannot reach the floor{floor}")
    if m.gate_passed is False:
        why.append("the gate failed the level")
    if slo.min_output_throughput is not None and m.output_throughput < slo.min_output_throughput:
        why.append(f"output {m.output_throughput:.1f} tok/s < floor {slo.min_output_throughput:g}")
    for name, value, ceiling in (("TTFT", m.p99_ttft_ms, slo.max_p99_ttft_ms),
                                 ("TPOT", m.p99_tpot_ms, slo.max_p99_tpot_ms)):
        if ceiling is None:
            continue
        if value is None:
            why.append(f"p99 {name} not measured (ceiling {ceiling:g} ms)")
        elif value > ceiling:
            why.append(f"p99 {name} {value:.1f} ms > ceiling {ceiling:g} ms")
    return why


def pareto_front(points: list[tuple[str, float, float]]) -> list[str]:
    """Ids of the points (id, throughput, latency) no other point beats on both (higher
    throughput, lower latency); sorted by throughput."""
    front = []
    for pid, tp, lat in points:
        dominated = any(t2 >= tp and l2 <= lat and (t2 > tp or l2 < lat) for _, t2, l2 in points)
        if not dominated:
            front.append((tp, pid))
    return [pid for _, pid in sorted(front)]
