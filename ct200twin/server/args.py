"""argv parsing for the twin, built from the emulated SGLang version's own option strings.

SGLang 0.5.23 builds ``argparse.ArgumentParser(prog="sglang serve")`` with the default
``allow_abbrev=True`` (``prepare_server_args``).  We rebuild a parser with exactly the option
strings of that release (``dsv4deploy/data/sglang/<version>.flags``, dumped from the real
parser), so abbreviation and ambiguity behave the same: ``--tp 4`` resolves to ``--tp-size``,
``--cuda-graph-max-bs 32`` fails as *ambiguous*, an unknown flag exits 2 with argparse's message.

Flags the twin acts on get SGLang's type/default/choices; every other option string of the
release is accepted generically (``nargs='*'``: a bare flag becomes True, one value a string,
several a list) and shows up in ``/server_info`` under its dest.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ct200twin.server import DEFAULT_SGLANG_VERSION

FLAGS_DIR = Path(__file__).resolve().parents[2] / "dsv4deploy" / "data" / "sglang"
VERSION_ENV = "DSV4_TWIN_SGLANG_VERSION"

# SGLang 0.5.23 choices (reference/sglang.md section 1.1).
QUANTIZATION_CHOICES = [
    "awq", "fp8", "mxfp8", "gptq", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf", "modelopt",
    "modelopt_fp8", "modelopt_fp4", "nvfp4_online", "modelopt_mixed", "petit_nvfp4", "w8a8_int8",
    "w8a8_fp8", "moe_wna16", "w4afp8", "mxfp4", "auto-round", "auto-round-int8",
    "compressed-tensors", "modelslim", "mxfp_w4a8", "quark", "quark_int4fp8_moe", "quark_mxfp4",
    "mlx_q4", "mlx_q8", "unquant", "humming",
]
MOE_RUNNER_CHOICES = [
    "auto", "deep_gemm", "triton", "triton_kernel", "flashinfer_trtllm", "experimental_sgl_trtllm",
    "flashinfer_trtllm_routed", "flashinfer_cutlass", "flashinfer_mxfp4", "flashinfer_cutedsl",
    "flashinfer_megamoe", "cutlass", "aiter", "marlin", "humming", "experimental_sgl_marlin",
    "lora_triton", "lora_marlin", "hpc_ops", "megamoe", "intel_xpu",
]
CUDA_GRAPH_BACKEND_CHOICES = ["full", "breakable", "disabled"]


def version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def human_readable_int(value: str) -> int:
    """SGLang's ``human_readable_int``: ``131072``, SI ``128k`` (=128000), IEC ``128Ki`` (=131072)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT])?(i)?\s*", str(value))
    if not m or (m.group(3) and not m.group(2)):
        raise ValueError(value)
    number, unit, binary = m.groups()
    if not unit:
        if "." in number:
            raise ValueError(value)
        return int(number)
    power = "kmgt".index(unit.lower()) + 1
    scaled = float(number) * ((1024 if binary else 1000) ** power)
    if scaled != int(scaled):
        raise ValueError(value)
    return int(scaled)


