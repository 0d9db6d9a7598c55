"""The per-GPU memory budget of a profile: will it load, will CUDA-graph capture fit?

Computed from the project's one set of memory facts (dsv4deploy/profile/memory_facts.py, which the twin's
server simulates too; its docstring states the one reading of the campaign's OOM) plus
SAFETY_MARGIN_GIB, so the validator never accepts what the twin's memory model would crash. Two
measured sources move it: a profile's `calibration:` block (constants), and the host's own
startup logs (profile/calibration.py: the capture need SGLang reported on that host for the same
layout), which then sets the boundary and names the release it came from.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from dsv4deploy.profile import memory_facts as facts
from dsv4deploy.profile.memory_facts import CUDA_CONTEXT_GIB, GIB, MIB, SAFETY_MARGIN_GIB
from dsv4deploy.profile.catalog import Gpu, Model


@dataclass(frozen=True)
class Measured:
    """A capture need measured on the host for this profile's layout (profile/calibration.py):
    NEED_GIB in the budget's terms, SOURCE the sentence that names its evidence."""

    need_gib: float
    source: str


@dataclass(frozen=True)
class Budget:
    """Every figure of the per-GPU budget, in GiB unless named otherwise."""

    capacity_gib: float
    fraction: float
    static_gib: float
    weights_gib: float
    kv_pool_gib: float
    kv_bytes_per_token: float
    kv_bytes_per_request: float
    kv_tokens: int
    context_length: int
    full_context_requests: float
    max_running_requests: int
    headroom_gib: float
    cuda_context_gib: float
    allreduce_path: str
    graph_gib: float
    activations_gib: float
    nccl_gib: float
    margin_gib: float
    reserve_gib: float
    reserve_source: str
    max_safe_fraction: float
    graph_max_bs: int = 0
    chunked_prefill_size: int = 0
    measured: bool = False         # the reserve is the host's own measurement (reserve_source names it)

    @property
    def fits(self) -> bool:
        return self.headroom_gib >= self.reserve_gib - 1e-9

    @property
    def max_safe_text(self) -> str:
        """The max safe fraction rounded down to what a profile can write (0.7569 -> "0.75")."""
        return f"{math.floor(max(self.max_safe_fraction, 0.0) * 100 + 1e-9) / 100:.2f}"

    def as_dict(self) -> dict:
        d = asdict(self)
        d["fits"] = self.fits
        return d


def allreduce_path(tp_size: int, disable_custom_all_reduce: bool, interconnect: str) -> str:
    """Which all-reduce runs inside the decode CUDA graphs (memory_facts.allreduce_path)."""
    return facts.allreduce_path(tp_size, disable_custom_all_reduce, 1, interconnect)


class BudgetInputError(ValueError):
    """An input the budget cannot be computed from; `path` is the profile key it came from."""

    def __init__(self, path: tuple, message: str):
        super().__init__(message)
        self.path = path


# The profile schema bounds these; the budget checks again so it can never compute with NaN,
# inf or a value so small that a division overflows (1e-300 bytes per token).
_CALIBRATION_RANGES = {"kv_bytes_per_token": (1.0, 16 * MIB), "kv_bytes_per_request": (0.0, 64 * GIB),
                       "weights_gib_per_gpu": (0.01, 4096.0), "graph_reserve_mib": (1.0, 1024.0 * 1024)}


def _checked(path: tuple, value, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BudgetInputError(path, f"must be a finite number, got {value!r}")
    if not low <= value <= high:
        raise BudgetInputError(path, f"must be between {low:g} and {high:g}, got {value!r}")
    return value


def graph_batch_sizes(server: dict, gpu: Gpu, max_running: int) -> list[int]:
    """The decode batch sizes SGLang captures for SERVER: up to cuda_graph_max_bs_decode, or
    SGLang's default for the card capped at max_running_requests."""
    max_bs = server.get("cuda_graph_max_bs_decode")
    if not max_bs:
        max_bs = min(facts.default_gpu_settings(gpu.memory_mib, server["tp_size"])[1], max_running)
    return facts.decode_capture_batch_sizes(max_bs)


def budget(server: dict, gpu: Gpu, model: Model, calibration: dict | None = None,
           max_running_default: int = 256, measured: Measured | None = None) -> Budget:
    """The budget of one GPU of the server described by the profile's `server` section; MEASURED
    (the host's calibration for this layout) replaces the modelled capture need."""
    calibration = calibration or {}
    for key, (low, high) in _CALIBRATION_RANGES.items():
        if key in calibration:
            _checked(("calibration", key), calibration[key], low, high)
    _checked(("server", "mem_fraction_static"), server["mem_fraction_static"], 1e-6, 1.0)
    tp = server["tp_size"]
    capacity = gpu.memory_mib * MIB / GIB
    fraction = server["mem_fraction_static"]
    static = fraction * capacity
    weights = calibration.get("weights_gib_per_gpu",
                              facts.weights_per_gpu_gib(tp, 1, model.size_gib, model.replicated_gib))
    pool = static - weights
    per_token = calibration.get("kv_bytes_per_token", model.kv_bytes_per_token)
    per_request = calibration.get("kv_bytes_per_request", 0.0)
    max_running = server.get("max_running_requests") or max_running_default
    tokens = max(0, int((pool * GIB - per_request * max_running) // per_token)) if pool > 0 else 0
    context = server.get("context_length") or model.max_context

    path = facts.allreduce_path(tp, server.get("disable_custom_all_reduce", False), server.get("nnodes") or 1,
                                gpu.interconnect)
    chunk = server.get("chunked_prefill_size") or facts.default_gpu_settings(gpu.memory_mib, tp)[0]
    need = facts.capture_need(tp, graph_batch_sizes(server, gpu, max_running), chunk, path)
    graph, activations, nccl = need.graphs_gib, need.activations_gib, need.nccl_gib
    source = "model (dsv4deploy/profile/memory_facts.py)"
    if "graph_reserve_mib" in calibration:
        graph, activations, nccl = calibration["graph_reserve_mib"] * MIB / GIB, 0.0, 0.0
        source = "calibration.graph_reserve_mib"
    if measured is not None:
        graph, activations, nccl = measured.need_gib, 0.0, 0.0
        source = measured.source
    reserve = graph + activations + nccl + SAFETY_MARGIN_GIB
    headroom = facts.headroom_gib(capacity, fraction)
    max_safe = (capacity - CUDA_CONTEXT_GIB - reserve) / capacity
    return Budget(
        capacity_gib=capacity, fraction=fraction, static_gib=static, weights_gib=weights,
        kv_pool_gib=pool, kv_bytes_per_token=per_token, kv_bytes_per_request=per_request,
        kv_tokens=tokens, context_length=context,
        full_context_requests=tokens / context if context else 0.0,
        max_running_requests=max_running, headroom_gib=headroom, cuda_context_gib=CUDA_CONTEXT_GIB,
        allreduce_path=path, graph_gib=graph, activations_gib=activations, nccl_gib=nccl,
        margin_gib=SAFETY_MARGIN_GIB, reserve_gib=reserve, reserve_source=source,
        max_safe_fraction=max_safe, graph_max_bs=max(need.graph_bs), chunked_prefill_size=chunk,
        measured=measured is not None,
    )
