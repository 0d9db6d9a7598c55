"""The files the unit reads (NCCL env, secrets, launch manifest), the unit itself, and the
restart: daemon-reload and restart only when one of them, the venv or the weights changed.
"""

from __future__ import annotations

import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import FactBase, StringCommand, deploy, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import files, server, systemd

from ..facts import UnitInfo
from ..rollout import Rollout


class ApiKeyState(FactBase):
    """Whether the secrets file holds an API key, and whether SGLang's --config file matches it."""

    def command(self, secrets_env: str, secret_args: str):
        s, a = shlex.quote(secrets_env), shlex.quote(secret_args)
        return (f"k=$(sed -n 's/^SGLANG_API_KEY=//p' {s} 2>/dev/null | tail -n1); "
                f"[ -n \"$k\" ] && echo key=yes || echo key=no; "
                f"[ -n \"$k\" ] && [ \"$(cat {a} 2>/dev/null)\" = \"api-key: \\\"$k\\\"\" ] && echo args=yes || echo args=no")

    def process(self, output):
        found = dict(line.split("=", 1) for line in output if "=" in line)
        return {"key": found.get("key") == "yes", "args": found.get("args") == "yes"}


@operation()
def api_key(secrets_env: str, secret_args: str, user: str):
    """Generate the API key on the host once (it never leaves it, never in argv or logs) and give
    SGLang a 0600 --config file holding it."""
    state = host.get_fact(ApiKeyState, secrets_env=secrets_env, secret_args=secret_args)
    if state["key"] and state["args"]:
        host.noop("API key present")
        return
    s, a = shlex.quote(secrets_env), shlex.quote(secret_args)
    if not state["key"]:
        yield StringCommand(f"umask 077; printf 'SGLANG_API_KEY=%s\\n' \"$(od -An -N24 -tx1 /dev/urandom | tr -d ' \\n')\" >> {s}")
    yield StringCommand(f"umask 077; k=$(sed -n 's/^SGLANG_API_KEY=//p' {s} | tail -n1); "
                        f"printf 'api-key: \"%s\"\\n' \"$k\" > {a}.tmp && chown {user}:{user} {a}.tmp && mv {a}.tmp {a}")


@deploy("Secrets")
def secrets(r: Rollout) -> list[OperationMeta]:
    """The 0600 secrets file (HF token, API key), and SGLang's --config file for the key.
    Before the launch check, which parses --config."""
    layout, user = r.layout, r.data["service"]["user"]
    files.file(name="secrets file (0600, root)", path=layout.secrets_env, touch=False, present=True,
               mode="600", user="root", group="root")
    if not r.data["server"].get("api_key"):
        return []
    return [api_key(name="API key (generated on the host, 0600)", secrets_env=layout.secrets_env,
                    secret_args=layout.secret_args, user=user)]


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
