"""The per-GPU memory budget of a profile: will it load, will CUDA-graph capture fit?

SGLang's definition: mem_fraction_static = (weights + KV pool) / GPU memory. CUDA graphs,
activations and NCCL buffers live in the rest (the headroom), and the CUDA context is not
counted at all. The campaign OOMed at graph capture with TP4, 0.85, decode graphs up to bs 32
(about 12.9 GB left, capture wanting about 10 GB more); 0.70 ran. SGLang's own verified RTX PRO
6000 cell runs TP2 at 0.92 with the same graph batch. The reserve below is calibrated on those
two points. The difference between them is the all-reduce inside the decode graphs: at world
size 2 on PCIe SGLang uses its custom all-reduce; at TP >= 4 without NVLink (or with
--disable-custom-all-reduce) NCCL runs inside every captured graph and each captured batch
size holds its own buffers. A measured `calibration:` block in the profile overrides these.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from dsv4deploy.profile.catalog import Gpu, Model

GIB = 1024**3
MIB = 1024**2

CUDA_CONTEXT_GIB = 1.0          # CUDA/cuBLAS context per process, outside the static fraction
ACTIVATION_BASE_GIB = 0.5
ACTIVATION_MIB_PER_PREFILL_TOKEN = 0.25  # 2.5 GiB at the default 8192-token prefill chunk
NCCL_GIB_PER_PEER = 0.25
GRAPH_MIB_PER_BS = {"custom": 64.0, "nccl": 320.0}  # per unit of the decode graph max batch
SAFETY_MARGIN_GIB = 1.0
DEFAULT_CHUNKED_PREFILL = 8192  # SGLang's choice for 90-160 GiB GPUs


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

    @property
    def fits(self) -> bool:
        return self.headroom_gib >= self.reserve_gib

    def as_dict(self) -> dict:
        d = asdict(self)
        d["fits"] = self.fits
        return d


def allreduce_path(tp_size: int, disable_custom_all_reduce: bool, interconnect: str) -> str:
    """Which all-reduce runs inside the decode CUDA graphs."""
    if tp_size <= 2 and not disable_custom_all_reduce:
        return "custom"
    if interconnect == "nvlink" and not disable_custom_all_reduce:
        return "custom"
    return "nccl"


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


def budget(server: dict, gpu: Gpu, model: Model, calibration: dict | None = None,
           max_running_default: int = 256) -> Budget:
    """The budget of one GPU of the server described by the profile's `server` section."""
    calibration = calibration or {}
    for key, (low, high) in _CALIBRATION_RANGES.items():
        if key in calibration:
            _checked(("calibration", key), calibration[key], low, high)
    _checked(("server", "mem_fraction_static"), server["mem_fraction_static"], 1e-6, 1.0)
    tp = server["tp_size"]
    capacity = gpu.memory_mib * MIB / GIB
    fraction = server["mem_fraction_static"]
    static = fraction * capacity
    weights = calibration.get("weights_gib_per_gpu", model.size_gib / tp + model.replicated_gib)
    pool = static - weights
    per_token = calibration.get("kv_bytes_per_token", model.kv_bytes_per_token)
    per_request = calibration.get("kv_bytes_per_request", 0.0)
    max_running = server.get("max_running_requests") or max_running_default
    tokens = max(0, int((pool * GIB - per_request * max_running) // per_token)) if pool > 0 else 0
    context = server.get("context_length") or model.max_context

    path = allreduce_path(tp, server.get("disable_custom_all_reduce", False), gpu.interconnect)
    max_bs = server.get("cuda_graph_max_bs_decode") or 0
    chunk = server.get("chunked_prefill_size") or DEFAULT_CHUNKED_PREFILL
    graph = GRAPH_MIB_PER_BS[path] * max_bs * MIB / GIB
    activations = ACTIVATION_BASE_GIB + ACTIVATION_MIB_PER_PREFILL_TOKEN * max(chunk, 0) * MIB / GIB
    nccl = NCCL_GIB_PER_PEER * (tp - 1)
    if "graph_reserve_mib" in calibration:
        measured = calibration["graph_reserve_mib"] * MIB / GIB
        graph, activations, nccl = measured, 0.0, 0.0
        source = "calibration.graph_reserve_mib"
    else:
        source = "model (dsv4deploy/profile/memory.py)"
    reserve = graph + activations + nccl + SAFETY_MARGIN_GIB
    headroom = capacity - static - CUDA_CONTEXT_GIB
    max_safe = (capacity - CUDA_CONTEXT_GIB - reserve) / capacity
    return Budget(
        capacity_gib=capacity, fraction=fraction, static_gib=static, weights_gib=weights,
        kv_pool_gib=pool, kv_bytes_per_token=per_token, kv_bytes_per_request=per_request,
        kv_tokens=tokens, context_length=context,
        full_context_requests=tokens / context if context else 0.0,
        max_running_requests=max_running, headroom_gib=headroom, cuda_context_gib=CUDA_CONTEXT_GIB,
        allreduce_path=path, graph_gib=graph, activations_gib=activations, nccl_gib=nccl,
        margin_gib=SAFETY_MARGIN_GIB, reserve_gib=reserve, reserve_source=source,
        max_safe_fraction=max_safe,
    )
