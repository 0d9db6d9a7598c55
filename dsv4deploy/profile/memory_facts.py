"""The GPU-memory facts of DeepSeek-V4-Flash on SGLang 0.5.23, in one place: the validator
(profile/memory.py) and the stand-in server of a test bench both compute from these, so they
cannot read the campaign differently. Stdlib only and pure, so a stand-in can ship this file.

SGLang's accounting: ``mem_fraction_static = (weights + KV pool) / GPU capacity``; the CUDA
context sits outside torch's pool, and CUDA-graph capture (graphs, the activation pool, NCCL
buffers) must fit in what is left: ``headroom = capacity * (1 - fraction) - CUDA context``.

The campaign's OOM, and the one reading used here. At TP4, decode graphs up to bs 32 over NCCL,
0.85 OOMed at capture: "only 12.9 GB remained - and CUDA graph capture required roughly 10 GB of
contiguous memory on top of that"; 0.70 ran (reference/seeds/000). Read as a need of about 10 GB
(the rest eaten by activations and NCCL), the boundary sits near 0.84; read as 12.9 + 10 GB
(= 22.9 GB = 21.3 GiB), near 0.77. Both readings explain both points. This module takes the
second, larger one: "on top of that" says the capture wanted 10 GB more than remained, and a wrong
large reading costs at most 0.07 of the card in KV cache (about 450k tokens at TP4) until the
host's own startup log calibrates it (profile/calibration.py), while a wrong small reading costs
a crashed start that reloads 149 GiB of weights. The figures below are set so that the capture
need at TP4, bs 32, NCCL is 21.2 GiB:

  ==============  ========  ==========  =====================================================
  cell            headroom  need (GiB)  outcome (twin; validator adds SAFETY_MARGIN_GIB)
  ==============  ========  ==========  =====================================================
  TP4 0.85 bs32   13.34     21.24       OOM at capture (campaign: OOM, ~12.9 GB left)
  TP4 0.70 bs32   27.68     21.24       starts, 6.44 GiB left (campaign: ran)
  TP2 0.92 bs32   6.65      5.24        starts, custom all-reduce (SGLang cookbook's RTX PRO
                                        6000 cell, MXFP4 Flash)
  TP8 0.75 bs32   22.90     21.24       starts (NCCL ring: the buffers do not grow with TP)
  ==============  ========  ==========  =====================================================

So at TP4/TP8 bs 32 over NCCL the twin starts up to 0.76 and the validator accepts up to 0.75.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024 ** 3
MIB = 1024 ** 2

# --- the checkpoint (both Flash checkpoints; the NVFP4 one assumed equal: calibrate) -----------
WEIGHTS_TOTAL_GIB = 148.66   # 46 safetensors shards (vllm-project/vllm#40802 load log; BRIEF)
REPLICATED_GIB = 0.5         # embeddings, norms, indexer kept whole on every rank (estimate;
                             # TP4 gives 37.67 GiB/GPU, the campaign logged 36.5 GB: conservative)
KV_BYTES_PER_TOKEN = 15900   # ~15.9 KB/token at the campaign's settings (seeds/000); not a
                             # constant in reality (context, max running): the host's log calibrates it
DSV4_PAGE_SIZE = 256         # DSV4's KV page (SGLang forces page_size 256 for the compressed attention)

# --- outside the static fraction ----------------------------------------------------------------
CUDA_CONTEXT_GIB = 1.0       # CUDA context + cuBLAS workspace + NCCL communicators, outside torch's
                             # pool (estimate; SGLang's "avail mem" at load begin is capacity minus it)

# --- what CUDA-graph capture allocates (headroom) -------------------------------------------------
ACT_BASE_GIB = 0.5                 # workspace of the DSV4 indexer and sampler (estimate)
ACT_MIB_PER_PREFILL_TOKEN = 0.25   # activations per token of the prefill chunk: 2.0 GiB at 8192
ACT_GIB_PER_DECODE_SLOT = 0.02     # per slot of the largest decode graph (estimate)
NCCL_BUFFERS_GIB = 0.5             # NCCL's channel buffers at TP > 1: a ring links each rank to 2
                                   # neighbours whatever the TP (4 MiB NCCL_BUFFSIZE x <= 32 channels
                                   # x send/recv x 2 peers), so it does not grow with TP
PER_GRAPH_GIB = {                  # each captured decode batch size, by the all-reduce inside it
    "nccl": 2.2,    # NCCL captured in the graph pins its own work buffers per graph: set so that
                    # TP4 bs32 (8 graphs) needs 21.24 GiB, the campaign's 12.9 + 10 GB (see above)
    "custom": 0.2,  # custom all-reduce graphs record pointers into one IPC buffer registered once
    "none": 0.2,    # TP1: no all-reduce
}

# --- the validator's own margin -------------------------------------------------------------------
# Why the validator refuses what the twin would still start: nothing between 0.70 and 0.85 was
# measured, the allocator fragments ("contiguous" in the field report) and a prefill at full chunk
# can peak above what capture allocated. 1 GiB is about 1% of the card: one 0.01 step of the
# fraction. A profile the validator refuses and the twin starts has its headroom within this band.
SAFETY_MARGIN_GIB = 1.0


def decode_capture_batch_sizes(max_bs: int) -> list[int]:
    """SGLang's ``generate_decode_cuda_graph_batch_sizes`` (non-speculative) up to MAX_BS."""
    cand = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, max_bs + 1, 32))
    out = [b for b in cand if b <= max_bs]
    if max_bs not in out:
        out.append(max_bs)
    return sorted(set(out))


