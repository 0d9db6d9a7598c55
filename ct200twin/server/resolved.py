"""What the server works out before it loads anything: the checkpoint's facts (config.json), the
GPUs (nvidia-smi, as SGLang reads them), and from those and the argv the resolved settings
(``Resolved``: context length, limits, MoE backend, the memory plan) that the startup phases,
the engine and the HTTP API share.  Errors here are SGLang's own, logged as it logs them.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsv4deploy.profile.memory_facts import KV_BYTES_PER_TOKEN, WEIGHTS_TOTAL_GIB
from dsv4deploy.sglang.patches import MASK
from ct200twin.server import args as targs
from ct200twin.server.faults import Faults
from ct200twin.server.logs import _SG, SECRET_FIELDS, Log, StartupFailure, _traceback, secrets_masked
from ct200twin.server.memory import KVCacheError, MemoryInputs, MemoryPlan, plan_memory
from ct200twin.server.perf import DSV4_MAX_CONTEXT, PerfConfig

DSV4_ARCH = "DeepseekV4ForCausalLM"


# --------------------------------------------------------------------------------- the model
@dataclass
class ModelFacts:
    architectures: list[str]
    max_context: int
    model_type: str
    hybrid_nvfp4: bool


def read_model(model_path: str) -> ModelFacts:
    p = Path(model_path)
    cfg: dict[str, Any] = {}
    if p.is_dir() and (p / "config.json").is_file():
        try:
            cfg = json.loads((p / "config.json").read_text())
        except (OSError, json.JSONDecodeError):
            cfg = {}
    q = cfg.get("quantization_config") or {}
    hybrid = (q.get("quant_algo") == "MIXED_PRECISION" and q.get("moe_quant_algo") == "NVFP4"
              and q.get("group_size") is not None)
    return ModelFacts(
        architectures=list(cfg.get("architectures") or [DSV4_ARCH]),
        max_context=int(cfg.get("max_position_embeddings") or DSV4_MAX_CONTEXT),
        model_type=str(cfg.get("model_type") or "deepseek_v4"),
        hybrid_nvfp4=bool(hybrid),
    )


def query_gpus(log: Log) -> tuple[int, int]:
    """(min memory.total MiB, count) from nvidia-smi, like SGLang's get_nvgpu_memory_capacity."""
    cmd = ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        log.error("nvidia-smi not found on PATH: SGLang reads the GPU memory with it (and torch "
                  "finds no GPU either). Put nvidia-smi on the unit's PATH.")
        log.raw("RuntimeError: No CUDA GPUs are available (nvidia-smi not found)")
        raise StartupFailure(1)
    except subprocess.TimeoutExpired:
        log.raw("RuntimeError: nvidia-smi timed out")
        raise StartupFailure(1)
    if out.returncode != 0:
        msg = (out.stdout + out.stderr).strip()
        log.error(f"nvidia-smi failed (exit {out.returncode}): {msg}")
        log.raw("RuntimeError: Found no NVIDIA driver on your system. Please check that you have an "
                "NVIDIA GPU and installed a driver from http://www.nvidia.com/Download/index.aspx")
        raise StartupFailure(1)
    values = []
    for line in out.stdout.splitlines():
        line = line.strip()
        if line:
            try:
                values.append(int(float(line)))
            except ValueError:
                continue
    if not values:
        log.raw("RuntimeError: No CUDA GPUs are available (nvidia-smi listed no GPU)")
        raise StartupFailure(1)
    count = len(values)
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip() != "":
        count = min(count, len([x for x in cvd.split(",") if x.strip()]))
    return min(values), count


# ------------------------------------------------------------------------------ resolved state
@dataclass
class Resolved:
    args: targs.ParsedArgs
    faults: Faults
    model: ModelFacts
    gpu_mem_mib: int
    gpu_count: int
    context_len: int
    max_running_requests: int
    chunked_prefill_size: int
    max_prefill_tokens: int
    page_size: int
    moe_runner_backend: str
    mem: MemoryPlan | None
    model_path: str
    served_model_name: str
    graphs_enabled: bool

    def perf_config(self) -> PerfConfig:
        # --num-continuous-decode-steps is parsed (and shown in /server_info) but, as in SGLang
        # 0.5.12-0.5.23, never read: it changes nothing here.
        return PerfConfig(
            context_length=self.context_len,
            max_running_requests=self.max_running_requests,
            chunked_prefill_size=self.chunked_prefill_size,
            max_prefill_tokens=self.max_prefill_tokens,
            max_total_num_tokens=self.mem.max_total_num_tokens if self.mem else 10**9,
            tp_size=self.args.tp_size,
        )

    def server_args_dict(self) -> dict[str, Any]:
        """The resolved args as SGLang 0.5.23 shows them (log line, /server_info): secrets in
        clear, as upstream does, unless the installed SGLang tree carries the mask patch."""
        d = self.args.as_dict()
        d.pop("config", None)
        if secrets_masked():
            for k in SECRET_FIELDS:
                if d.get(k):
                    d[k] = MASK
        d.update({
            "model_path": self.model_path,
            "tokenizer_path": d.get("tokenizer_path") or self.model_path,
            "served_model_name": self.served_model_name,
            "context_length": self.context_len,
            "max_running_requests": self.max_running_requests,
            "chunked_prefill_size": self.chunked_prefill_size,
            "max_prefill_tokens": self.max_prefill_tokens,
            "page_size": self.page_size,
            "moe_runner_backend": self.moe_runner_backend,
            "attention_backend": "dsv4",
            "kv_cache_dtype": "fp8_e4m3" if d.get("kv_cache_dtype") in (None, "auto") else d["kv_cache_dtype"],
            "swa_full_tokens_ratio": d.get("swa_full_tokens_ratio") or 0.1,
        })
        if self.mem is not None:
            d["mem_fraction_static"] = self.mem.mem_fraction_static
            d["cuda_graph_max_bs_decode"] = self.mem.cuda_graph_max_bs or None
            d["cuda_graph_bs_decode"] = self.mem.graph_bs or None
        return d


