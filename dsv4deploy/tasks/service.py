"""The files the unit reads (NCCL env, secrets, launch manifest), the unit itself, and the
switch: a release's pending record, those files, then daemon-reload and restart only when the
collector (changes.py) holds a reason, in one command.
Every file is compared with the host's state by sha256, mode and owner (host/ops.py).
"""

from __future__ import annotations

import difflib
import hashlib
import shlex

from pyinfra import host
from pyinfra.api import DeployError, deploy
from pyinfra.api.operation import OperationMeta

from dsv4deploy.profile.boundary import escaped
from dsv4deploy.weights.hftoken import HfTokenError, hf_token_from_env
from dsv4deploy.host import ops
from dsv4deploy.host.io import sh
from dsv4deploy.host.state import HostState
from dsv4deploy.render.keys import has_admin_key
from dsv4deploy.render.layout import ETC
from dsv4deploy.tasks.release import Pending
from dsv4deploy.release.rollout import Rollout

LEGACY_SECRETS_ENV = f"{ETC}/secrets.env"   # before systemd credentials: adopted once, never read by the unit


def hf_token_from_control_node(env) -> str | None:
    """The operator's HF token: DSV4_HF_TOKEN_FILE (a file) or DSV4_HF_TOKEN. Never a profile key."""
    try:
        return hf_token_from_env(env)
    except HfTokenError as exc:
        raise DeployError(str(exc)) from None


@deploy("Secrets")
def secrets(r: Rollout, state: HostState) -> list[OperationMeta]:
    """The HF token from the control node (before the weights step) and the service's keys (the
    inference key and SGLang's admin key in SGLang's --config credential; a replica set's gateway
    control-plane key), each its own file in the root-only secrets directory (service_user makes it).
    A secret file is never shown as a diff (make plan runs --diff): only its hash is compared."""
    layout = r.layout
    token = hf_token_from_control_node(r.settings.environ)
    if token:
        ops.file(name="HF token from the control node (0600, root)", dest=layout.hf_token_file,
                 content=token.encode(), state=state.file(layout.hf_token_file), mode="600", secret=True)
    if not r.data["server"].get("api_key"):
        return []
    keys = state["api_key"] or {}
    present = set(keys.get("present") or ())
    admin = has_admin_key(r.data)
    server = []
    if admin:
        server.append(ops.generated_key(name="SGLang admin key (generated on the host, 0600)",
                                        key_file=layout.admin_key_file, present=layout.admin_key_file in present))
    server.append(ops.api_key(name="inference key (generated on the host, 0600) and the server's SGLang credential",
                              key_file=layout.api_key_file, config_file=layout.sglang_config_secret,
                              admin_file=layout.admin_key_file if admin else None, state=keys,
                              legacy_env=LEGACY_SECRETS_ENV))
    if r.target.is_set:     # not a reason to restart the replicas: the gateway restarts for it (GatewayStale)
        ops.generated_key(name="gateway control-plane key (generated on the host, 0600)",
                          key_file=layout.gateway_control_key_file,
                          present=layout.gateway_control_key_file in present)
    return server


def unit_files(r: Rollout) -> list[tuple[str, str, bytes]]:
    """(label, path, content) of the files the unit reads and the unit itself; for a replica set,
    the template unit, each replica's two env files, the gateway's unit and launcher."""
    L, rendered = r.layout, r.rendered
    if rendered.gateway is None:
        return [("NCCL env file", L.nccl_env, rendered.nccl_env.encode()),
                ("launch manifest", L.manifest, rendered.manifest.encode()),
                (f"unit {L.service}.service", L.unit, rendered.unit.encode())]
    files = rendered.files
    out = []
    for rep in rendered.replicas:
        out += [(f"replica {rep.index} env file", rep.env_file, files[rep.env_file].encode()),
                (f"replica {rep.index} NCCL env file", rep.nccl_env_file, files[rep.nccl_env_file].encode())]
    gw = rendered.gateway
    return out + [("launch manifest", L.manifest, rendered.manifest.encode()),
                  (f"unit {L.service}@.service", L.template_unit, rendered.unit.encode()),
                  (GATEWAY_LAUNCHER, gw.launcher, files[gw.launcher].encode()),
                  (f"{GATEWAY_UNIT} {gw.service}.service", gw.unit_path, gw.unit.encode())]


GATEWAY_LAUNCHER, GATEWAY_UNIT = "gateway launcher", "gateway unit"


def gateway_files_differ(labels: list[str]) -> bool:
    """Whether the gateway's own files are among the changed LABELS (it restarts only then)."""
    return any(label == GATEWAY_LAUNCHER or label.startswith(GATEWAY_UNIT) for label in labels)


