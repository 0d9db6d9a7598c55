"""The files the unit reads (NCCL env, secrets, launch manifest), the unit itself, and the
restart: daemon-reload and restart only when one of them, the venv or the weights changed.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import DeployError, FactBase, FileUploadCommand, StringCommand, deploy, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.facts.files import Sha256File
from pyinfra.operations import files, server, systemd

from ..facts import UnitInfo
from ..hftoken import HfTokenError, hf_token_from_env
from ..layout import ETC
from ..rollout import Rollout

LEGACY_SECRETS_ENV = f"{ETC}/secrets.env"   # before systemd credentials: adopted once, never read by the unit


class ApiKeyState(FactBase):
    """Whether the API key file exists, and whether SGLang's --config credential holds it.
    Prints only yes/no: the key itself never leaves the host."""

    def command(self, key_file: str, config_file: str):
        k, c = shlex.quote(key_file), shlex.quote(config_file)
        return (f"k=$(cat {k} 2>/dev/null); "
                f"[ -n \"$k\" ] && echo key=yes || echo key=no; "
                f"[ -n \"$k\" ] && [ \"$(cat {c} 2>/dev/null)\" = \"api-key: \\\"$k\\\"\" ] "
                f"&& echo config=yes || echo config=no")

    def process(self, output):
        found = dict(line.split("=", 1) for line in output if "=" in line)
        return {"key": found.get("key") == "yes", "config": found.get("config") == "yes"}


@operation()
def api_key(key_file: str, config_file: str, legacy_env: str = LEGACY_SECRETS_ENV):
    """Generate the API key on the host once (it never leaves it: not in argv, the unit, the
    environment or any log) and write SGLang's --config YAML for it, both 0600 root; the unit
    hands the YAML to the server as a systemd credential. A key from an older layout is kept."""
    state = host.get_fact(ApiKeyState, key_file=key_file, config_file=config_file)
    if state["key"] and state["config"]:
        host.noop("API key present")
        return
    k, c, old = shlex.quote(key_file), shlex.quote(config_file), shlex.quote(legacy_env)
    if not state["key"]:
        yield StringCommand(
            f"umask 077; k=$(sed -n 's/^SGLANG_API_KEY=//p' {old} 2>/dev/null | tail -n1); "
            f"[ -n \"$k\" ] || k=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \\n'); "
            f"printf '%s\\n' \"$k\" > {k}.tmp && mv {k}.tmp {k}")
    yield StringCommand(f"umask 077; printf 'api-key: \"%s\"\\n' \"$(cat {k})\" > {c}.tmp && mv {c}.tmp {c}")


@operation()
def secret_file(path: str, content: str):
    """A 0600 root file with `content`, uploaded only when its sha256 differs. Unlike files.put
    it never shows a diff (make plan runs --diff), so the secret stays off the control node's output."""
    digest = hashlib.sha256(content.encode()).hexdigest()
    if host.get_fact(Sha256File, path=path) == digest:
        host.noop(f"{path} up to date")
        return
    yield StringCommand(f"umask 077; : > {shlex.quote(path)}.tmp")
    yield FileUploadCommand(StringIO(content), f"{path}.tmp")
    yield StringCommand(f"chown root:root {shlex.quote(path)}.tmp && chmod 600 {shlex.quote(path)}.tmp "
                        f"&& mv {shlex.quote(path)}.tmp {shlex.quote(path)}")


def hf_token_from_control_node(env=os.environ) -> str | None:
    """The operator's HF token: DSV4_HF_TOKEN_FILE (a file) or DSV4_HF_TOKEN. Never a profile key."""
    try:
        return hf_token_from_env(env)
    except HfTokenError as exc:
        raise DeployError(str(exc)) from None


@deploy("Secrets")
def secrets(r: Rollout) -> list[OperationMeta]:
    """The root-only secrets directory: the HF token from the control node (before the weights
    step) and the service's API key with SGLang's --config credential. Before the launch check."""
    layout = r.layout
    files.directory(name="secrets dir (0700, root)", path=layout.secrets_dir, user="root", group="root",
                    mode="700")
    token = hf_token_from_control_node()
    if token:
        secret_file(name="HF token from the control node (0600, root)", path=layout.hf_token_file, content=token)
    if not r.data["server"].get("api_key"):
        return []
    return [api_key(name="API key (generated on the host, 0600) and its SGLang credential",
                    key_file=layout.api_key_file, config_file=layout.sglang_config_secret)]


@deploy("Unit and its files")
def config_files(r: Rollout) -> list[OperationMeta]:
    layout = r.layout
    return [
        files.put(name="NCCL env file", src=StringIO(r.rendered.nccl_env), dest=layout.nccl_env, mode="644"),
        files.put(name="launch manifest", src=StringIO(r.rendered.manifest), dest=layout.manifest, mode="644"),
        files.put(name=f"unit {layout.service}.service", src=StringIO(r.rendered.unit), dest=layout.unit, mode="644"),
    ]


@deploy("Restart")
def restart_if_changed(r: Rollout, when) -> OperationMeta:
    """`when` is evaluated at execution time: restart only if this run changed something.
    Returns the "running" operation: it changes when it had to start a stopped or failed unit."""
    unit = f"{r.layout.service}.service"
    not_active = lambda: host.get_fact(UnitInfo, service=r.layout.service).get("ActiveState") != "active"  # noqa: E731
    systemd.daemon_reload(name="daemon-reload", _if=when)
    # The unit's start limit is there to end crash loops; a deploy's own (re)start begins afresh.
    server.shell(name=f"reset {unit}'s start-limit counter", commands=[f"systemctl reset-failed {unit} || true"],
                 _if=lambda: when() or not_active())
    systemd.service(name=f"restart {unit} (something changed)", service=unit, restarted=True, _if=when)
    return systemd.service(name=f"{unit} running and enabled", service=unit, running=True, enabled=True)
