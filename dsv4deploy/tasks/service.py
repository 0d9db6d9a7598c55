"""The files the unit reads (NCCL env, secrets, launch manifest), the unit itself, and the
restart: daemon-reload and restart only when the collector (host/changes.py) holds a reason.
Every file is compared with the host's state by sha256, mode and owner (host/ops.py).
"""

from __future__ import annotations

import difflib
import hashlib
import os
import shlex
import sys

from pyinfra import host
from pyinfra.api import DeployError, deploy
from pyinfra.api.operation import OperationMeta

from ..hftoken import HfTokenError, hf_token_from_env
from ..host import ops
from ..host.io import sh
from ..host.state import HostState
from ..layout import ETC
from ..rollout import Rollout

LEGACY_SECRETS_ENV = f"{ETC}/secrets.env"   # before systemd credentials: adopted once, never read by the unit


def hf_token_from_control_node(env=os.environ) -> str | None:
    """The operator's HF token: DSV4_HF_TOKEN_FILE (a file) or DSV4_HF_TOKEN. Never a profile key."""
    try:
        return hf_token_from_env(env)
    except HfTokenError as exc:
        raise DeployError(str(exc)) from None


@deploy("Secrets")
def secrets(r: Rollout, state: HostState) -> list[OperationMeta]:
    """The HF token from the control node (before the weights step) and the service's API key
    with SGLang's --config credential, in the root-only secrets directory (service_user makes it).
    A secret file is never shown as a diff (make plan runs --diff): only its hash is compared."""
    layout = r.layout
    token = hf_token_from_control_node()
    if token:
        ops.file(name="HF token from the control node (0600, root)", dest=layout.hf_token_file,
                 content=token.encode(), state=state.file(layout.hf_token_file), mode="600", secret=True)
    if not r.data["server"].get("api_key"):
        return []
    return [ops.api_key(name="API key (generated on the host, 0600) and its SGLang credential",
                        key_file=layout.api_key_file, config_file=layout.sglang_config_secret,
                        state=state["api_key"] or {}, legacy_env=LEGACY_SECRETS_ENV)]


def unit_files(r: Rollout) -> list[tuple[str, str, bytes]]:
    """(label, path, content) of the files the unit reads and the unit itself."""
    L = r.layout
    return [("NCCL env file", L.nccl_env, r.rendered.nccl_env.encode()),
            ("launch manifest", L.manifest, r.rendered.manifest.encode()),
            (f"unit {L.service}.service", L.unit, r.rendered.unit.encode())]


@deploy("Unit and its files")
def config_files(r: Rollout, state: HostState) -> list[OperationMeta]:
    if "--diff" in sys.argv or "--dry" in sys.argv:      # make plan: show what would be written
        for label in files_differ(r, state):
            show_diff(r, state, label)
    return [ops.file(name=label, dest=path, content=content, state=state.file(path))
            for label, path, content in unit_files(r)]


def show_diff(r: Rollout, state: HostState, label: str) -> None:
    """Print the unified diff of one of the unit's files (none of them holds a secret)."""
    _, path, content = next(f for f in unit_files(r) if f[0] == label)
    old = sh(host, f"cat {shlex.quote(path)} 2>/dev/null")[1] if state.file(path) else ""
    diff = difflib.unified_diff(old.splitlines(keepends=True), content.decode().splitlines(keepends=True),
                                fromfile=f"{path} (on the host)", tofile=f"{path} ({r.profile.name})")
    print("".join(f"[{host.name}]   {line}" for line in diff).rstrip("\n"))


@deploy("Restart")
def restart_if_changed(r: Rollout, state: HostState, reasons: list[str]) -> OperationMeta:
    """Restart only with a reason from this run; a stopped or failed unit is started either way.
    Returns the "running" operation: it changes when it had to start a stopped unit."""
    unit = f"{r.layout.service}.service"
    ops.restart(name=f"restart {unit}" + (f" ({'; '.join(reasons)})" if reasons else ""), unit=unit, reasons=reasons)
    info = dict(state["unit"] or {})
    if reasons:
        info["ActiveState"] = "active"     # the restart starts it
    return ops.unit_running(name=f"{unit} running and enabled", unit=unit, info=info)


def files_differ(r: Rollout, state: HostState) -> list[str]:
    """Labels of the unit's files whose content differs on the host (what config_files will
    upload), known before they are written: the release is recorded before the switch."""
    out = []
    for label, path, content in unit_files(r):
        have = state.file(path)
        if not have or have["sha256"] != hashlib.sha256(content).hexdigest():
            out.append(label)
    return out