@deploy("Unit and its files")
def config_files(r: Rollout, state: HostState, pending: Pending | None = None) -> list[OperationMeta]:
    """The files a replica set's units read and the units (one command, after PENDING's record
    when there is one); switch_set restarts them one at a time."""
    return [ops.files(name=_files_name(r, state, pending), items=_items(r, state), **_carried(pending))]


@deploy("Restart")
def switch(r: Rollout, state: HostState, reasons: list[str], pending: Pending | None = None) -> OperationMeta:
    """The switch, in one command: PENDING's record first, the unit's files that differ, then
    daemon-reload and the restart, only with a reason from this run (each part only if the one
    before it succeeded). A stopped or failed unit is started either way. Returns the "running"
    operation: it changes when it had to start a stopped unit."""
    unit = f"{r.layout.service}.service"
    set_running = state.unit(r.layout.gateway_service).get("ActiveState") == "active"
    first = ops.stop_set_units(r.layout.service) if set_running else ""    # a replica set gives back the port and GPUs
    if reasons:
        name = f"restart {unit} ({'; '.join(reasons)})" + (" after stopping the replica set" if set_running else "")
        name += f", after {pending.release.name} recorded pending" if pending else ""
    else:
        name = _files_name(r, state, pending)
    ops.files(name=name, items=_items(r, state), after=ops.restart_command(unit, first) if reasons else "",
              **_carried(pending))
    info = dict(state["unit"] or {})
    if reasons:
        info["ActiveState"] = "active"     # the restart starts it
    return ops.unit_running(name=f"{unit} running and enabled", unit=unit, info=info)


def _carried(pending: Pending | None) -> dict:
    """ops.files' arguments that carry PENDING's record, first, and its callback (none: {})."""
    return {"before": pending.command, "done": pending.done} if pending else {}


def _items(r: Rollout, state: HostState) -> list[tuple[str, bytes, dict | None]]:
    if r.settings.show_diffs:      # make plan (--dry --diff): show what would be written
        for label in files_differ(r, state):
            show_diff(r, state, label)
    return [(path, content, state.file(path)) for _, path, content in unit_files(r)]


def _files_name(r: Rollout, state: HostState, pending: Pending | None) -> str:
    differ = files_differ(r, state)
    return ((f"{pending.release.name} pending, " if pending else "")
            + (", ".join(differ) if differ else "unit files up to date"))


_END = "@@dsv4deploy-end@@"


def show_diff(r: Rollout, state: HostState, label: str) -> None:
    """Print the unified diff of one of the unit's files (none of them holds a secret)."""
    _, path, content = next(f for f in unit_files(r) if f[0] == label)
    old = ""
    if state.file(path):
        # pyinfra hands back output as lines, the last one's newline dropped: a mark after the
        # content keeps it (else every plan showed the last line as removed and added again)
        out = sh(host, f"cat {shlex.quote(path)} 2>/dev/null; echo {_END}")[1]
        old = out[:-len(_END)] if out.endswith(_END) else out
    print("\n".join(f"[{host.name}]   {line}" for line in file_diff(old, content.decode(), path, r.profile.name)))


def file_diff(old: str, new: str, path: str, profile: str) -> list[str]:
    """The unified diff of a file's text on the host (OLD) and as PROFILE renders it (NEW), one
    line each, without their newlines; a side that lacks its final newline says so, as diff does.
    Lines end at "\n" only, as systemd reads them (str.splitlines would also end one at \r, \f or
    U+2028), and what the host's side holds that is not printable is shown escaped, so a file
    on the host cannot drive the operator's terminal."""
    lines = []
    for line in difflib.unified_diff(_lines(old), _lines(new),
                                     fromfile=f"{path} (on the host)", tofile=f"{path} ({profile})"):
        body = line[:-1] if line.endswith("\n") else line
        lines.append(escaped(body, keep="\t"))
        if not line.endswith("\n"):
            lines.append("\\ No newline at end of file")
    return lines


def _lines(text: str) -> list[str]:
    """TEXT's lines, each with its "\n" (the last without one if the text lacks it)."""
    pieces = text.split("\n")
    return [piece + "\n" for piece in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])


def files_differ(r: Rollout, state: HostState) -> list[str]:
    """Labels of the unit's files whose content differs on the host (what the switch, or
    config_files for a replica set, will write), known before they are written: the release is
    recorded before the switch."""
    out = []
    for label, path, content in unit_files(r):
        have = state.file(path)
        if not have or have["sha256"] != hashlib.sha256(content).hexdigest():
            out.append(label)
    return out