# dest -> (option strings, argparse kwargs).  Option strings absent from the release's flag
# file are dropped, so an older/newer release's spelling behaves as it does there.
_TYPED: list[tuple[str, list[str], dict[str, Any]]] = [
    ("model_path", ["--model-path", "--model"], {"type": str}),
    ("tokenizer_path", ["--tokenizer-path"], {"type": str}),
    ("tp_size", ["--tp-size", "--tensor-parallel-size"], {"type": int, "default": 1}),
    ("dp_size", ["--dp-size", "--data-parallel-size"], {"type": int, "default": 1}),
    ("pp_size", ["--pp-size", "--pipeline-parallel-size"], {"type": int, "default": 1}),
    ("ep_size", ["--ep-size", "--expert-parallel-size", "--ep"], {"type": int, "default": 1}),
    ("mem_fraction_static", ["--mem-fraction-static"], {"type": float}),
    ("context_length", ["--context-length"], {"type": human_readable_int}),
    ("max_total_tokens", ["--max-total-tokens"], {"type": human_readable_int}),
    # 0.5.17 still had --cuda-graph-max-bs as a deprecated alias; dropped when the release lacks it.
    ("cuda_graph_max_bs_decode", ["--cuda-graph-max-bs-decode", "--cuda-graph-max-bs"], {"type": int}),
    ("cuda_graph_bs_decode", ["--cuda-graph-bs-decode", "--cuda-graph-bs"], {"type": int, "nargs": "+"}),
    ("cuda_graph_backend_decode", ["--cuda-graph-backend-decode"], {"choices": CUDA_GRAPH_BACKEND_CHOICES}),
    ("disable_cuda_graph", ["--disable-cuda-graph"], {"action": "store_true"}),
    ("disable_decode_cuda_graph", ["--disable-decode-cuda-graph"], {"action": "store_true"}),
    ("num_continuous_decode_steps", ["--num-continuous-decode-steps"], {"type": int, "default": 1}),
    ("max_running_requests", ["--max-running-requests"], {"type": int}),
    ("chunked_prefill_size", ["--chunked-prefill-size"], {"type": int}),
    ("max_prefill_tokens", ["--max-prefill-tokens"], {"type": int, "default": 16384}),
    ("page_size", ["--page-size"], {"type": int}),
    ("moe_runner_backend", ["--moe-runner-backend"], {"choices": MOE_RUNNER_CHOICES, "default": "auto"}),
    ("quantization", ["--quantization"], {"choices": QUANTIZATION_CHOICES}),
    ("kv_cache_dtype", ["--kv-cache-dtype"], {"default": "auto",
        "choices": ["auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16"]}),
    ("host", ["--host"], {"type": str, "default": "127.0.0.1"}),
    ("port", ["--port"], {"type": int, "default": 30000}),
    ("api_key", ["--api-key"], {"type": str}),
    ("admin_api_key", ["--admin-api-key"], {"type": str}),
    ("enable_metrics", ["--enable-metrics"], {"action": "store_true"}),
    ("served_model_name", ["--served-model-name"], {"type": str}),
    ("disable_custom_all_reduce", ["--disable-custom-all-reduce"], {"action": "store_true"}),
    ("nnodes", ["--nnodes"], {"type": int, "default": 1}),
    ("node_rank", ["--node-rank"], {"type": int, "default": 0}),
    ("dist_init_addr", ["--dist-init-addr", "--nccl-init-addr"], {"type": str}),
    ("dist_timeout", ["--dist-timeout"], {"type": int}),
    ("trust_remote_code", ["--trust-remote-code"], {"action": "store_true"}),
    ("log_level", ["--log-level"], {"type": str, "default": "info"}),
    ("skip_server_warmup", ["--skip-server-warmup"], {"action": "store_true"}),
    ("base_gpu_id", ["--base-gpu-id"], {"type": int, "default": 0}),
    ("random_seed", ["--random-seed"], {"type": int}),
    ("watchdog_timeout", ["--watchdog-timeout"], {"type": float, "default": 300.0}),
    ("decode_log_interval", ["--decode-log-interval"], {"type": int, "default": 40}),
    ("incremental_streaming_output", ["--incremental-streaming-output"], {"action": "store_true"}),
    ("config", ["--config"], {"type": str}),
]


class TwinArgError(Exception):
    pass


@dataclass
class ParsedArgs:
    ns: argparse.Namespace
    argv: list[str]                      # argv as given (before --config merging)
    merged_argv: list[str]               # after --config merging
    version: str
    generic_dests: list[str] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:  # convenience: args.tp_size
        return getattr(self.__dict__["ns"], name)

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self.ns))


def resolve_version(version: str | None = None) -> str:
    """The SGLang release the twin answers as: the one asked for, else DSV4_TWIN_SGLANG_VERSION,
    else the sglang wheel installed next to it (the deploy's venv holds the real one), else the
    default. So a profile pinned to an older release is parsed by that release's flags."""
    if version or os.environ.get(VERSION_ENV):
        return version or os.environ[VERSION_ENV]
    try:
        from importlib.metadata import PackageNotFoundError, version as dist_version
        installed = dist_version("sglang")
    except (ImportError, PackageNotFoundError):
        return DEFAULT_SGLANG_VERSION
    return installed if flag_file(installed).is_file() else DEFAULT_SGLANG_VERSION


