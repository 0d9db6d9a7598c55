"""The gate's specification, read from a profile's ``gate`` section (pure, no I/O).

``GateSpec.from_profile(profile.data)`` (or the ``gate`` section itself) gives the levels, each
with its floor on output tok/s and optional p99 TTFT / TPOT ceilings, plus the gate-wide
``max_failed_requests``, ``warmup_requests``, ``budget_s`` and ``runner``.  Missing keys take
the package defaults (``dsv4deploy/data/defaults.yaml``: random 256/256 at C=1/16/64).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

RUNNERS = ("auto", "builtin", "bench_serving")
DEFAULT_INPUT_LEN = 256
DEFAULT_OUTPUT_LEN = 256
DEFAULT_MAX_FAILED = 0
DEFAULT_WARMUP = 2
DEFAULT_BUDGET_S = 1800.0
DEFAULT_EARLY_PASS_MARGIN = 0.25   # a level this far above its floor stops early (passed)
DEFAULT_LEVELS = ((1, 8), (16, 48), (64, 128))  # (concurrency, num_prompts), the campaign's


class LevelShape:
    """A level's name and identity, shared by its spec and its result."""

    concurrency: int
    num_prompts: int
    input_len: int
    output_len: int

    @property
    def label(self) -> str:
        return f"C={self.concurrency}"

    @property
    def key(self) -> tuple[int, int, int, int]:
        """What "measured the same way" means for one level."""
        return (self.concurrency, self.num_prompts, self.input_len, self.output_len)


@dataclass(frozen=True)
class LevelSpec(LevelShape):
    concurrency: int
    num_prompts: int
    input_len: int = DEFAULT_INPUT_LEN
    output_len: int = DEFAULT_OUTPUT_LEN
    min_output_throughput: float | None = None   # floor, tok/s
    max_p99_ttft_ms: float | None = None         # ceiling
    max_p99_tpot_ms: float | None = None         # ceiling

    @property
    def total_output_tokens(self) -> int:
        return self.num_prompts * self.output_len

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict) -> "LevelSpec":
        def num(key):
            v = d.get(key)
            return None if v is None else float(v)

        return cls(concurrency=int(d["concurrency"]), num_prompts=int(d["num_prompts"]),
                   input_len=int(d.get("input_len") or DEFAULT_INPUT_LEN),
                   output_len=int(d.get("output_len") or DEFAULT_OUTPUT_LEN),
                   min_output_throughput=num("min_output_throughput"),
                   max_p99_ttft_ms=num("max_p99_ttft_ms"), max_p99_tpot_ms=num("max_p99_tpot_ms"))


@dataclass(frozen=True)
class GateSpec:
    levels: tuple[LevelSpec, ...] = field(default_factory=lambda: tuple(
        LevelSpec(c, n) for c, n in DEFAULT_LEVELS))
    max_failed_requests: int = DEFAULT_MAX_FAILED
    warmup_requests: int = DEFAULT_WARMUP
    budget_s: float = DEFAULT_BUDGET_S
    runner: str = "auto"
    early_pass_margin: float | None = DEFAULT_EARLY_PASS_MARGIN   # None: every level runs to the end
    early_pass_min_requests: int | None = None                     # None: the level's concurrency, >= 2

    def __post_init__(self):
        if self.runner not in RUNNERS:
            raise ValueError(f"gate.runner must be one of {RUNNERS}, not {self.runner!r}")
        if not self.levels:
            raise ValueError("gate.levels must not be empty")

    @classmethod
    def from_profile(cls, data: dict | None) -> "GateSpec":
        """From a profile's merged data (``{"gate": {...}, ...}``) or its ``gate`` section."""
        data = data or {}
        gate = data.get("gate") if isinstance(data.get("gate"), dict) else (
            data if "levels" in data or "runner" in data or "budget_s" in data else {})
        gate = gate or {}
        levels = tuple(LevelSpec.from_dict(x) for x in gate.get("levels") or ()) or cls().levels
        return cls(levels=levels,
                   max_failed_requests=int(gate.get("max_failed_requests", DEFAULT_MAX_FAILED)),
                   warmup_requests=int(gate.get("warmup_requests", DEFAULT_WARMUP)),
                   budget_s=float(gate.get("budget_s", DEFAULT_BUDGET_S)),
                   runner=str(gate.get("runner", "auto")),
                   early_pass_margin=(None if gate.get("early_pass_margin", DEFAULT_EARLY_PASS_MARGIN) is None
                                      else float(gate.get("early_pass_margin", DEFAULT_EARLY_PASS_MARGIN))),
                   early_pass_min_requests=(None if gate.get("early_pass_min_requests") is None
                                            else int(gate["early_pass_min_requests"])))

    def level(self, concurrency: int) -> LevelSpec | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    def run_order(self, order: str = "desc") -> tuple[LevelSpec, ...]:
        """``desc`` (default): highest concurrency first.  The high-concurrency levels carry the
        high floors and fill the server fastest, so a slow server is found in seconds and the
        gate stops there (fail fast); ``asis``: the profile's order."""
        if order == "asis":
            return self.levels
        if order != "desc":
            raise ValueError(f"order must be 'desc' or 'asis', not {order!r}")
        return tuple(sorted(self.levels, key=lambda lv: -lv.concurrency))

    def to_dict(self) -> dict:
        return {"runner": self.runner, "max_failed_requests": self.max_failed_requests,
                "warmup_requests": self.warmup_requests, "budget_s": self.budget_s,
                "early_pass_margin": self.early_pass_margin, "early_pass_min_requests": self.early_pass_min_requests,
                "levels": [lv.to_dict() for lv in self.levels]}
