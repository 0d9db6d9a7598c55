"""The twin's own GPU memory model (stdlib only; must NOT import the rest of dsv4deploy, whose
validator it is used to test).

SGLang's accounting (reference/sglang.md section 5.2):
``mem_fraction_static = (weights + KV pool) / GPU capacity``; CUDA graphs and activations live
in the rest, ``capacity * (1 - fraction)``, minus the CUDA context.

Constants (GiB unless noted) and why:

* ``WEIGHTS_TOTAL_GIB = 148.66``: the FP4/FP8 DeepSeek-V4-Flash checkpoints, 46 shards (BRIEF);
  split over ``tp * pp`` GPUs, plus ``REPLICATED_GIB = 0.5`` replicated per GPU (embeddings,
  norms, indexer weights).  TP4: 37.67 GiB/GPU (the campaign logged 36.5).
* ``CUDA_CONTEXT_GIB = 1.0``: CUDA context + NCCL communicators, outside torch's pool.
* ``KV_BYTES_PER_TOKEN = 15900``: observed at the campaign's settings (BRIEF); overridable by
  the knob file (``kv_bytes_per_token``) since it is not a constant in reality.
* Decode CUDA-graph capture needs ``ACT_BASE_GIB + ACT_PER_BS_GIB * max_bs +
  n_graphs * per_graph`` where n_graphs is SGLang's capture list (1,2,4,8,12,16,24,32,... <= max
  bs) and ``per_graph`` depends on the all-reduce path inside the graph, which SGLang picks as:
  custom all-reduce only at world size 2 on PCIe (``custom_all_reduce.py``: "for 4 or more non
  NVLink-capable GPUs, custom allreduce provides little performance improvement over NCCL"),
  NCCL at TP>=4, across nodes, or with ``--disable-custom-all-reduce``.  With NCCL captured
  inside each graph every graph pins its own NCCL work buffers (``PER_GRAPH_NCCL_GIB = 2.3``);
  custom all-reduce graphs only record pointers into one IPC buffer registered once
  (``PER_GRAPH_CUSTOM_AR_GIB = 0.2``, same for TP1 which has no all-reduce).
  ``ACT_BASE_GIB = 2.5`` (activation/workspace pool incl. the DSV4 indexer scratch),
  ``ACT_PER_BS_GIB = 0.02`` per decode slot of the largest graph.

Checks these reproduce (GPU 97,887 MiB = 95.59 GiB; headroom = capacity*(1-f) - 1):

  =================  ==========  ===============  ===========================================
  cell               headroom    graph reserve    outcome
  =================  ==========  ===============  ===========================================
  TP4 0.85 bs32      13.34       21.54 (NCCL)     OOM at capture (campaign: OOM; it saw ~12.9 GB
                                                  left and capture needing ~10 GB more ->
                                                  model: 8.2 GiB = 8.8 GB short)
  TP4 0.70 bs32      27.68       21.54 (NCCL)     starts, 6.1 GiB spare (campaign: ran)
  TP2 0.92 bs32      6.65        4.74 (custom AR) starts (SGLang cookbook's verified RTX PRO
                                                  6000 cell, MXFP4 Flash)
  TP4 0.77 bs32      20.99       21.54            OOM (the boundary sits between 0.75 and 0.77)
  =================  ==========  ===============  ===========================================

Not measured, so predictions only: TP2 with ``--disable-custom-all-reduce`` at 0.92 OOMs;
SGLang's default decode max bs at TP>=4 on this card (256 after the DSV4 max-running cap, 36
graphs) OOMs at the default fraction (~0.84): the campaign never ran defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

GIB = 1024 ** 3
MIB = 1024 ** 2

WEIGHTS_TOTAL_GIB = 148.66
REPLICATED_GIB = 0.5
CUDA_CONTEXT_GIB = 1.0
KV_BYTES_PER_TOKEN = 15900
ACT_BASE_GIB = 2.5
ACT_PER_BS_GIB = 0.02
PER_GRAPH_NCCL_GIB = 2.3
PER_GRAPH_CUSTOM_AR_GIB = 0.2
DSV4_PAGE_SIZE = 256


class KVCacheError(ValueError):
    pass


def decode_capture_batch_sizes(max_bs: int) -> list[int]:
    """SGLang ``generate_decode_cuda_graph_batch_sizes`` (non-speculative)."""
    cand = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, max_bs + 1, 32))
    out = [b for b in cand if b <= max_bs]
    if max_bs not in out:
        out.append(max_bs)
    return sorted(set(out))


def default_gpu_settings(gpu_mem_mib: float, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode graph max bs) per SGLang's GPU-memory buckets
    (``memory_hook.handle_gpu_memory_settings``; the 90-160 GiB row is the one that matters
    here: 8192 and 256/512; smaller rows are approximate)."""
    gib = gpu_mem_mib / 1024
    if gib < 20:
        return 2048, 8 if tp < 4 else 16
    if gib < 35:
        return 2048, 24 if tp < 4 else 80
    if gib < 60:
        return 4096, 32 if tp < 4 else 160
    if gib < 90:
        return 8192, 64 if tp < 4 else 256
    if gib < 160:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def default_mem_fraction(gpu_mem_mib: float, tp: int, pp: int, chunked: int, decode_max_bs: int,
                         graphs: bool) -> float:
    """SGLang's default ``mem_fraction_static`` (reference/sglang.md 5.2)."""
    reserve_graph = (decode_max_bs * 2 if graphs else 0) + 1536
    reserved = 512 + max(chunked, 2048) * 1.5 + tp * pp / 8 * 1024 + reserve_graph
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10240)
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


