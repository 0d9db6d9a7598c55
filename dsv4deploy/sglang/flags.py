"""The flag table: which SGLang flags and unit variables the profile manages, and which flags
SGLang declares but never reads. Rendering spells flags from it; validation refuses an
extra_args word or an env key that would repeat one (render.py and validate.py both read it).
"""

from __future__ import annotations

from dsv4deploy.profile.boundary import rendered_text

# PATH for the unit: SGLang sizes memory through nvidia-smi, which must be found.
UNIT_PATH = "/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Environment the unit always sets; a profile's server.env may not repeat these.
MANAGED_ENV = {"PATH": UNIT_PATH, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def unit_environment(data: dict) -> dict[str, str]:
    """The unit's Environment=, in its order: MANAGED_ENV, then the profile's server.env as the
    text boundary.rendered_text gives it (true/false as 1/0), the text validate.py judged. The
    unit's renderers and the NCCL probe's ranks read it from here."""
    return {**MANAGED_ENV, **{k: rendered_text(v) for k, v in sorted((data["server"].get("env") or {}).items())}}

def home_environment(home: str) -> dict[str, str]:
    """HOME and every cache folder the server's libraries pick by themselves, under HOME: the
    server gets its venv's own folder (render/layout.py Layout.home), the NCCL probe a fresh
    empty one. Each library would otherwise write under the account's persistent home or /tmp
    and load what it finds there. Names as read by SGLang 0.5.23 (environ.py, whose own
    redirect_third_party_caches sets the same subfolders of SGLANG_CACHE_DIR, but only when it
    runs before the library is imported), flashinfer 0.7.2 (jit/env.py), tvm-ffi 0.1.11,
    triton 3.8 and CUTLASS's DSL (else /tmp/<user>); XDG_CACHE_HOME covers the rest
    (huggingface, torch hub and extensions, DeepGEMM, outlines)."""
    cache = f"{home}/.cache"
    sglang = f"{cache}/sglang"
    return {"HOME": home, "XDG_CACHE_HOME": cache, "XDG_CONFIG_HOME": f"{home}/.config",
            "XDG_DATA_HOME": f"{home}/.local/share", "HF_HOME": f"{cache}/huggingface",
            "SGLANG_CACHE_DIR": sglang, "TRITON_HOME": home, "TRITON_CACHE_DIR": f"{sglang}/triton",
            "TORCHINDUCTOR_CACHE_DIR": f"{sglang}/inductor", "CUDA_CACHE_PATH": f"{sglang}/nv",
            "TILELANG_CACHE_DIR": f"{sglang}/tilelang", "FLASHINFER_WORKSPACE_BASE": sglang,
            "TVM_FFI_CACHE_DIR": f"{cache}/tvm-ffi", "CUTE_DSL_CACHE_DIR": f"{cache}/cutlass"}


HOME_ENV = tuple(home_environment("/"))   # names a profile's server.env may not set (validate.py)

# Flags the profile manages, with every alias SGLang accepts for them: extra_args may not
# repeat them (an override buried in extra_args is how a launch silently differs from its profile).
MANAGED_FLAGS: dict[str, tuple[str, ...]] = {
    "model": ("--model-path", "--model"),
    "served_model_name": ("--served-model-name",),
    "tp_size": ("--tp-size", "--tensor-parallel-size"),
    "nnodes": ("--nnodes",),
    "mem_fraction_static": ("--mem-fraction-static",),
    "context_length": ("--context-length",),
    "cuda_graph_max_bs_decode": ("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs"),
    "moe_runner_backend": ("--moe-runner-backend",),
    "max_running_requests": ("--max-running-requests",),
    "chunked_prefill_size": ("--chunked-prefill-size",),
    "disable_custom_all_reduce": ("--disable-custom-all-reduce",),
    "enable_metrics": ("--enable-metrics",),
    "trust_remote_code": ("--trust-remote-code",),
    "host": ("--host",),
    "port": ("--port",),
    "log_level": ("--log-level",),
    "api_key": ("--api-key", "--config"),
    "quantization": ("--quantization",),
}


# Flags SGLang declares but never reads: rendering them changes nothing but what the launch
# appears to promise. Neither the renderer nor extra_args passes them on.
UNREAD_FLAGS: dict[str, str] = {
    "--num-continuous-decode-steps": "declared by SGLang 0.5.12-0.5.23 but never read (the PR that "
                                     "would wire it up was closed unmerged); not rendered",
}


def flag_owner(flag: str) -> str | None:
    """The profile key that manages `flag` (given as `--x` or `--x=value`), if any."""
    name = flag.split("=", 1)[0]
    for key, spellings in MANAGED_FLAGS.items():
        if name in spellings:
            return key
    return None


def flag(key: str) -> str:
    """The spelling the renderer writes for profile key `server.KEY`."""
    return MANAGED_FLAGS[key][0]
