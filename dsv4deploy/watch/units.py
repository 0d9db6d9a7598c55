"""The watch's files on the host, rendered pure: its three programs (copied, checked by sha256),
its settings (watch.json: what to measure and the release's own gate figures to compare with),
and four units: the timer and the oneshot it starts (the unprivileged account's, sandboxed to
an exposure under 2.0 in `systemd-analyze security`), and the root oneshot a path unit starts
when the watch leaves an action request. None of them is part of a release's manifest: changing
the watch never restarts the server.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from dsv4deploy.host import HOST_PYTHON
from dsv4deploy.host.state import LOCK        # the deploy lock every run takes
from dsv4deploy.profile import replicas
from dsv4deploy.render.layout import ETC, OPT, RELEASES, STATE
from dsv4deploy.watch import decide

USER = "dsv4-watch"                     # its own system account: no login, no home, no files elsewhere
SERVICE, ACT = "dsv4-watch", "dsv4-watch-act"
PROGRAM_DIR = f"{OPT}/watch"
CONFIG = f"{ETC}/watch/watch.json"
PAUSED = f"{ETC}/watch/paused"          # present: the watch measures nothing and decides nothing
STATE_DIR = "/var/lib/dsv4-watch"       # StateDirectory= of its unit: the account's own
STATE_FILE = f"{STATE_DIR}/state.json"
REQUESTS = f"{STATE_DIR}/requests"
# The metrics: the agent writes them in its own folder (atomically, by rename), and the deploy links
# them into node_exporter's textfile folder, which stays root's: the watch writes nowhere else.
PROM_NAME = "dsv4deploy_watch.prom"
PROM_FILE = f"{STATE_DIR}/{PROM_NAME}"
PROGRAMS = ("agent.py", "decide.py", "act.py")
UNIT_DIR = "/etc/systemd/system"
UNIT_PATHS = tuple(f"{UNIT_DIR}/{name}" for name in (f"{SERVICE}.service", f"{SERVICE}.timer", f"{ACT}.service",
                                                      f"{ACT}.path"))
HERE = Path(__file__).resolve().parent


def programs() -> dict[str, bytes]:
    """Host path -> content of the watch's programs (stdlib only)."""
    return {f"{PROGRAM_DIR}/{name}": (HERE / name).read_bytes() for name in PROGRAMS}


