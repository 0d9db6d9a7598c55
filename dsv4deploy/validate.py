"""Semantic checks of a schema-valid profile: what JSON Schema cannot say.

Errors fail (exit 2, nothing on the host is touched); warnings are listed. The GPU-memory
budget (memory.py) is part of the report so `dsv4deploy validate` can show it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import catalog
from .errors import Problem
from .memory import Budget, budget
from .patches import MASK_SECRETS_PATCH, profile_entry
from .profiles import Profile
from .render import MANAGED_FLAGS, flag_owner
from .sglang_versions import facts, known_versions

PLACEHOLDER_REVISION = "0" * 40
NO_SM120_KERNELS = {"auto", "flashinfer_trtllm_routed", "flashinfer_trtllm", "deep_gemm",
                    "flashinfer_cutedsl", "flashinfer_megamoe", "megamoe"}


@dataclass
class Report:
    profile: Profile
    problems: list[Problem] = field(default_factory=list)
    budget: Budget | None = None

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors


def validate(profile: Profile) -> Report:
    report = Report(profile)
    add = report.problems.append
    data = profile.data
    server, hw = data["server"], data["hardware"]
    gpu = catalog.gpu(hw["gpu"])
    model = catalog.model(data["model"]["repo"])
    version = facts(data["sglang"]["version"])

    if version is None:
        add(profile.problem(("sglang", "version"),
                            f"no flag data for SGLang {data['sglang']['version']}; "
                            f"known versions: {', '.join(known_versions())}"))
    if model is None:
        add(profile.problem(("model", "repo"),
                            f"not in the model catalog; known: {', '.join(catalog.model_repos())}"))
        return report
    if data["model"]["revision"] == PLACEHOLDER_REVISION:
        add(profile.problem(("model", "revision"), "placeholder revision: pin the checkpoint commit you validated",
                            "warning"))

    _parallelism(profile, server, hw, model, add)
    _context(profile, server, model, add)
    _kernels(profile, server, gpu, version, add)
    _nccl(profile, data, add)
    if version is not None:
        _extra_args(profile, server, version, add)
    if data["driver"]["branch"] < gpu.min_driver_branch:
        add(profile.problem(("driver", "branch"), f"{gpu.name} (compute capability {gpu.compute_cap}) needs "
                            f"driver branch >= {gpu.min_driver_branch}, got {data['driver']['branch']}"))
    if version is not None and server.get("api_key"):
        _api_key_masked(profile, version, add)
    if data["service"].get("hardening") == "off":
        add(profile.problem(("service", "hardening"), "the unit runs without a sandbox: the server runs model "
                            "code with full access to the host as its user; use strict or standard", "warning"))
    if not any("min_output_throughput" in lvl for lvl in data["gate"]["levels"]):
        add(profile.problem(("gate", "levels"), "no level has min_output_throughput: the smoke gate "
                            "checks only failed requests", "warning"))

    b = budget(server, gpu, model, data.get("calibration"))
    report.budget = b
    _memory(profile, b, add)
    return report


def _parallelism(profile, server, hw, model, add) -> None:
    tp, nnodes = server["tp_size"], server["nnodes"]
    if model.attention_heads % tp:
        add(profile.problem(("server", "tp_size"),
                            f"tensor parallelism {tp} does not divide the model's {model.attention_heads} attention heads"))
    if tp % nnodes:
        add(profile.problem(("server", "nnodes"), f"tp_size {tp} is not a multiple of nnodes {nnodes}"))
    elif tp // nnodes > hw["gpus_per_host"]:
        add(profile.problem(("server", "tp_size"),
                            f"needs {tp // nnodes} GPUs per host (tp_size {tp} / nnodes {nnodes}), "
                            f"the host has {hw['gpus_per_host']}"))
    if nnodes > 1:
        add(profile.problem(("server", "nnodes"), "multi-node rendering (--node-rank, --dist-init-addr per "
                            "host) is not supported yet"))


def _context(profile, server, model, add) -> None:
    ctx = server.get("context_length")
    if ctx is not None and ctx > model.max_context:
        add(profile.problem(("server", "context_length"),
                            f"{ctx} exceeds the model's maximum context {model.max_context}"))
    effective = ctx or model.max_context
    for i, level in enumerate(profile.data["gate"]["levels"]):
        need = level.get("input_len", 256) + level.get("output_len", 256)
        if need > effective:
            add(profile.problem(("gate", "levels", i),
                                f"a request of {need} tokens (input + output) exceeds context_length {effective}"))


def _kernels(profile, server, gpu, version, add) -> None:
    backend = server["moe_runner_backend"]
    if gpu.compute_cap.startswith("12.") and backend in NO_SM120_KERNELS:
        add(profile.problem(("server", "moe_runner_backend"),
                            f"{backend!r} has no kernels for {gpu.name} (sm_{gpu.compute_cap.replace('.', '')}); "
                            "name one that does, e.g. marlin or flashinfer_mxfp4"))
    if version and version.moe_runner_backends and backend not in version.moe_runner_backends:
        add(profile.problem(("server", "moe_runner_backend"),
                            f"SGLang {version.version} does not offer {backend!r}"))
    repo = profile.data["model"]["repo"]
    if version and "NVFP4" in repo and not version.nvfp4_dsv4_moe and not profile.data["sglang"]["patches"]:
        add(profile.problem(("sglang", "patches"),
                            f"SGLang {version.version} predates PR #25820 (NVFP4 MoE for DeepSeek-V4): "
                            "add the patch or pin a newer version"))


def _api_key_masked(profile, version, add) -> None:
    """SGLang logs `server_args=ServerArgs(... api_key=...)` at startup and shows the key in
    /server_info: an API key is only safe with the shipped mask patch for that release."""
    mask = version.secrets_mask_patch
    if mask is None:
        add(profile.problem(("server", "api_key"), f"SGLang {version.version} writes the API key into the journal "
                            "(server_args log line) and /server_info, and dsv4deploy ships no mask patch for it: "
                            f"use SGLang {MASK_SECRETS_PATCH['sglang_version']} with its mask patch"))
    elif not any(p.get("sha256") == mask for p in profile.data["sglang"].get("patches") or []):
        entry = profile_entry()
        add(profile.problem(("sglang", "patches"), f"server.api_key needs the mask patch, or SGLang {version.version} "
                            "writes the key into the journal and /server_info; add to sglang.patches: "
                            f"{{name: {entry['name']}, file: {entry['file']}, sha256: {entry['sha256']}}}"))


def _nccl(profile, data, add) -> None:
    if data["nccl"]["preset"] == "nop2p" and not data["server"]["disable_custom_all_reduce"]:
        add(profile.problem(("server", "disable_custom_all_reduce"),
                            "the nop2p NCCL preset needs disable_custom_all_reduce: true (SGLang's custom "
                            "all-reduce uses P2P itself)"))
    if data["nccl"].get("overrides", {}).get("NCCL_P2P_DISABLE") == "1" and not data["server"]["disable_custom_all_reduce"]:
        add(profile.problem(("nccl", "overrides", "NCCL_P2P_DISABLE"),
                            "P2P off needs server.disable_custom_all_reduce: true"))


def _extra_args(profile, server, version, add) -> None:
    for i, word in enumerate(server.get("extra_args") or []):
        path = ("server", "extra_args", i)
        if not word.startswith("--"):
            continue  # a value of the previous flag
        name = word.split("=", 1)[0]
        owner = flag_owner(word)
        if owner:
            add(profile.problem(path, f"{name} is managed by the profile (server.{owner} / "
                                f"{', '.join(MANAGED_FLAGS[owner])}); set it there"))
        elif not version.accepts(name):
            near = sorted(f for f in version.flags if f.startswith(name))
            hint = f"; abbreviations are not allowed: write {near[0]}" if len(near) == 1 else ""
            add(profile.problem(path, f"SGLang {version.version} has no flag {name}{hint}"))


def _memory(profile, b: Budget, add) -> None:
    frac = ("server", "mem_fraction_static")
    if b.kv_pool_gib <= 0:
        add(profile.problem(frac, f"weights need {b.weights_gib:.1f} GiB per GPU but the static share is "
                            f"{b.static_gib:.1f} GiB ({b.fraction} x {b.capacity_gib:.1f} GiB): no room for the KV cache"))
        return
    if not b.fits:
        add(profile.problem(frac, (
            f"CUDA-graph capture would run out of GPU memory: headroom {b.headroom_gib:.1f} GiB "
            f"(capacity {b.capacity_gib:.1f} - static {b.static_gib:.1f} - CUDA context {b.cuda_context_gib:.1f}) "
            f"< reserve {b.reserve_gib:.1f} GiB (decode graphs up to bs "
            f"{profile.data['server'].get('cuda_graph_max_bs_decode')} over {b.allreduce_path} all-reduce "
            f"{b.graph_gib:.1f} + activations {b.activations_gib:.1f} + NCCL {b.nccl_gib:.1f} + margin "
            f"{b.margin_gib:.1f}); use mem_fraction_static <= {max(b.max_safe_fraction, 0):.2f} or a smaller "
            f"cuda_graph_max_bs_decode")))
    if b.kv_tokens < b.context_length:
        add(profile.problem(frac, f"KV pool {b.kv_pool_gib:.1f} GiB holds {b.kv_tokens:,} tokens, less than one "
                            f"full-context request ({b.context_length:,}); lower context_length or raise the fraction"))
    elif b.full_context_requests < b.max_running_requests:
        add(profile.problem(("server", "max_running_requests"),
                            f"KV pool holds {b.full_context_requests:.1f} full-context requests "
                            f"({b.kv_tokens:,} tokens / {b.context_length:,}), fewer than "
                            f"max_running_requests {b.max_running_requests}", "warning"))
