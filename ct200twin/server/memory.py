"""The twin's GPU memory model: SGLang's start (weights, KV pool, decode-graph capture) simulated
on the project's one set of memory facts (dsv4deploy/profile/memory_facts.py, stdlib only, shipped with the
twin): the twin imports that pure module and nothing else of the product, so the validator and the
twin cannot read the campaign's OOM differently. This module adds what only the twin does: the
simulated capture, largest batch first, that runs out of memory at a given graph, and SGLang's
defaults (fraction, chunk, graph batch) when the argv leaves them out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dsv4deploy.profile.memory_facts import (CUDA_CONTEXT_GIB, DSV4_PAGE_SIZE, GIB, KV_BYTES_PER_TOKEN, MIB,
                                     WEIGHTS_TOTAL_GIB, allreduce_path, capture_need,
                                     decode_capture_batch_sizes, default_gpu_settings, headroom_gib,
                                     weights_per_gpu_gib)

__all__ = ["CUDA_CONTEXT_GIB", "KVCacheError", "MemoryInputs", "MemoryPlan", "OOM", "allreduce_path",
           "decode_capture_batch_sizes", "default_gpu_settings", "default_mem_fraction", "plan_memory"]


class KVCacheError(ValueError):
    pass


def default_mem_fraction(gpu_mem_mib: float, tp: int, pp: int, chunked: int, decode_max_bs: int,
                         graphs: bool) -> float:
    """SGLang's default ``mem_fraction_static`` (reference/sglang.md 5.2)."""
    reserve_graph = (decode_max_bs * 2 if graphs else 0) + 1536
    reserved = 512 + max(chunked, 2048) * 1.5 + tp * pp / 8 * 1024 + reserve_graph
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10240)
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


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


def graph_batch_sizes(inp: MemoryInputs) -> list[int]:
    """The decode batch sizes SGLang captures for INP (empty: graphs off)."""
    if inp.graphs_disabled:
        return []
    if inp.cuda_graph_bs_decode:
        return sorted(set(inp.cuda_graph_bs_decode))
    max_bs = inp.cuda_graph_max_bs_decode
    if max_bs is None:
        max_bs = min(default_gpu_settings(inp.gpu_mem_mib, inp.tp)[1], inp.max_running_requests)
    return decode_capture_batch_sizes(max_bs)


def plan_memory(inp: MemoryInputs) -> MemoryPlan:
    """Raises KVCacheError when the weights leave no KV pool; returns a plan whose ``oom`` says
    where graph capture runs out of memory (None: it fits)."""
    capacity = inp.gpu_mem_mib * MIB / GIB
    default_chunk, _ = default_gpu_settings(inp.gpu_mem_mib, inp.tp)
    chunk = inp.chunked_prefill_size if inp.chunked_prefill_size is not None else default_chunk
    graph_bs = graph_batch_sizes(inp)
    frac = inp.mem_fraction_static
    if frac is None:
        frac = default_mem_fraction(inp.gpu_mem_mib, inp.tp, inp.pp, chunk,
                                    max(graph_bs) if graph_bs else 0, bool(graph_bs))
    weights = weights_per_gpu_gib(inp.tp, inp.pp, inp.weights_total_gib)
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
    headroom = headroom_gib(capacity, frac)
    path = allreduce_path(inp.tp, inp.disable_custom_all_reduce, inp.nnodes)
    need = capture_need(inp.tp, graph_bs, chunk, path)
    plan = MemoryPlan(capacity_gib=capacity, mem_fraction_static=frac, chunked_prefill_size=chunk,
                      weights_gib=weights, static_gib=static, kv_pool_gib=kv_pool,
                      max_total_num_tokens=tokens, max_running_requests=max_running,
                      headroom_gib=headroom, allreduce=path, graph_bs=graph_bs,
                      per_graph_gib=need.per_graph_gib)
    if not graph_bs:
        return plan
    # Simulated capture, largest batch first as SGLang does: the activation pool for the largest
    # batch and NCCL's buffers come with the first graph, then each graph adds its own cost.
    first = need.first_gib
    if first > headroom:
        plan.oom = OOM(bs=max(graph_bs), tried_gib=first, free_gib=max(headroom, 0.0), captured=0)
        plan.graph_reserve_gib = first
        return plan
    used = first
    for i, bs in enumerate(reversed(graph_bs)):
        if used + need.per_graph_gib > headroom:
            plan.oom = OOM(bs=bs, tried_gib=need.per_graph_gib, free_gib=max(headroom - used, 0.0), captured=i)
            break
        used += need.per_graph_gib
    plan.graph_reserve_gib = need.total_gib
    return plan