def sha256(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def targets(data: dict, layout) -> list[dict]:
    """What the watch measures: the server, or each replica on its own port (the gateway is
    what users reach; a replica is judged alone, so one sick replica is told from the others)."""
    plan = replicas.plan(data)
    if plan is None:
        host = data["server"]["host"]
        host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        return [{"name": "server", "index": None, "unit": f"{layout.service}.service",
                 "url": f"http://{host}:{data['server']['port']}", "gpus": list(range(data["server"]["tp_size"]))}]
    return [{"name": f"replica-{r.index}", "index": r.index, "unit": f"{layout.instance(r.index)}.service",
             "url": r.url.rstrip("/"), "gpus": list(r.gpus)} for r in plan.replicas]


def gateway_url(data: dict) -> str | None:
    plan = replicas.plan(data)
    if plan is None:
        return None
    host = "127.0.0.1" if plan.gateway.host in ("0.0.0.0", "::") else plan.gateway.host
    return f"http://{host}:{plan.gateway.port}"


def baseline(gate_report: dict | None) -> dict | None:
    """The release's own gate figures at its one-client level: median TTFT and TPOT (ms), and the
    requests they rest on (`requests` of the level's `num_prompts`: fewer when it passed early).
    None: no report, or no level at concurrency 1 (the probe's speed then stays inconclusive)."""
    doc = gate_report or {}
    for level in (doc.get("result") or doc).get("levels") or []:
        if level.get("concurrency") == 1:
            tpot, ttft = (level.get("tpot_ms") or {}).get("median"), (level.get("ttft_ms") or {}).get("median")
            if tpot:
                return {"tpot_ms": float(tpot), "ttft_ms": float(ttft) if ttft else None,
                        "requests": level.get("completed"), "num_prompts": level.get("num_prompts")}
    return None


def config(data: dict, layout, *, profile: str, release: int, gpus: list[dict], gate_report: dict | None) -> str:
    """watch.json. GPUS: each GPU the release uses as the deploy found it ({index, uuid, pcie: [gen,
    width]}): the link the preflight saw is what "lower" is measured against."""
    cfg = decide.settings(data.get("watch"))
    doc = {"release": release, "profile": profile, "settings": cfg,
           "targets": targets(data, layout), "gateway": gateway_url(data), "gpus": gpus,
           "gateway_unit": f"{layout.gateway_service}.service" if replicas.plan(data) else None,
           "baseline": baseline(gate_report), "lock": LOCK, "paused_file": PAUSED, "state_dir": STATE_DIR,
           "requests_dir": REQUESTS, "releases_dir": RELEASES, "textfile_dir": cfg["textfile_dir"],
           "restart_timeout_s": data["service"]["health_timeout_s"],
           "api_key_file": layout.api_key_file if data["server"].get("api_key") else None,
           "control_key_file": (layout.gateway_control_key_file
                                if data["server"].get("api_key") and replicas.plan(data) else None)}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


SANDBOX = """NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictNamespaces=yes
LockPersonality=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
SystemCallArchitectures=native
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
IPAddressDeny=any
IPAddressAllow=localhost
"""


def units(data: dict, layout) -> dict[str, str]:
    """Unit path -> text: the timer, the agent's oneshot, the act oneshot and its path unit."""
    cfg = decide.settings(data.get("watch"))
    interval = cfg["interval_s"]
    key = (f"LoadCredential=api_key:{layout.api_key_file}\n" if data["server"].get("api_key") else "")
    probe = cfg["probe"]
    budget = 60 + len(targets(data, layout)) * (10 * 3 + probe["requests"] * probe["timeout_s"])
    agent = f"""# Rendered by dsv4deploy: the watch (docs/watch.md). Do not edit: the next deploy rewrites it.
[Unit]
Description=dsv4deploy watch: one interval of the live release (health, probe, metrics, GPUs)
After=network.target

[Service]
Type=oneshot
User={USER}
Group={USER}
SupplementaryGroups=systemd-journal
ExecStart=/usr/bin/{HOST_PYTHON} {PROGRAM_DIR}/agent.py {CONFIG}
{key}StateDirectory={SERVICE} {SERVICE}/requests
# others may pass through (node_exporter's account reads the metrics by the link), not list
StateDirectoryMode=0751
TimeoutStartSec={budget}
UMask=0022
{SANDBOX}PrivateDevices=no
DevicePolicy=closed
DeviceAllow=char-nvidiactl rw
DeviceAllow=char-nvidia rw
MemoryDenyWriteExecute=yes
RemoveIPC=yes
CapabilityBoundingSet=
AmbientCapabilities=
SystemCallFilter=@system-service
SystemCallFilter=~@privileged @resources
KeyringMode=private
"""
    timer = f"""# Rendered by dsv4deploy: the watch's timer. Do not edit: the next deploy rewrites it.
[Unit]
Description=dsv4deploy watch every {interval} s

[Timer]
OnActiveSec={interval}
OnUnitActiveSec={interval}
AccuracySec=1s

[Install]
WantedBy=timers.target
"""
    act = f"""# Rendered by dsv4deploy: the watch's actions, as root under the deploy lock. Do not edit.
[Unit]
Description=dsv4deploy watch: carry out what the watch decided (restart, gateway, record)

[Service]
Type=oneshot
ExecStart=/usr/bin/{HOST_PYTHON} {PROGRAM_DIR}/act.py {CONFIG}
TimeoutStartSec={data['service']['health_timeout_s'] + 120}
{SANDBOX}ReadWritePaths={STATE} {STATE_DIR}
"""
    path = f"""# Rendered by dsv4deploy: starts {ACT}.service when the watch leaves a request. Do not edit.
[Unit]
Description=dsv4deploy watch: an action request is waiting

[Path]
DirectoryNotEmpty={REQUESTS}
Unit={ACT}.service

[Install]
WantedBy=paths.target
"""
    return dict(zip(UNIT_PATHS, (agent, timer, act, path)))