def default_gpu_settings(gpu_mem_mib: float, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode graph max bs) per SGLang's GPU-memory buckets
    (``memory_hook.handle_gpu_memory_settings``; the 90-160 GiB row is CT200's: 8192 and
    256/512; smaller rows are approximate)."""
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


def allreduce_path(tp: int, disable_custom_all_reduce: bool = False, nnodes: int = 1,
                   interconnect: str = "pcie") -> str:
    """The all-reduce inside the decode graphs: "none" at TP1; SGLang's custom all-reduce at world
    size 2 on PCIe or over NVLink ("for 4 or more non NVLink-capable GPUs, custom allreduce
    provides little performance improvement over NCCL", custom_all_reduce.py); else NCCL."""
    if tp <= 1:
        return "none"
    if disable_custom_all_reduce or nnodes > 1:
        return "nccl"
    return "custom" if tp == 2 or interconnect == "nvlink" else "nccl"


def weights_per_gpu_gib(tp: int, pp: int = 1, total_gib: float = WEIGHTS_TOTAL_GIB,
                        replicated_gib: float = REPLICATED_GIB) -> float:
    return total_gib / max(1, tp * pp) + replicated_gib


@dataclass(frozen=True)
class CaptureNeed:
    """What decode-graph capture allocates per GPU, GiB: the activation pool and NCCL buffers with
    the first (largest) graph, then PER_GRAPH for each captured batch size."""

    path: str
    graph_bs: tuple[int, ...]
    activations_gib: float
    nccl_gib: float
    per_graph_gib: float

    @property
    def graphs_gib(self) -> float:
        return self.per_graph_gib * len(self.graph_bs)

    @property
    def first_gib(self) -> float:
        """Allocated before the first graph is captured."""
        return self.activations_gib + self.nccl_gib

    @property
    def total_gib(self) -> float:
        return self.first_gib + self.graphs_gib


def capture_need(tp: int, graph_bs: list[int], chunked_prefill_size: int, path: str) -> CaptureNeed:
    """The capture need of a server at TP with decode graphs GRAPH_BS (empty: graphs off)."""
    activations = ACT_BASE_GIB + ACT_MIB_PER_PREFILL_TOKEN * max(chunked_prefill_size, 0) * MIB / GIB
    if graph_bs:
        activations += ACT_GIB_PER_DECODE_SLOT * max(graph_bs)
    return CaptureNeed(path=path, graph_bs=tuple(sorted(set(graph_bs))), activations_gib=activations,
                       nccl_gib=NCCL_BUFFERS_GIB if tp > 1 else 0.0, per_graph_gib=PER_GRAPH_GIB[path])


def headroom_gib(capacity_gib: float, fraction: float) -> float:
    """What capture may use: capacity minus the static share minus the CUDA context."""
    return capacity_gib * (1 - fraction) - CUDA_CONTEXT_GIB