def allreduce_path(tp: int, nnodes: int, disable_custom_all_reduce: bool) -> str:
    if tp <= 1:
        return "none"
    if tp == 2 and nnodes <= 1 and not disable_custom_all_reduce:
        return "custom"
    return "nccl"


@dataclass
class MemoryInputs:
    gpu_mem_mib: float
    tp: int = 1
    pp: int = 1
    nnodes: int = 1
    mem_fraction_static: float | None = None
    chunked_prefill_size: int | None = None
    cuda_graph_max_bs_decode: int | None = None
    cuda_graph_bs_decode: list[int] | None = None
    graphs_disabled: bool = False
    disable_custom_all_reduce: bool = False
    max_running_requests: int = 256
    max_total_tokens: int | None = None
    page_size: int = DSV4_PAGE_SIZE
    kv_bytes_per_token: float = KV_BYTES_PER_TOKEN
    weights_total_gib: float = WEIGHTS_TOTAL_GIB


@dataclass
class OOM:
    bs: int
    tried_gib: float
    free_gib: float
    captured: int


@dataclass
class MemoryPlan:
    capacity_gib: float
    mem_fraction_static: float
    chunked_prefill_size: int
    weights_gib: float
    static_gib: float
    kv_pool_gib: float
    max_total_num_tokens: int
    max_running_requests: int
    headroom_gib: float
    allreduce: str
    graph_bs: list[int] = field(default_factory=list)
    per_graph_gib: float = 0.0
    graph_reserve_gib: float = 0.0
    oom: OOM | None = None

    @property
    def cuda_graph_max_bs(self) -> int:
        return max(self.graph_bs) if self.graph_bs else 0

    @property
    def available_after_gib(self) -> float:
        """What SGLang logs as available_gpu_mem once pools and graphs are allocated."""
        return max(self.headroom_gib - self.graph_reserve_gib, 0.0)

    @property
    def fits(self) -> bool:
        return self.oom is None


def plan_memory(inp: MemoryInputs) -> MemoryPlan:
    """Raises KVCacheError when the weights leave no KV pool; returns a plan whose ``oom`` says
    where graph capture runs out of memory (None: it fits)."""
    capacity = inp.gpu_mem_mib * MIB / GIB
    default_chunk, default_bs = default_gpu_settings(inp.gpu_mem_mib, inp.tp)
    chunk = inp.chunked_prefill_size if inp.chunked_prefill_size is not None else default_chunk
    if inp.graphs_disabled:
        graph_bs: list[int] = []
    elif inp.cuda_graph_bs_decode:
        graph_bs = sorted(set(inp.cuda_graph_bs_decode))
    else:
        max_bs = inp.cuda_graph_max_bs_decode
        if max_bs is None:
            max_bs = min(default_bs, inp.max_running_requests)
        graph_bs = decode_capture_batch_sizes(max_bs)
    frac = inp.mem_fraction_static
    if frac is None:
        frac = default_mem_fraction(inp.gpu_mem_mib, inp.tp, inp.pp, chunk,
                                    max(graph_bs) if graph_bs else 0, bool(graph_bs))
    weights = inp.weights_total_gib / max(1, inp.tp * inp.pp) + REPLICATED_GIB
    static = frac * capacity
    kv_pool = static - weights
    if kv_pool <= 0:
        need = math.ceil(weights / capacity * 1000) / 1000
        raise KVCacheError(
            f"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static={frac}. "
            f"Raise --mem-fraction-static above {need} (weights take {weights:.2f} GiB of "
            f"{capacity:.2f} GiB per GPU) or use more GPUs (larger --tp-size).")
    tokens = int(kv_pool * GIB // inp.kv_bytes_per_token)
    tokens = tokens // inp.page_size * inp.page_size
    if inp.max_total_tokens:
        tokens = min(tokens, inp.max_total_tokens)
    max_running = min(inp.max_running_requests, max(1, tokens // 2))
    headroom = capacity - static - CUDA_CONTEXT_GIB
    path = allreduce_path(inp.tp, inp.nnodes, inp.disable_custom_all_reduce)
    per_graph = PER_GRAPH_NCCL_GIB if path == "nccl" else PER_GRAPH_CUSTOM_AR_GIB
    plan = MemoryPlan(capacity_gib=capacity, mem_fraction_static=frac, chunked_prefill_size=chunk,
                      weights_gib=weights, static_gib=static, kv_pool_gib=kv_pool,
                      max_total_num_tokens=tokens, max_running_requests=max_running,
                      headroom_gib=headroom, allreduce=path, graph_bs=graph_bs, per_graph_gib=per_graph)
    # Simulated capture, largest batch first as SGLang does: the activation pool for the largest
    # batch is allocated with the first graph, then each graph adds its own cost.
    used = 0.0
    act = ACT_BASE_GIB + (ACT_PER_BS_GIB * max(graph_bs) if graph_bs else 0.0)
    if act > headroom:
        plan.oom = OOM(bs=max(graph_bs) if graph_bs else 0, tried_gib=act, free_gib=max(headroom, 0.0), captured=0)
        plan.graph_reserve_gib = act
        return plan
    used = act
    for i, bs in enumerate(reversed(graph_bs)):
        if used + per_graph > headroom:
            plan.oom = OOM(bs=bs, tried_gib=per_graph, free_gib=max(headroom - used, 0.0), captured=i)
            break
        used += per_graph
    plan.graph_reserve_gib = act + per_graph * len(graph_bs)
    return plan