def flag_file(version: str) -> Path:
    return FLAGS_DIR / f"{version}.flags"


def load_flags(version: str) -> list[str]:
    path = flag_file(version)
    if not path.is_file():
        known = sorted(p.stem for p in FLAGS_DIR.glob("*.flags"))
        raise TwinArgError(
            f"the twin has no flag file for SGLang {version} ({path}); known: {', '.join(known) or 'none'}")
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def build_parser(version: str) -> tuple[argparse.ArgumentParser, list[str]]:
    flags = load_flags(version)
    present = set(flags)
    parser = argparse.ArgumentParser(prog="sglang serve", allow_abbrev=True)
    used: set[str] = {"-h", "--help"}
    typed_by_first: dict[str, tuple[str, list[str], dict]] = {}
    for dest, opts, kw in _TYPED:
        opts = [o for o in opts if o in present]
        if opts:
            typed_by_first[opts[0]] = (dest, opts, kw)
            used.update(opts)
    generic: list[str] = []
    # Add in the release's parser order so usage/error text lists options as SGLang does.
    for flag in flags:
        if flag in typed_by_first:
            dest, opts, kw = typed_by_first[flag]
            parser.add_argument(*opts, dest=dest, **kw)
        elif flag not in used and flag.startswith("--"):
            dest = flag[2:].replace("-", "_")
            parser.add_argument(flag, dest=dest, nargs="*", default=None)
            generic.append(dest)
            used.add(flag)
    return parser, generic


def _config_to_argv(path: str) -> list[str]:
    import yaml  # pyyaml is a dependency of the package

    if Path(path).suffix.lower() not in (".yaml", ".yml"):     # as SGLang's merger (0.5.23) refuses it
        raise TwinArgError(f"Config file must be YAML format, got: {Path(path).suffix}")
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise TwinArgError(f"Config file not found: {path}") from None
    if not isinstance(data, dict):
        raise TwinArgError(f"Config file must be a YAML mapping of options: {path}")
    out: list[str] = []
    for key, value in data.items():
        opt = "--" + str(key).replace("_", "-")
        if value is True:
            out.append(opt)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            out.append(opt)
            out.extend(str(v) for v in value)
        else:
            out.extend([opt, str(value)])
    return out


def merge_config(argv: list[str]) -> list[str]:
    """SGLang's ``--config FILE``: the YAML's options come first, command-line options win."""
    for i, a in enumerate(argv):
        if a == "--config" and i + 1 < len(argv):
            rest = argv[:i] + argv[i + 2:]
            return _config_to_argv(argv[i + 1]) + rest
        if a.startswith("--config="):
            rest = argv[:i] + argv[i + 1:]
            return _config_to_argv(a.split("=", 1)[1]) + rest
    return list(argv)


def parse_args(argv: list[str], version: str | None = None) -> ParsedArgs:
    """Parse like SGLang; argparse errors exit 2 (SystemExit) exactly as ``sglang serve`` does."""
    version = resolve_version(version)
    parser, generic = build_parser(version)
    try:
        merged = merge_config(argv)
    except TwinArgError as e:
        parser.error(str(e))
    ns = parser.parse_args(merged)
    for dest in generic:
        v = getattr(ns, dest)
        if isinstance(v, list):
            setattr(ns, dest, True if not v else (v[0] if len(v) == 1 else v))
    # a release without some flag still has the setting (ServerArgs' default): e.g. 0.5.13.post1
    # has no --disable-decode-cuda-graph or --cuda-graph-backend-decode
    for dest, _opts, kw in _TYPED:
        if not hasattr(ns, dest):
            setattr(ns, dest, kw.get("default", False if kw.get("action") == "store_true" else None))
    if ns.model_path is None:
        parser.error("the following arguments are required: --model-path")
    return ParsedArgs(ns=ns, argv=list(argv), merged_argv=merged, version=version, generic_dests=generic)


def has_ready_endpoint(version: str) -> bool:
    return version_key(version) >= (0, 5, 20)


if __name__ == "__main__":  # debugging aid: print the resolved namespace
    print(parse_args(sys.argv[1:]).as_dict())
