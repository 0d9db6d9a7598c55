"""The host's packages, the service user, the gate client's user, and the directories every
release uses."""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import apt, files, server

from ..layout import ETC, GATE_USER, MODELS, OPT, STATE
from ..rollout import Rollout


# What the deploy runs on the host beyond a fresh server install (systemd, sshd, python3, sudo,
# iproute2, procps): the venv (python3-venv: not in a default Ubuntu server), health and identity
# checks (curl), patches (patch), pip over TLS (ca-certificates). Same names on Debian and Ubuntu.
HOST_PACKAGES = ["python3-venv", "curl", "patch", "ca-certificates"]


@deploy("Host packages")
def host_packages(r: Rollout) -> None:
    apt.packages(name=f"packages the deploy uses ({', '.join(HOST_PACKAGES)})", packages=HOST_PACKAGES,
                 update=True, cache_time=24 * 3600)


@deploy("Service user and directories")
def service_user(r: Rollout) -> None:
    user = r.data["service"]["user"]
    server.group(name=f"group {user}", group=user, system=True)
    server.user(name=f"user {user} (no login)", user=user, group=user, system=True,
                shell="/usr/sbin/nologin", home=r.layout.state_dir, create_home=False)
    server.group(name=f"group {GATE_USER}", group=GATE_USER, system=True)
    server.user(name=f"user {GATE_USER} (runs the gate's load client)", user=GATE_USER, group=GATE_USER,
                system=True, shell="/usr/sbin/nologin", home="/nonexistent", create_home=False)
    for path, owner, mode in ((OPT, "root", "755"), (f"{OPT}/venvs", "root", "755"),
                              (ETC, "root", "755"), (r.layout.config_dir, "root", "755"),
                              (STATE, "root", "755"), (r.layout.releases_dir, "root", "755"),
                              (r.layout.state_dir, user, "750"), (MODELS, "root", "755")):
        files.directory(name=f"dir {path}", path=path, user=owner, group=owner if owner == "root" else user,
                        mode=mode)
