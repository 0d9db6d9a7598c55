"""NCCL environment presets for PCIe-only RTX PRO 6000 hosts, rendered to an env file.

- ll-ring: what the campaign ran (LL protocol, Ring algorithm) for small decode all-reduces.
- p2p:     P2P allowed across the host bridge, more channels (+70% busbw seen on 8x RTX PRO 6000).
- nop2p:   P2P off, the workaround for NCCL hangs at init under IOMMU/ACS (vllm#33041); it must
           go with SGLang's --disable-custom-all-reduce (validated).
"""

from __future__ import annotations

PRESETS: dict[str, dict[str, str]] = {
    "ll-ring": {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_IB_DISABLE": "1"},
    "p2p": {"NCCL_P2P_LEVEL": "SYS", "NCCL_IB_DISABLE": "1", "NCCL_MIN_NCHANNELS": "8"},
    "nop2p": {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_MIN_NCHANNELS": "16"},
}


def nccl_environment(preset: str, overrides: dict | None = None) -> dict[str, str]:
    """The preset's variables with the profile's overrides on top, as strings."""
    env = dict(PRESETS[preset])
    env.update({k: str(v) for k, v in (overrides or {}).items()})
    return dict(sorted(env.items()))


def render_env_file(env: dict[str, str], header: str) -> str:
    lines = [f"# {header}", "# Rendered by dsv4deploy; read by systemd (EnvironmentFile=) and the NCCL preflight."]
    lines += [f"{key}={value}" for key, value in env.items()]
    return "\n".join(lines) + "\n"
