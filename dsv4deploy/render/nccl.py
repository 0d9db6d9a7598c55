"""NCCL environment presets for PCIe-only RTX PRO 6000 hosts, rendered to an env file.

- ll-ring: what the campaign ran (LL protocol, Ring algorithm) for small decode all-reduces.
- p2p:     P2P allowed across the host bridge, more channels (+70% busbw seen on 8x RTX PRO 6000).
- nop2p:   P2P off, the workaround for NCCL hangs at init under IOMMU/ACS (vllm#33041); it must
           go with SGLang's --disable-custom-all-reduce (validated).
"""

from __future__ import annotations

import re

from dsv4deploy.profile.boundary import rendered_text

PRESETS: dict[str, dict[str, str]] = {
    "ll-ring": {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_IB_DISABLE": "1"},
    "p2p": {"NCCL_P2P_LEVEL": "SYS", "NCCL_IB_DISABLE": "1", "NCCL_MIN_NCHANNELS": "8"},
    "nop2p": {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_MIN_NCHANNELS": "16"},
}


# One host: NCCL's bootstrap and out-of-band sockets and torch's gloo (SGLang's CPU groups) on
# loopback. Each would otherwise pick an interface by itself (NCCL the first non-loopback one,
# gloo the address the host name resolves to), and the unit's IPAddressDeny=any (network.py)
# drops anything but loopback. A profile's nccl.overrides may still set NCCL_SOCKET_IFNAME.
LOOPBACK_SOCKETS = {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}


# NCCL reads KEY=VALUE lines from NCCL_CONF_FILE, else from ~/.nccl.conf with ~ the passwd home
# (getpwuid, not $HOME: src/misc/param.cc), then /etc/nccl.conf. The service account's passwd
# home persists across releases, so a file one release's model code left there would set NCCL
# for the next (and for the probe): NCCL reads an empty file instead. validate.py keeps it.
NO_CONF_FILE = {"NCCL_CONF_FILE": "/dev/null"}


def nccl_environment(preset: str, overrides: dict | None = None, one_host: bool = False) -> dict[str, str]:
    """The preset's variables with the profile's overrides on top, as the text they render to
    (boundary.rendered_text, which load.py has already applied: one value for `4` and `"4"`). With
    ONE_HOST (network.single_host), LOOPBACK_SOCKETS under the overrides; always NO_CONF_FILE."""
    env = {**PRESETS[preset], **(LOOPBACK_SOCKETS if one_host else {}), **NO_CONF_FILE}
    env.update({k: rendered_text(v) for k, v in (overrides or {}).items()})
    return dict(sorted(env.items()))


_C_INTEGER = re.compile(r"[ \t]*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")


def nccl_integer(text: str) -> int | None:
    """TEXT as NCCL reads an integer variable (C strtol, base 0: "1", "01", "0x1" and "+1" are
    all 1, and what follows the number is ignored), or None where no number starts it."""
    match = _C_INTEGER.match(text)
    if match is None:
        return None
    sign, digits = match.groups()
    base = 16 if digits[1:2] in ("x", "X") else 8 if digits.startswith("0") else 10
    value = int(digits, base)
    return -value if sign == "-" else value


_BARE = re.compile(r"[A-Za-z0-9.,:=+/@%^_-]*")


def env_file_value(value: str) -> str:
    """A value as systemd's EnvironmentFile= parser reads it back: bare when it holds only
    characters that parser (and NCCL) take literally, else quoted ('...' is literal there;
    in "..." a backslash escapes only the four characters " \\ ` $)."""
    if _BARE.fullmatch(value):
        return value
    if "'" not in value:
        return f"'{value}'"
    return '"' + re.sub(r'(["\\`$])', r"\\\1", value) + '"'


def render_env_file(env: dict[str, str], header: str,
                    read_by: str = "systemd (EnvironmentFile=) and the NCCL preflight") -> str:
    """The one renderer of environment files (NCCL's, a replica's): values quoted as systemd's
    EnvironmentFile= parser reads them back (unitcheck.env_file proves it)."""
    lines = [f"# {header}", f"# Rendered by dsv4deploy; read by {read_by}."]
    lines += [f"{key}={env_file_value(value)}" for key, value in env.items()]
    return "\n".join(lines) + "\n"