def resolve(pa: targs.ParsedArgs, faults: Faults, log: Log, stale: bool = False) -> Resolved:
    a = pa.ns
    model_path = faults.stale_model_path if stale else a.model_path
    if not stale:
        p = Path(a.model_path).expanduser()
        if a.model_path.startswith(("/", "./", "../", "~")) and not p.exists():
            log.raw(_traceback(
                [(f"{_SG}/configs/model_config.py", 212, "__init__",
                  "self.hf_config = get_config(")],
                f"OSError: Can't load the configuration of '{a.model_path}'. Make sure "
                f"'{a.model_path}' is the correct path to a directory containing a config.json file"))
            raise StartupFailure(1)
    model = read_model(a.model_path)
    try:
        gpu_mem, gpu_count = query_gpus(log)
    except StartupFailure:
        if not stale:
            raise
        gpu_mem, gpu_count = 97887, 8
    context_len = model.max_context
    if a.context_length is not None:
        if a.context_length > model.max_context and os.environ.get(
                "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "").lower() not in ("1", "true"):
            log.raw(_traceback(
                [(f"{_SG}/configs/model_config.py", 389, "_derive_context_length",
                  "raise ValueError(")],
                f"ValueError: User-specified context_length ({a.context_length}) is greater than the "
                f"derived context_length ({model.max_context}). This may lead to incorrect model "
                "outputs or CUDA errors. Note that the derived context_length may differ from "
                "max_position_embeddings in the model's config. To allow overriding this maximum, "
                "set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"))
            raise StartupFailure(1)
        context_len = a.context_length
    if a.max_running_requests is None:
        log.info("Setting max_running_requests to 256 for DeepSeek-V4.")
    max_running = a.max_running_requests if a.max_running_requests is not None else 256
    moe = a.moe_runner_backend or "auto"
    if moe == "auto":
        moe = "flashinfer_trtllm_routed" if model.hybrid_nvfp4 else "flashinfer_mxfp4"
    if model.hybrid_nvfp4:
        log.info("Auto-detected hybrid FP8+NVFP4 checkpoint (NVFP4 MoE group_size=16)")
    graphs_enabled = not (a.disable_cuda_graph or a.disable_decode_cuda_graph
                          or a.cuda_graph_backend_decode == "disabled")
    try:
        mem: MemoryPlan | None = plan_memory(_mem_inputs(pa, gpu_mem, max_running, graphs_enabled, faults))
    except KVCacheError:
        mem = None  # reported after the simulated weight load, where SGLang finds out
    return Resolved(
        args=pa, faults=faults, model=model, gpu_mem_mib=gpu_mem, gpu_count=gpu_count,
        context_len=context_len, max_running_requests=mem.max_running_requests if mem else max_running,
        chunked_prefill_size=mem.chunked_prefill_size if mem else (a.chunked_prefill_size or 8192),
        max_prefill_tokens=a.max_prefill_tokens or 16384, page_size=a.page_size or 256,
        moe_runner_backend=moe, mem=mem, model_path=model_path,
        served_model_name=a.served_model_name or model_path, graphs_enabled=graphs_enabled,
    )


def _mem_inputs(pa: targs.ParsedArgs, gpu_mem: int, max_running: int, graphs_enabled: bool,
                faults: Faults) -> MemoryInputs:
    a = pa.ns
    return MemoryInputs(
        gpu_mem_mib=gpu_mem, tp=a.tp_size, pp=a.pp_size or 1, nnodes=a.nnodes or 1,
        mem_fraction_static=a.mem_fraction_static, chunked_prefill_size=a.chunked_prefill_size,
        cuda_graph_max_bs_decode=a.cuda_graph_max_bs_decode, cuda_graph_bs_decode=a.cuda_graph_bs_decode,
        graphs_disabled=not graphs_enabled, disable_custom_all_reduce=a.disable_custom_all_reduce,
        max_running_requests=max_running, max_total_tokens=a.max_total_tokens,
        page_size=a.page_size or 256,
        kv_bytes_per_token=faults.kv_bytes_per_token or KV_BYTES_PER_TOKEN,
        weights_total_gib=faults.weights_gib or WEIGHTS_TOTAL_GIB,
    )
